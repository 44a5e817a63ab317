"""The proposer contract: how a drafting method proposes tokens, and nothing else.

A speculative method is a `Proposer` run by the one engine (`speculative.SpeculativeEngine`),
which owns everything else: the request and its checks, the target's prefill and caches, the
verifier (`verify_chain` / `verify_tree`), the host loop, the compiled programs (one
`ProgramCache`, keyed by the proposer's `key`, sampling, shapes and `Lowering`), the statistics
and `SpeculativeEngine.lower`. Letters: B rows, n drafts or tree nodes, S cache slots.

A proposer supplies `key()` (the static identity of its programs), a chain of `gamma` drafts or a
tree within `bounds`, `drafted_per_step` / `extra_slots`, `params`, `caches()`,
`feature_layers`, and the traced `prefill` / `propose` / `commit`. Everything else is a
capability the engine checks for: `Gated`, `TreeGrower`, `HostDrafter`, `RowHandover`,
`HostPrograms`, `HostVerifier`, `SelfSizing`, `Resumable`, `Profiled`, `SharedCachePrefill`,
`Counted`. Exactness is the engine's;
a proposer that samples returns the law it sampled from (`Drafts.q`), deterministic drafts
(q None) are point masses. Each member and capability: docs/extending.md, 'The contract'.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vocabjax import sharding
from vocabjax.decoding.tree import TreeBounds, TreeParams
from vocabjax.lowering import Lowering
from vocabjax.sampling import SamplingParams


@struct.dataclass
class Drafts:
  """What one step proposes, per row: a chain (parent None) or a tree."""

  tokens: jax.Array  # [B, n] int32 target ids
  q: jax.Array | None = None  # chain, sampled drafts: [B, n, V] the law each was drawn from
  n_valid: jax.Array | None = None  # chain: [B] drafts that count (the rest is padding)
  parent: jax.Array | None = None  # tree: [B, n] 0 the root, j + 1 node j (own parent: padding)
  depth: jax.Array | None = None  # tree: [B, n] from 1
  bounds: TreeBounds | None = struct.field(pytree_node=False, default=None)  # tree: its bounds
  host_from: int | None = struct.field(pytree_node=False, default=None)  # tree nodes from this
  #   index on came from the host block (a hybrid's lookup trie); None: none did


@struct.dataclass
class Context:
  """What the engine hands a proposer in a step."""

  last: jax.Array  # [B] the newest committed token (a tree's root; not yet in the caches)
  lengths: jax.Array  # [B] the target cache's length: committed tokens except `last`
  host: tuple = ()  # the host hook's arrays for this step (`Proposer.host_block`)


@struct.dataclass
class Prefilled:
  """What the engine's prefill hands a proposer."""

  tokens: jax.Array  # [B, T] the right-padded prompts
  lengths: jax.Array  # [B] prompt lengths
  first: jax.Array  # [B] the target's first token
  hidden: jax.Array  # [B, D] the target's final hidden state that gave `first`
  features: jax.Array | None  # [B, T, F] the `feature_layers` outputs (None when not asked)
  caches: dict  # the proposer's empty caches (`Proposer.caches`), to fill
  filled: tuple = struct.field(pytree_node=False, default=())  # names of `caches` the engine
  #   has filled already (`SharedCachePrefill`)


@dataclasses.dataclass
class HostRun:
  """What the engine hands a host hook for one generate call (`Proposer.host_start`)."""

  sampling: SamplingParams
  key: jax.Array  # the hook's own key for this call (a stream the engine's steps never use)
  B: int  # rows
  S: int  # the target cache's slots
  dtype: Any  # the caches' dtype
  room: int  # slots a row needs past its prompt (new tokens + one step's extra slots)
  max_len: int | None  # the request's cache length, if it set one
  program: Callable  # program(name, shapes, build) -> compiled: the engine's ProgramCache,
  #   keyed by (name, the proposer's key, sampling, shapes, lowering); compile seconds counted
  compiled_s: float = 0.0  # seconds `program` spent compiling (the engine keeps them out of
  #   the decode time)
  continuous: bool = False  # continuous batching: `prompts` are all the call's, B rows decode
  #   them in turn (`host_swap` hands a row from one to the next; no host_begin / host_end)


class Proposer(abc.ABC):
  """A drafting method's core (module doc): its sizes and `params`, `key`, `prefill`, `propose`
  and `commit`. What else it can do is a capability below, which the engine checks for with
  `isinstance`."""

  method: str = "proposer"
  gamma: int | None = None  # a chain's drafts per step (None: a tree, see `bounds`)
  bounds: TreeBounds | None = None  # a tree's most children per node and depth
  drafted_per_step: int = 0
  extra_slots: int = 0
  params: Any = None  # the proposer's weights (a pytree; {} when it has none)
  feature_layers: tuple[int, ...] | None = None
  draft_block_calls: bool = False  # whether its model's calls feed T > 1 tokens (layout)

  @property
  def verify_tokens(self) -> int:
    """Target positions one step verifies per row."""
    return self.drafted_per_step + 1

  @abc.abstractmethod
  def key(self) -> Hashable:
    """What makes this proposer's programs differ from another's (configs, sizes, policy)."""

  def caches(self) -> dict:
    """{name: LlamaLikeConfig} of the KV caches it keeps (each [B, S] like the target's)."""
    return {}

  def prepare(self, *, layout: str, lowering, mesh=None) -> None:
    """Store its weights in the MLP `layout` its programs run best with ("out_in"/"in_out"),
    attach what its programs read (a vocabulary policy's arrays); `mesh`: where it will run."""
    del layout, lowering, mesh

  def prefill_lowering(self, target: Lowering, base: Lowering) -> Lowering:
    """What its params lower with in the engine's prefill program (`target`: the target's
    prefill lowering, `base`: the engine's). Default: as the target's prefill."""
    del base
    return target

  def place(self, mesh, target_config) -> None:
    """Put its params on `mesh` (default: every array replicated)."""
    self.params = sharding.replicate(self.params, mesh)

  @abc.abstractmethod
  def prefill(self, params, target_params, pre: Prefilled):
    """Its loop state after the prompt (traced in the engine's prefill program)."""

  @abc.abstractmethod
  def propose(self, params, state, ctx: Context, key, *, sampling: SamplingParams,
              keep=None) -> tuple[Drafts, Any]:
    """This step's drafts and its state (traced). `keep`: `Gated.gate`'s rows (others
    undrafted)."""

  @abc.abstractmethod
  def commit(self, params, state, ctx: Context, drafts: Drafts, verdict):
    """Its state for the next step, from the verdict (`verify.ChainVerdict` for a chain,
    `tree.Verified` for a tree: accepted, next, path, features, hidden)."""


# --- capabilities ---------------------------------------------------------------------------

class Gated(Proposer):
  """Rows may go undrafted: `gate` says which draft this step; where none does, the engine
  verifies `fallback`'s drafts instead of calling `propose` (EAGLE's confidence gate)."""

  gated: bool = True  # an instance may switch its gate off (then `gate` returns None)

  def gate(self, params, state, ctx: Context):
    """(which rows draft [B] bool, or None: all; its state)."""
    return None, state

  def fallback(self, params, state, ctx: Context) -> tuple[Drafts, Any]:
    """The drafts of a step where `gate` let no row draft (default: none, the roots alone)."""
    raise NotImplementedError


class TreeGrower(Gated):
  """A proposer that grows a tree on the device, which a hybrid can merge a host tree into:
  `gate` gives (rows that draft, what `grow` reads), `grow` the tree and its state for
  `commit`, `skip` that state where it grew nothing. Its loop state keeps `pend_width` pending
  entries; `pending(w)` is a copy of it keeping w (a merged tree accepts up to its depth)."""

  tree: TreeParams
  pend_width: int

  @abc.abstractmethod
  def grow(self, params, pre, keep):
    """(tokens, parent, depth [B, n] of its tree, its state for `commit`); rows not in `keep`
    made padding."""

  @abc.abstractmethod
  def skip(self, pre):
    """Its state for `commit` when it grew no tree."""

  def pending(self, width: int) -> "TreeGrower":
    """This proposer with a pending block of `width` entries (its params shared)."""
    if width == self.pend_width:
      return self
    out = copy.copy(self)
    out.pend_width = width
    return out


class HostDrafter(Proposer):
  """Drafts (or part of them) made on the host before each step from the rows' committed
  tokens (a lookup trie, SuffixDecoding's tree, a drafter with another tokenizer): `host_block`
  gives the host arrays the step reads; a step program is compiled per block shape met."""

  host_sizable: bool = True  # its blocks may be cut to a width (`self_sizing`)

  @abc.abstractmethod
  def host_block(self, history: Sequence[np.ndarray], active: np.ndarray) -> tuple:
    """(host arrays for this step's program, per-row counts for the stats): `history[b]` is
    row b's committed tokens (prompt, output)."""

  def host_shapes(self, B: int = 1, sampling: SamplingParams | None = None) -> Sequence[tuple]:
    """Every host block's array shapes a run of B rows (with `sampling`, for a proposer whose
    blocks depend on it) may meet, smallest first: a step program is compiled per shapes when
    first met. An entry is a shape (int32) or a `jax.ShapeDtypeStruct` (another dtype)."""
    del B, sampling
    return [()]

  def host_start(self, prompts: Sequence[Sequence[int]], run: HostRun) -> None:
    """A `generate` call is about to start (before its clock): compile what its own host-side
    programs need (`run.program`)."""
    del prompts, run

  def host_begin(self, history: Sequence[np.ndarray]) -> None:
    """A `generate` call starts: `history[b]` is row b's prompt and first token. Timed as the
    prefill (a drafter's own prefill runs here)."""
    del history

  def host_end(self, history: Sequence[np.ndarray]) -> None:
    """The `generate` call ended: every row's committed tokens, the last step's included."""
    del history


class RowHandover(HostDrafter):
  """Continuous batching for a host drafter (`SpeculativeEngine.generate_continuous`): a row's
  host state handed from one prompt to the next in `host_swap` (in place of `host_begin` /
  `host_end`). A device proposer's state is per row and needs nothing of this; a host drafter
  without it is refused continuous batching."""

  def host_swap(self, b: int, ended: np.ndarray | None, started: np.ndarray | None) -> None:
    """Row b's prompt is done (`ended`: its committed tokens, the last step's included) and/or
    the row takes another (`started`: its prompt and first token). None: no prompt ended / the
    row idles. Default: nothing (a drafter keeping no row state)."""
    del b, ended, started


class HostPrograms(HostDrafter):
  """A host drafter running compiled programs of its own (a drafter with another tokenizer),
  built through the engine's program cache (`HostRun.program`)."""

  host_step_programs: tuple = ()  # its programs a step runs before the engine's step
  host_prefill_programs: tuple = ()  # and after the engine's prefill (`lower_host`)

  def lower_host(self, name: str, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    """Its program `name` (of `host_step_programs` / `host_prefill_programs`) LOWERED for a
    [B, T] prompt block and S cache slots: what `SpeculativeEngine.lower` returns for it."""
    raise NotImplementedError(f"{type(self).__name__} has no host program {name!r}")

  def host_caches(self) -> dict:
    """{name: LlamaLikeConfig} of the KV caches it keeps on the device: counted with the
    step's caches (bench's memory fit)."""
    return {}


class HostVerifier(Proposer):
  """Steps verified on the host: the step returns the target's probabilities of [last,
  drafts] and `host_verify` decides (the cross-vocabulary exact rule's walk down its n-gram
  trie); the engine commits what it accepted."""

  def verifies_on_host(self, sampling: SamplingParams) -> bool:
    """Whether steps with `sampling` are verified by `host_verify`."""
    del sampling
    return True

  @abc.abstractmethod
  def host_verify(self, probs: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(accepted [B], next token [B]) from the target's processed probabilities of [last,
    drafts] [B, n + 1, V]; `sampling.NONFINITE` as a row's next token where the probabilities
    it reached were not finite."""


class SelfSizing(Proposer):
  """A device drafter whose draft length is chosen per step (`vocabjax.decoding.sizing`): one
  step program per length, the same loop state."""

  @abc.abstractmethod
  def sized_lengths(self) -> tuple[int, ...]:
    """Draft lengths a step may be sized to (`sized`)."""

  @abc.abstractmethod
  def sized(self, n: int) -> "Proposer":
    """This proposer drafting n (of `sized_lengths`) tokens a step, with the same params,
    caches and loop state."""

  def sized_reach(self, n: int) -> int:
    """The drafts in a row a proposal sized to n reaches (a chain: n; a tree: its depth)."""
    return n


class Resumable(SelfSizing):
  """A sized device drafter whose plain steps the engine hands to the plain decoder's own step
  program (`autoregressive.Decoder.step_program`: the target alone, the drafter idle), which
  then reads what it missed in one call (`resume`) before its next drafting step."""

  unseen_max: int = 1  # committed tokens before `last` its loop state may leave unread

  @abc.abstractmethod
  def resume(self, params, state, ctx: Context, block):
    """Its state after plain steps it did not see (traced): `block` [B, W] holds each row's
    committed tokens at positions `ctx.lengths - W .. ctx.lengths - 1` (W >= the tokens before
    `last` it has not read); the state reads them and leaves only `last` unread."""


class Profiled(Proposer):
  """A drafter with a model whose calls `vocabjax.decoding.profile.step_split` times apart."""

  head_rows: int = 0  # LM-head rows its drafter multiplies per call
  head_policy: Any = None  # the drafting head the time split times (a policy function)

  @abc.abstractmethod
  def drafter_calls(self) -> list[tuple[int, int]]:
    """(tokens fed, LM-head rows) per row of each drafter call in one step."""

  @abc.abstractmethod
  def drafter_body(self):
    """(fn(params, tokens, positions, cache) -> hidden, params, cache config): the drafter's
    forward without its LM head."""

  @abc.abstractmethod
  def draft_width(self) -> int:
    """The hidden width its LM head reads."""


class CachePrefill(NamedTuple):
  """A proposer's cache filled by a model's prompt prefill that proposers over the same model
  share (`SharedCachePrefill.cache_prefill`)."""

  cache: str  # which of its `caches()`
  key: Hashable  # what the program reads besides its params: the model's config, settings
  model_params: Callable  # model_params(proposer params) -> the params the prefill reads
  fn: Callable  # fn(model params, tokens [B, T], lengths [B], cache) -> the filled cache


class SharedCachePrefill(Proposer):
  """A proposer whose prefill fills one of its caches with a model's prompt prefill that other
  proposers over the same model (a chain and a tree of one drafter, each vocabulary policy of
  it) run too: the engine runs it as a program of its own, shared by every engine whose
  proposer has the same key and model params signature, before the proposer's `prefill`, which
  then finds that cache filled (`Prefilled.filled` names it)."""

  @abc.abstractmethod
  def cache_prefill(self) -> CachePrefill:
    """The cache, the key, the params and the function of the shared prefill."""


class Counted(Proposer):
  """Counts of its own per step and totals for an eval record, beyond drafted / accepted."""

  def step_count_names(self) -> tuple[str, ...]:
    """Names of the [B] counts `step_counts` returns (the step's outputs after `accepted`)."""
    return ()

  def step_counts(self, drafts: Drafts, verdict) -> tuple:
    """[B] counts the step returns for the stats (traced), one per `step_count_names`."""
    del drafts, verdict
    return ()

  def drafted_counts(self, active, counts: dict, host_counts, keep) -> list[int]:
    """Drafts proposed per row this step (`drafted_counts` below by default)."""
    del counts
    return drafted_counts(self, active, host_counts, keep)

  def record_step(self, stats, active, counts: dict, host_counts, keep) -> None:
    """Add this step's own counts to `stats` (`SpecStats.add`); default: none."""
    del stats, active, counts, host_counts, keep

  def record(self, stats) -> dict:
    """Method-specific totals of a finished run's `SpecStats` for an eval record."""
    del stats
    return {}


def drafted_counts(proposer: Proposer, active, host_counts, keep) -> list[int]:
  """Drafts proposed per row in a step (host values; 0 for inactive rows): what `host_block`
  said, else `drafted_per_step` for the rows that drafted (`keep`: a gate's rows)."""
  if host_counts is not None:
    return [int(x) if a else 0 for x, a in zip(host_counts, active)]
  if keep is not None:
    return [proposer.drafted_per_step if a and k else 0 for a, k in zip(active, keep)]
  return [proposer.drafted_per_step if a else 0 for a in active]


def is_gated(proposer: Proposer) -> bool:
  """Whether the proposer's gate may leave rows undrafted (the step then returns which)."""
  return isinstance(proposer, Gated) and proposer.gated


def step_count_names(proposer: Proposer) -> tuple[str, ...]:
  """The names of the proposer's own per-step counts (`Counted`), () for one without."""
  return proposer.step_count_names() if isinstance(proposer, Counted) else ()


def verifies_on_host(proposer: Proposer, sampling: SamplingParams) -> bool:
  return isinstance(proposer, HostVerifier) and proposer.verifies_on_host(sampling)


def continuous_capable(proposer: Proposer) -> bool:
  """Whether continuous batching may hand its rows between prompts: a device proposer's state
  is per row (the engine replaces it); a host drafter must say how (`RowHandover`)."""
  return not isinstance(proposer, HostDrafter) or isinstance(proposer, RowHandover)


def padding_block(B: int, m: int, dtype=np.int32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A host tree block of B rows of m padding nodes, (tokens, parent, depth) [B, m], for rows
  to write their real nodes over from the front: token 0, node j its own parent's index
  (parent j + 1: the root is 0, node j is j + 1) at depth 1, so that a padding node is never
  a child of anything and never reached."""
  parent = np.broadcast_to(np.arange(1, m + 1, dtype=dtype), (B, m)).copy()
  return np.zeros((B, m), dtype), parent, np.ones((B, m), dtype)


def static_tree(parent: np.ndarray, depth: np.ndarray, B: int):
  """A static tree's parent and depth [n] broadcast to B rows (jnp)."""
  n = len(parent)
  return (jnp.broadcast_to(jnp.asarray(parent, jnp.int32), (B, n)),
          jnp.broadcast_to(jnp.asarray(depth, jnp.int32), (B, n)))
