"""The speculative engine: one request path, one prefill, one step, one program cache, for
every proposer (`vocabjax.decoding.proposer`).

Letters: B batch, n drafts (a chain) or tree nodes, T prompt block, S cache slots, V vocabulary.

    engine = SpeculativeEngine(target_params, target_config,
                               ChainProposer(draft_params, draft_config, target_config, gamma=4))
    res = engine.generate(prompts, max_new_tokens=128)

or by name: `vocabjax.methods.METHODS[name].make(target, draft, params)`. One step, compiled once
per (proposer, sampling, shapes, lowering): the proposer proposes (a chain with its law, or a
tree), the target scores [last, drafts] in one forward, verification keeps a prefix or path and
emits one more token (`verify_chain` / `verify_tree`, lossless), the target cache is rolled back
or compacted, and the proposer commits. A gated proposer may skip drafting (its `fallback` is
verified), a host hook gives each step host arrays (one step program per block shape) and may
run programs of its own (`HostRun`), and a `HostVerifier` verifies on the host (`commit_host`).
`draft_vocab` swaps a model drafter's vocabulary policy (VocabTrim / FR-Spec subset, SpecVocab
ranker); drafts and q stay over the target's ids. docs/extending.md.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vocabjax import sharding
from vocabjax.decoding.autoregressive import (Decoder, abstract_cache, lower_target_prefill,
                                             prefill_in_bf16, target_prefill,
                                             target_prefill_outputs, target_prefill_program)
from vocabjax.decoding.base import DecodingMethod, GenerationResult
from vocabjax.decoding.drafter import block_layout
from vocabjax.decoding.engine import (KEY, DecoderPrograms, ProgramKey, abstract_arg, arg_signature,
                                      cache_slots, check_continuous_mesh, continuous_loop,
                                      fold_in, host_loop, placed_like, prompt_bucket, request,
                                      token_ids)
from vocabjax.decoding.proposer import (Context, Counted, Drafts, Gated, HostDrafter,
                                       HostPrograms, HostRun, Prefilled, Profiled, Proposer,
                                       Resumable, SelfSizing, SharedCachePrefill,
                                       continuous_capable, drafted_counts,
                                       is_gated, step_count_names, verifies_on_host)
from vocabjax.decoding.sizing import DraftSizer, limit_block, parse_table, table_length
from vocabjax.decoding.tree import verify_tree
from vocabjax.decoding.verify import verify_chain
from vocabjax.lowering import decoding_lowering, lowered, step_lowering, with_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import (compute_dtype, forward, lm_head,
                                       with_mlp_layout)
from vocabjax.sampling import SamplingParams, probs
from vocabjax.vocab.policy import policy_state, row_vocab_of, with_rows

HOST_STREAM = 2**32 - 1  # fold_in(request key, this): a host hook's draws (steps use 0, 1, ..)


@struct.dataclass
class EngineState:
  """The loop state of every speculative method; fixed shapes, one row per sequence."""

  target_cache: KVCache  # every committed token except `last`
  last: jax.Array  # [B] int32 the newest committed token (the next step's root)
  draft: Any  # the proposer's state
  vocab: Any = None  # a row-state vocabulary policy's per-request arrays (`RowVocab`), or None


@dataclasses.dataclass
class SpecStats:
  """Per-step, per-row counts of a speculative run (rows count only while active): the one
  stats record of every proposer. `counts` holds a proposer's own per-step counts by name
  (prompt lookup's nodes, a gated head's rows), also read as attributes (`stats.head`)."""

  drafted: list[list[int]]  # [steps][B] drafts proposed (0 once a row finished, or undrafted)
  accepted: list[list[int]]  # [steps][B] drafts accepted
  active: list[list[bool]] = dataclasses.field(default_factory=list)  # [steps][B]
  counts: dict = dataclasses.field(default_factory=dict)  # name -> [steps][B]
  proposer: Any = dataclasses.field(default=None, repr=False)

  def __getattr__(self, name):
    counts = self.__dict__.get("counts") or {}
    if name in counts:
      return counts[name]
    raise AttributeError(name)

  @property
  def target_forwards(self) -> int:
    """Verifications after the prefill (one per step, with or without drafts)."""
    return len(self.drafted)

  @property
  def tau(self) -> float:
    """Mean tokens emitted per verification (accepted + 1), over active rows and steps."""
    steps = (self.num_steps if self.active
             else sum(1 for row in self.drafted for d in row if d))
    acc = sum(a for row in self.accepted for a in row)
    return (acc + steps) / steps if steps else float("nan")

  @property
  def acceptance_rate(self) -> float:
    drafted = sum(d for row in self.drafted for d in row)
    acc = sum(a for row in self.accepted for a in row)
    return acc / drafted if drafted else float("nan")

  def add(self, name: str, row: list) -> None:
    """One step's per-row values of the count `name`."""
    self.counts.setdefault(name, []).append(row)

  sizing: dict | None = None  # the self-sizing rule, its inputs and choices (`sizing`)
  prompt_rows: list[list[int]] = dataclasses.field(default_factory=list)  # continuous
  #   batching: [steps][rows] the prompt each row decoded at that step (-1: idle); else empty
  num_prompts: int = 0  # continuous batching: the prompts its rows decoded
  host_s: float = 0.0  # seconds in the proposer's host hook (a lookup, the suffix trees)
  seconds: dict = dataclasses.field(default_factory=dict)  # a proposer's own timings by name
  step_s: float = 0.0  # seconds in the engine's compiled steps (first compiles left out)

  @property
  def num_steps(self) -> int:
    """Row-steps verified (a row's step counts while the row is active)."""
    return sum(1 for row in self.active for a in row if a)

  def time(self, name: str, seconds: float) -> None:
    """Add `seconds` to the proposer's timing `name` (`seconds`)."""
    self.seconds[name] = self.seconds.get(name, 0.0) + seconds

  def per_prompt(self, name: str = "accepted") -> list[int]:
    """A continuous batching run's per-row counts `name` ("accepted", "drafted", "steps": the
    verifications a prompt took, or a proposer's count) summed per prompt, in prompt order."""
    if not self.num_prompts:
      raise ValueError("per_prompt: not a continuous batching run (its rows are its prompts)")
    n = self.num_prompts
    rows = self.active if name == "steps" else {"accepted": self.accepted,
                                                 "drafted": self.drafted}.get(name)
    rows = self.counts[name] if rows is None else rows
    out = [0] * n
    for step, prompts in zip(rows, self.prompt_rows):
      for value, i in zip(step, prompts):
        if i >= 0:
          out[i] += int(value)
    return out

  def spread(self, lo: int, total: int) -> "SpecStats":
    """These per-row counts laid out as rows lo .. lo + B - 1 of `total` (a batch of a larger
    request: `generate(batch_size=...)`), other rows 0 / inactive."""
    def widen(rows, fill):
      return [[fill] * lo + list(r) + [fill] * (total - lo - len(r)) for r in rows]
    return dataclasses.replace(
        self, drafted=widen(self.drafted, 0), accepted=widen(self.accepted, 0),
        active=widen(self.active, False),
        counts={k: widen(v, 0) for k, v in self.counts.items()})

  def extend(self, other: "SpecStats") -> None:
    """Append another run's steps (laid out over the same rows: `spread`) and times."""
    self.drafted += other.drafted
    self.accepted += other.accepted
    self.active += other.active
    for k, v in other.counts.items():
      self.counts.setdefault(k, []).extend(v)
    for k, v in other.seconds.items():
      self.time(k, v)
    self.host_s += other.host_s
    self.step_s += other.step_s

  def record(self) -> dict:
    """Method-specific totals for an eval record (the proposer's `record`, and the self-sizing
    rule's where it ran)."""
    P = self.proposer
    out = P.record(self) if isinstance(P, Counted) else {}
    if isinstance(P, HostDrafter):
      out["host_s"] = round(self.host_s, 4)  # on the critical path: before each step
    out.update({k: round(v, 4) for k, v in self.seconds.items()})
    return {**out, "sizing": self.sizing} if self.sizing else out


def proposer_prefill(target_params, draft_params, tokens, prompt_lengths, first, last, feats,
                     target_cache, caches, *, proposer: Proposer,
                     filled: tuple = ()) -> "EngineState":
  """The engine's loop state from the target's prefill (`autoregressive.target_prefill`: its
  first token [B], the last prompt position's hidden state [B, D], the features of the
  proposer's `feature_layers`, the filled cache) and the proposer's state from the prompt
  (`filled`: its caches the engine has filled already, `SharedCachePrefill`)."""
  state = proposer.prefill(draft_params, target_params,
                           Prefilled(tokens=tokens, lengths=prompt_lengths, first=first,
                                     hidden=last, features=feats, caches=caches,
                                     filled=tuple(filled)))
  rv = row_vocab_of(proposer)
  vocab = (None if rv is None else
           rv.init_rows(policy_state(draft_params), tokens, prompt_lengths, first))
  return EngineState(target_cache=target_cache, last=first, draft=state, vocab=vocab)


def engine_prefill(target_params, draft_params, tokens, prompt_lengths, target_cache, caches,
                   key, *, target_config: LlamaLikeConfig, sampling: SamplingParams,
                   proposer: Proposer):
  """The target's prefill (with the features the proposer reads), its first token, and the
  proposer's state from the prompt: (first [B], EngineState). The engine runs it as two
  programs, the target's (shared with plain decoding and every engine over the same target)
  and the proposer's (`proposer_prefill`)."""
  first, tcache, last, feats = target_prefill(target_params, tokens, prompt_lengths,
                                              target_cache, key, config=target_config,
                                              sampling=sampling,
                                              feature_layers=tuple(proposer.feature_layers or ()))
  return first, proposer_prefill(target_params, draft_params, tokens, prompt_lengths, first,
                                 last, feats, tcache, caches, proposer=proposer)


def verify(target_params, state: EngineState, drafts: Drafts, key, *,
           target_config: LlamaLikeConfig, sampling: SamplingParams, feature_layers=None):
  """The verifier a proposal calls for: `verify_chain` for a chain (parent None), else
  `verify_tree`, each with the target's features of `feature_layers` (a tree's on its path)."""
  if drafts.parent is None:
    return verify_chain(target_params, state.last, drafts.tokens, state.target_cache, key,
                        target_config=target_config, sampling=sampling, q=drafts.q,
                        n_valid=drafts.n_valid, feature_layers=feature_layers)
  return verify_tree(target_params, state.last, drafts.tokens, drafts.parent, drafts.depth,
                     state.target_cache, key, target_config=target_config, tree=drafts.bounds,
                     sampling=sampling, feature_layers=feature_layers)


def engine_step(target_params, draft_params, state: EngineState, key, *host,
                target_config: LlamaLikeConfig, sampling: SamplingParams, proposer: Proposer):
  """Propose, verify, commit. Returns (state, emitted [B, W] with -1 after each row's tokens,
  accepted [B], *the proposer's counts [B], and, when gated, which rows drafted [B])."""
  ctx = Context(last=state.last, lengths=state.target_cache.lengths, host=tuple(host))
  k_draft, k_verify = jax.random.split(key)
  rv = row_vocab_of(proposer)
  if rv is not None:  # the policy reads this step's per-request vocabulary from the params
    draft_params = with_rows(draft_params, state.vocab)
  keep, pre = (proposer.gate(draft_params, state.draft, ctx) if isinstance(proposer, Gated)
               else (None, state.draft))

  def run(proposal):
    drafts, dstate = proposal()
    v = verify(target_params, state, drafts, k_verify, target_config=target_config,
               sampling=sampling, feature_layers=proposer.feature_layers)
    dstate = proposer.commit(draft_params, dstate, ctx, drafts, v)
    counts = proposer.step_counts(drafts, v) if isinstance(proposer, Counted) else ()
    vocab = (None if rv is None else
             rv.observe(policy_state(draft_params), state.vocab, v.emitted))
    return (EngineState(target_cache=v.target_cache, last=v.next.astype(jnp.int32),
                        draft=dstate, vocab=vocab), v.emitted, v.accepted, tuple(counts))

  def drafted():
    return run(lambda: proposer.propose(draft_params, pre, ctx, k_draft, sampling=sampling,
                                        keep=keep))

  if keep is None:
    new, emitted, n, counts = drafted()
    return (new, emitted, n, *counts)
  # XLA runs the taken branch only: where no row drafts, the step costs about a plain one
  new, emitted, n, counts = jax.lax.cond(
      jnp.any(keep), drafted, lambda: run(lambda: proposer.fallback(draft_params, pre, ctx)))
  return (new, emitted, n, *counts, keep)


def engine_probs_step(target_params, draft_params, state: EngineState, key, *host,
                      target_config: LlamaLikeConfig, sampling: SamplingParams,
                      proposer: Proposer):
  """The step of a proposer that verifies on the host (`HostVerifier`): its chain
  proposed, the target's processed probabilities of [last, drafts] [B, n + 1, V]; the target
  cache holds them past its lengths, which the engine sets once the host has verified
  (`commit_host`). Returns (state, probabilities)."""
  ctx = Context(last=state.last, lengths=state.target_cache.lengths, host=tuple(host))
  drafts, dstate = proposer.propose(draft_params, state.draft, ctx, jax.random.split(key)[0],
                                    sampling=sampling)
  N = state.target_cache.lengths
  tokens = jnp.concatenate([state.last[:, None], drafts.tokens], axis=1)
  h, cache = forward(target_params, tokens, N[:, None] + jnp.arange(tokens.shape[1])[None],
                     state.target_cache, config=target_config)
  p = probs(lm_head(target_params, h, config=target_config), sampling)
  return state.replace(target_cache=cache.with_lengths(N), draft=dstate), p


def commit_host(state: EngineState, accepted, nxt) -> EngineState:
  """A host verification's verdict into the loop state: `accepted` [B] drafts and the last
  token kept in the target cache, `nxt` [B] the next step's root."""
  tc = state.target_cache
  return state.replace(target_cache=tc.with_lengths(tc.lengths + 1 + accepted),
                       last=nxt.astype(jnp.int32))


class SpeculativeEngine(DecodingMethod):
  """One target and one proposer: requests, prefill, steps, programs and statistics (module
  doc). `layout`: the MLP weight layout ("auto": `block_layout` for the target, and for the
  proposer's model where its calls feed blocks). `mesh`: a ("data", "model") mesh
  (`vocabjax.sharding`): the target and the proposer's params are placed on it
  (tensor-parallel heads / MLP, vocabulary-split LM heads; a trimmed head's rows split as the
  full head's and an EAGLE head's layer as the target's layers, a ranker and a head's other
  weights replicated), the caches and the loop state row over "data", and every program runs
  partitioned (module doc of `vocabjax.sharding`)."""

  def __init__(self, target_params, target_config: LlamaLikeConfig, proposer: Proposer, *,
               layout: str = "auto", mesh=None, self_sizing: bool = False,
               sizing_table=None):
    """`self_sizing`: each step's draft length chosen from the measured step costs and the
    running acceptance (`vocabjax.decoding.sizing`), for a proposer that drafts on the host
    (its block cut to the length) or one that sizes its drafts (`Proposer.sized`: a chain or
    tree drafter, one step program per length, 0 a plain step; a `Resumable` drafter's plain
    steps run the plain decoder's own step program). `sizing_table` ({batch size: length} or
    "1:4,8:0", `sizing.parse_table`; implies `self_sizing`): a call of B rows takes the entry
    of the largest batch size <= B for every step instead of the rule, 0 meaning the whole
    call is plain decoding (`autoregressive.Decoder`'s programs, no drafter); batch sizes
    below every entry keep the rule. `learned_table()` gives the table a run's rules favor."""
    if not isinstance(proposer, Proposer):
      raise TypeError(f"a SpeculativeEngine runs a Proposer, got {type(proposer).__name__}")
    self.sizing_table = None if sizing_table is None else parse_table(sizing_table)
    self_sizing = self_sizing or self.sizing_table is not None
    if self_sizing and not ((isinstance(proposer, HostDrafter) and proposer.host_sizable)
                            or isinstance(proposer, SelfSizing)):
      raise ValueError(f"self_sizing applies to proposers that draft on the host (pld, ngram, "
                       f"suffix) or size their drafts (chain, tree); {proposer.method} "
                       f"compiles its draft length into its step")
    self.self_sizing = self_sizing
    self._sizers: dict = {}  # (rows, cache slots) -> DraftSizer
    self._plain: Decoder | None = None  # the plain decoder of the target (`plain_decoder`)
    self._sized_proposers: dict = {}  # n -> the proposer drafting n a step (`_sized`)
    self.proposer, self.mesh = proposer, mesh
    self.method = proposer.method
    # what every program of this engine lowers with (`vocabjax.lowering`): on a mesh XLA's
    # dot is partitioned with the weights, while the CPU kernel is one device's custom call
    # (GSPMD would gather the weights to it), so sharded programs do without it; XLA's TopK is
    # not partitioned either, so top-k over vocabulary-split logits runs as rounds of argmax,
    # and a batch's cache writes as one update per row
    self.lowering = decoding_lowering(mesh=mesh)
    layout = mesh_layout(layout, mesh)
    if layout == "auto":  # the target only ever runs blocks (prefill, verification)
      t_layout = block_layout(self.lowering.platform, self.lowering.cpu_kernel)
      d_layout = t_layout if proposer.draft_block_calls else "out_in"
    else:
      t_layout = d_layout = layout
    self.target_params, self.target_config = with_mlp_layout(target_params, t_layout), target_config
    proposer.prepare(layout=d_layout, lowering=self.lowering, mesh=mesh)
    if mesh is not None:
      self.target_params = sharding.shard_params(self.target_params, self.target_config, mesh)
      proposer.place(mesh, target_config)
    # the engine's own programs are shared with the process's engines of the same models,
    # proposer and params signatures (`engine.ProgramCache`); a host hook's programs stay
    # this engine's
    self._programs = DecoderPrograms(
        scope=lambda: (type(self), type(self.proposer), self.target_config, self.mesh,
                       arg_signature(self.target_params), arg_signature(self.proposer_params)),
        shared=("prefill", "step", "put_row"))
    self._states: dict = {}  # `abstract_state`'s shapes by (sampling, B, T, S, dtype)
    # one call at a time: a host hook keeps a call's rows (the suffix trees' requests, the
    # cross-vocabulary drafter's cache), and the self-sizing rule its running figures
    self._lock = threading.Lock()

  # --- the proposer's, as the engine's callers read them ---------------------------------------
  @property
  def proposer_params(self):
    """The proposer's params (what every step program takes after the target's)."""
    return self.proposer.params

  @proposer_params.setter
  def proposer_params(self, value):
    self.proposer.params = value

  @property
  def extra_slots(self) -> int:
    return self.proposer.extra_slots

  @property
  def drafted_per_step(self) -> int:
    return self.proposer.drafted_per_step

  @property
  def verify_tokens(self) -> int:
    return self.proposer.verify_tokens

  @property
  def draft_policy(self):
    """The drafting head the time split times (`Profiled.head_policy`; None: no model)."""
    return self.proposer.head_policy if isinstance(self.proposer, Profiled) else None

  @property
  def draft_head_rows(self) -> int:
    """LM-head rows the drafter multiplies per call (K for a trimmed head, K + the ranker's
    cost in D-wide rows for a speculative vocabulary, else V)."""
    return self.proposer.head_rows if isinstance(self.proposer, Profiled) else 0

  @property
  def times_step_parts(self) -> bool:
    return self.drafter_body() is not None

  def drafter_calls(self) -> list[tuple[int, int]]:
    return self.proposer.drafter_calls() if isinstance(self.proposer, Profiled) else []

  def drafter_body(self):
    return self.proposer.drafter_body() if isinstance(self.proposer, Profiled) else None

  def cache_len(self, longest: int, max_new_tokens: int, max_len: int | None = None) -> int:
    """Cache slots `generate` uses: `max_len`, else the longest prompt + new tokens + one
    step's extra slots, rounded up to a bucket."""
    return cache_slots(longest, max_new_tokens + self.extra_slots, max_len)

  def run_record(self, result) -> dict:
    return result.stats.record() if result.stats is not None else {}

  # --- programs -------------------------------------------------------------------------------
  def _key(self, program: str, sampling: SamplingParams, *shapes, proposer=None) -> ProgramKey:
    return ProgramKey(program, (proposer or self.proposer).key(), sampling, shapes,
                      self.lowering)

  @property
  def step_programs(self) -> tuple:
    """The programs one decoding step runs, in order (`lower`'s names): the proposer's own
    host-side ones (a cross-vocabulary drafter's), then the engine's step."""
    P = self.proposer
    return (*(P.host_step_programs if isinstance(P, HostPrograms) else ()), "step")

  @property
  def prefill_programs(self) -> tuple:
    """And the prompt's: the target's prefill, the engine's (the proposer's state from it),
    then the proposer's own."""
    P = self.proposer
    return ("target_prefill", *(("cache_prefill",) if self._cache_prefill() else ()), "prefill",
            *(P.host_prefill_programs if isinstance(P, HostPrograms) else ()))

  def _placed(self, shape, dtype, B: int, rows: bool = True):
    """An abstract argument placed as the engine's inputs are (`engine.abstract_arg`)."""
    return abstract_arg(shape, dtype, B=B, mesh=self.mesh, like=self.target_params, rows=rows)

  def _abstract_cache(self, config: LlamaLikeConfig, B: int, S: int, dtype):
    """A [B, S] cache of `config`, abstract and placed as the engine's caches are."""
    c = abstract_cache(config, B, S, dtype, self.mesh)
    return c if self.mesh is not None else placed_like(c, self.target_params)

  def _abstract_caches(self, B: int, S: int, dtype):
    """(the target's cache, {name: the proposer's caches}), abstract and placed."""
    return (self._abstract_cache(self.target_config, B, S, dtype),
            {k: self._abstract_cache(c, B, S, dtype) for k, c in self.proposer.caches().items()})

  def abstract_caches(self, B: int, S: int, dtype) -> list:
    """Every KV cache a step holds (the target's first, its host hook's last), abstract and
    placed."""
    tcache, caches = self._abstract_caches(B, S, dtype)
    own = self.proposer.host_caches() if isinstance(self.proposer, HostPrograms) else {}
    host = [self._abstract_cache(c, B, S, dtype) for c in own.values()]
    return [tcache, *caches.values(), *host]

  def _new_caches(self, B: int, S: int, dtype):
    def cache(config):
      c = KVCache.init(config, B, S, dtype)
      return c if self.mesh is None else sharding.shard_cache(c, config, self.mesh)
    return cache(self.target_config), {k: cache(c) for k, c in self.proposer.caches().items()}

  def _prefill_fn(self, sampling: SamplingParams):
    """`engine_prefill` with the target's params lowered as plain decoding's prefill (the bf16
    GEMM for a bf16 target) and the proposer's as its prefill asks."""
    t_lw, d_lw = self._prefill_lowerings()
    fn = functools.partial(engine_prefill, target_config=self.target_config, sampling=sampling,
                           proposer=self.proposer)

    def prefill(tp, dp, *args):
      return fn(with_lowering(tp, t_lw), with_lowering(dp, d_lw) if isinstance(dp, dict)
                else dp, *args)
    prefill.__name__ = "speculative_prefill"  # one name: equal programs are equal texts
    return prefill

  def _proposer_prefill_fn(self):
    """`proposer_prefill` with the target's params lowered as its prefill and the proposer's as
    its prefill asks (as `_prefill_fn`)."""
    t_lw, d_lw = self._prefill_lowerings()
    shared = self._cache_prefill()
    fn = functools.partial(proposer_prefill, proposer=self.proposer,
                           filled=() if shared is None else (shared.cache,))

    def prefill(tp, dp, *args):
      return fn(with_lowering(tp, t_lw), with_lowering(dp, d_lw) if isinstance(dp, dict)
                else dp, *args)
    prefill.__name__ = "proposer_prefill"
    return prefill

  def _feature_layers(self) -> tuple:
    return tuple(self.proposer.feature_layers or ())

  def _cache_prefill(self):
    """The proposer's shared cache prefill (`SharedCachePrefill`), or None."""
    P = self.proposer
    return P.cache_prefill() if isinstance(P, SharedCachePrefill) else None

  def _prefill_lowerings(self):
    """(the target's prefill lowering, the proposer's: `Proposer.prefill_lowering`)."""
    base = self.lowering
    t_lw = base.replace(bf16_blocks=prefill_in_bf16(self.target_params))
    return t_lw, self.proposer.prefill_lowering(t_lw, base)

  def _step_fn(self, sampling: SamplingParams, proposer=None):
    P = proposer or self.proposer
    lw = step_lowering(self.lowering)
    fn = functools.partial(engine_probs_step if verifies_on_host(P, sampling) else engine_step,
                           target_config=self.target_config, sampling=sampling, proposer=P)

    def step(tp, dp, *args):
      return fn(with_lowering(tp, lw), with_lowering(dp, lw) if isinstance(dp, dict) else dp,
                *args)
    step.__name__ = "speculative_step"
    return step

  def _state_shardings(self, state, B: int):
    """On a mesh: every KVCache of the loop state as the sharding rules place it, every other
    leaf with its rows over "data" (where B divides) or replicated."""
    mesh = self.mesh

    def place(node):
      if isinstance(node, KVCache):
        return sharding.cache_shardings(node, mesh)
      return self._placed(node.shape, node.dtype, B).sharding

    return jax.tree.map(place, state, is_leaf=lambda x: isinstance(x, KVCache))

  def abstract_state(self, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    """The loop state's shapes (placed) that a [B, T] prefill into S slots gives (traced once
    per shapes and params: a continuous batching call reads them for its empty rows)."""
    key = (sampling, B, T, S, jnp.dtype(dtype).name)
    held = self._states.get(key)
    if held is not None and held[0] is self.target_params and held[1] is self.proposer_params:
      return held[2]
    state = self._trace_state(sampling, B, T, S, dtype)
    self._states[key] = (self.target_params, self.proposer_params, state)
    return state

  def _trace_state(self, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    i32 = functools.partial(self._placed, dtype=jnp.int32, B=B)
    tcache, caches = self._abstract_caches(B, S, dtype)
    _, state = jax.eval_shape(self._prefill_fn(sampling), self.target_params, self.proposer_params,
                              i32((B, T)), i32((B,)), tcache, caches, KEY)
    if self.mesh is None:
      return placed_like(state, self.target_params)
    sh = self._state_shardings(state, B)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, sh)

  def lower(self, sampling: SamplingParams, B: int, T: int, S: int, dtype, *,
            host_shape: tuple | None = None, programs=("prefill", "step"),
            proposer=None) -> dict:
    """The engine's programs for these shapes, LOWERED (not compiled): {"target_prefill": the
    target's prefill of a [B, T] prompt block into S slots (`autoregressive.target_prefill`),
    "cache_prefill": a proposer's shared model prefill into its cache (`SharedCachePrefill`),
    "prefill": the loop state from them (`proposer_prefill`), "step": one step, and when asked
    "put_row": continuous batching's hand-over of a row} (`programs`: which). `host_shape`:
    the host block's array shapes for a proposer with a host hook (default: its largest,
    `HostDrafter.host_shapes`). `proposer`: the step of a sized variant (`SelfSizing.sized`; its
    loop state is this one's). What `programs()` compiles, and what bench and the deviceless
    TPU/GPU builds compile: one way to build a program."""
    P = proposer or self.proposer
    out = {}
    i32 = functools.partial(self._placed, dtype=jnp.int32, B=B)
    key = self._placed(KEY.shape, KEY.dtype, B, rows=False)
    # the loop state's shapes (an abstract trace of the prefill): the step's input, and on a
    # mesh the prefill's output shardings; a prefill alone off a mesh needs none
    state = (self.abstract_state(sampling, B, T, S, dtype)
             if {"step", "put_row"} & set(programs) or self.mesh is not None else None)
    rep = None if self.mesh is None else sharding.replicated(self.mesh)
    if "target_prefill" in programs:  # the target's, shared with plain decoding's
      out["target_prefill"] = lower_target_prefill(
          self.target_params, self.target_config, sampling, B, T, S, dtype,
          lowering=self.lowering, mesh=self.mesh, feature_layers=self._feature_layers())
    if "cache_prefill" in programs:  # a model's prefill into one of the proposer's caches
      shared = self._cache_prefill()
      cache = self._abstract_caches(B, S, dtype)[1][shared.cache]
      jit_kw = {} if self.mesh is None else {
          "out_shardings": jax.tree.map(lambda x: x.sharding, cache)}
      out["cache_prefill"] = jax.jit(
          lowered(shared.fn, self._prefill_lowerings()[1]), donate_argnums=(3,),
          **jit_kw).lower(shared.model_params(self.proposer_params), i32((B, T)), i32((B,)),
                          cache)
    if "prefill" in programs:  # the proposer's, from the target's prefill
      first, tcache, last, feats = target_prefill_outputs(
          self.target_params, self.target_config, sampling, B, T, S, dtype, mesh=self.mesh,
          feature_layers=self._feature_layers())
      _, caches = self._abstract_caches(B, S, dtype)
      jit_kw = {}
      if self.mesh is not None:
        jit_kw["out_shardings"] = jax.tree.map(lambda x: x.sharding, state)
      out["prefill"] = jax.jit(self._proposer_prefill_fn(), donate_argnums=(7, 8),
                               **jit_kw).lower(self.target_params, self.proposer_params, i32(
                                   (B, T)), i32((B,)), first, last, feats, tcache, caches)
    if "put_row" in programs:  # continuous batching (a mesh's state keeps its shardings)
      jit_kw = {} if self.mesh is None else {
          "out_shardings": jax.tree.map(lambda x: x.sharding, state)}
      out["put_row"] = jax.jit(self._put_row_fn(sampling, S, dtype), donate_argnums=(0,),
                               **jit_kw).lower(state, self.abstract_state(sampling, 1, T, S,
                                                                          dtype),
                                               self._placed((), jnp.int32, B, rows=False))
    for name in programs:  # the proposer's own (a cross-vocabulary drafter's)
      if name not in ("target_prefill", "cache_prefill", "prefill", "step", "put_row"):
        out[name] = P.lower_host(name, sampling, B, T, S, dtype)
    if "step" in programs:
      if host_shape is None:
        host_shape = (tuple(P.host_shapes(B, sampling))[-1] if isinstance(P, HostDrafter)
                      else ())
      host = [self._placed(s.shape, s.dtype, B, rows=False)
              if isinstance(s, jax.ShapeDtypeStruct) else self._placed(s, jnp.int32, B, rows=False)
              for s in host_shape]
      jit_kw = {}
      if self.mesh is not None:
        n_out = (2 if verifies_on_host(P, sampling)
                 else 3 + len(step_count_names(P)) + int(is_gated(P)))
        jit_kw["out_shardings"] = ((jax.tree.map(lambda x: x.sharding, state),)
                                   + (rep,) * (n_out - 1))
      out["step"] = jax.jit(self._step_fn(sampling, P), donate_argnums=(2,), **jit_kw).lower(
          self.target_params, self.proposer_params, state, key, *host)
    return out

  def start_program(self, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    """(start(tokens [B, T], lengths [B], key) -> (first [B], state), compile seconds): the
    compiled prefills over fresh caches: the target's (`autoregressive.target_prefill_program`,
    the program plain decoding and every engine over the same target run) and the
    proposer's."""
    target, s1 = target_prefill_program(
        self._programs, self.target_params, self.target_config, sampling, B, T, S, dtype,
        lowering=self.lowering, mesh=self.mesh, feature_layers=self._feature_layers())
    prog, s2 = self._programs.get(
        self._key("prefill", sampling, B, T, S, jnp.dtype(dtype).name),
        lambda: self.lower(sampling, B, T, S, dtype, programs=("prefill",))[
            "prefill"].compile())
    shared, s3 = self._cache_prefill(), 0.0
    if shared is not None:  # shared by the engines of proposers over the same model
      fill, s3 = self._programs.get(
          ProgramKey("cache_prefill", shared.key, None, (B, T, S, jnp.dtype(dtype).name),
                     self._prefill_lowerings()[1]),
          lambda: self.lower(sampling, B, T, S, dtype, programs=("cache_prefill",))[
              "cache_prefill"].compile(),
          scope=lambda: ("cache_prefill", self.mesh,
                         arg_signature(shared.model_params(self.proposer_params))))

    def start(tokens, lengths, key):
      tcache, caches = self._new_caches(B, S, dtype)
      first, tcache, last, feats = target(self.target_params, tokens, lengths, tcache, key)
      if shared is not None:
        caches[shared.cache] = fill(shared.model_params(self.proposer_params), tokens, lengths,
                                    caches[shared.cache])
      return first, prog(self.target_params, self.proposer_params, tokens, lengths, first,
                         last, feats, tcache, caches)

    return start, s1 + s2 + s3

  def step_program(self, sampling: SamplingParams, B: int, S: int, dtype,
                   host_shape: tuple = (), proposer=None):
    """(the compiled step for a host block of `host_shape` (of a sized variant `proposer`),
    compile seconds: 0 when it was compiled before). The step's loop state holds [B, S] caches
    and nothing of the prompt block, so prompts of every length bucket share it."""
    T = 1  # the state's shapes do not depend on the prompt block
    return self._programs.get(
        self._key("step", sampling, B, S, jnp.dtype(dtype).name, tuple(host_shape),
                  proposer=proposer),
        lambda: self.lower(sampling, B, T, S, dtype, host_shape=tuple(host_shape),
                           programs=("step",), proposer=proposer)["step"].compile())

  def _sized(self, n: int):
    """The proposer drafting n tokens a step (`Proposer.sized`), made once per n."""
    if n not in self._sized_proposers:
      self._sized_proposers[n] = self.proposer.sized(n)
    return self._sized_proposers[n]

  def _commit_host(self, state: EngineState, accepted, nxt) -> EngineState:
    """`commit_host` compiled once (on a mesh the state keeps its shardings)."""
    def build():
      kw = {}
      if self.mesh is not None:
        kw["out_shardings"] = jax.tree.map(lambda x: x.sharding, state)
      return jax.jit(commit_host, donate_argnums=(0,), **kw)
    prog, _ = self._programs.get(ProgramKey("commit_host", "engine", None, (), self.lowering),
                                 build)
    return prog(state, jnp.asarray(accepted), jnp.asarray(nxt))

  def programs(self, sampling: SamplingParams, B: int, T: int, S: int, dtype, *,
               start: bool = True):
    """(start, step, compile seconds): `start(tokens, lengths, key) -> (first, state)` (None
    with `start=False`: continuous batching's prefills are one-row ones); `step` the compiled
    step (`step(tp, dp, state, key, *host)`), or for a proposer with a host hook a function of
    the host block's shapes returning (step, compile seconds now)."""
    start, c1 = self.start_program(sampling, B, T, S, dtype) if start else (None, 0.0)
    if isinstance(self.proposer, HostDrafter):
      return start, functools.partial(self.step_program, sampling, B, S, dtype), c1
    if self.self_sizing:  # a sized device drafter: the step of n drafts, compiled when chosen
      return start, lambda n: self.step_program(sampling, B, S, dtype,
                                                proposer=self._sized(n)), c1
    step, c2 = self.step_program(sampling, B, S, dtype)
    return start, step, c1 + c2

  # --- generation ------------------------------------------------------------------------------
  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               eos_token_ids: Sequence[int] = (), max_len: int | None = None,
               stop_strings: Sequence[str] = (), tokenizer=None,
               streamer=None, batch_size: int | None = None) -> GenerationResult:
    """Generate like `Decoder.generate`; greedy output equals it token for token.

    The result's `stats` is a SpecStats; `steps` counts verifications (target forwards).
    `batch_size`: the prompts run in batches of that many rows, one batch after another (each
    batch's draws from its own key; `stats` laid out over all the prompts). Calls on one engine
    from several threads run one after another.
    """
    with self._lock:
      return self._generate_batches(prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                                    seed=seed, eos_token_ids=eos_token_ids, max_len=max_len,
                                    stop_strings=stop_strings, tokenizer=tokenizer,
                                    streamer=streamer, batch_size=batch_size)

  def _generate_batches(self, prompts, *, max_new_tokens, sampling, seed, eos_token_ids,
                        max_len, stop_strings, tokenizer, streamer, batch_size):
    kw = dict(max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=eos_token_ids,
              max_len=max_len, stop_strings=stop_strings, tokenizer=tokenizer,
              streamer=streamer)
    if batch_size is not None and batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    prompts = token_ids(prompts)
    if batch_size is None or batch_size >= len(prompts):
      return self._generate(prompts, seed=seed, **kw)
    if streamer is not None:
      raise ValueError(f"a streamer takes one row (as transformers' streamers do); this "
                       f"request has {len(prompts)} rows")
    root = jax.random.fold_in(jax.random.key(seed), HOST_STREAM - 1)
    res = None
    for lo in range(0, len(prompts), batch_size):
      part = self._generate(prompts[lo:lo + batch_size], seed=seed, row0=lo,
                            key=None if lo == 0 else fold_in(root, lo), **kw)
      stats = part.stats.spread(lo, len(prompts))
      if res is None:
        res = dataclasses.replace(part, stats=stats)
        continue
      res.stats.extend(stats)
      res.tokens += part.tokens
      res.finish_reasons += part.finish_reasons
      res.prompt_lengths += part.prompt_lengths
      res.compile_s += part.compile_s
      res.prefill_s += part.prefill_s
      res.decode_s += part.decode_s
      res.steps += part.steps
      res.stats.sizing = part.stats.sizing or res.stats.sizing
    return res

  def _generate(self, prompts, *, max_new_tokens: int, sampling: SamplingParams, seed: int,
                eos_token_ids, max_len, stop_strings, tokenizer, streamer, row0: int = 0,
                key=None) -> GenerationResult:
    """One batch: `row0` its first row in the caller's request (errors name rows by it),
    `key` its key (default: the seed's)."""
    P = self.proposer
    if table_length(self.sizing_table, len(prompts)) == 0:  # the table says: plain decoding
      return self._plain_call(prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                              seed=seed if key is None else seed + row0,
                              eos_token_ids=eos_token_ids, max_len=max_len,
                              stop_strings=stop_strings, tokenizer=tokenizer, streamer=streamer)
    req = request(prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                  config=self.target_config, max_len=max_len, extra_slots=self.extra_slots,
                  method=self.method, mesh=self.mesh, seed=seed, eos_token_ids=eos_token_ids,
                  stop_strings=stop_strings, tokenizer=tokenizer, streamer=streamer)
    if key is not None:
      req = req._replace(key=key)
    req.out.row0 = row0
    B, S, dtype = req.B, req.S, compute_dtype(self.target_params)
    start, step, compile_s = self.programs(sampling, B, req.T, S, dtype)
    stats = SpecStats(drafted=[], accepted=[], proposer=P)
    run, compile_s = self._host_start(req, sampling, B, dtype, max_new_tokens, max_len,
                                      compile_s)
    held = {}
    sizer, since = self._sizer(B, S)
    if sizer is not None:  # rows not refilled: the call ends with its slowest
      sizer.begin(B, slowest=B > 1)
    handoff = self._handoff(sizer, sampling, B, S, dtype)

    def begin():
      first, state = start(jnp.asarray(req.tokens), jnp.asarray(req.lengths),
                           fold_in(req.key, 0))
      first = np.asarray(first)
      hist = ([np.append(np.asarray(p, np.int64), t) for p, t in zip(req.prompts, first)]
              if isinstance(P, HostDrafter) or handoff is not None else None)  # committed:
      if hist is not None:  # prompt + first token (a hand-over's resume reads them too)
        if isinstance(P, HostDrafter):
          P.host_begin(hist)
        held["hist"] = hist
      return first, (state, hist)

    advance = self._advance(sampling, step, stats, run, sizer, held, handoff)
    try:
      res = host_loop(req, begin, advance, compile_s=compile_s, stats=stats)
    finally:
      if "hist" in held and isinstance(P, HostDrafter):
        P.host_end(held["hist"])
    if sizer is not None:
      stats.sizing = sizer.record(since)
    return res

  def generate_continuous(self, prompts: Sequence[Sequence[int]], *, rows: int,
                          max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                          seed: int = 0, eos_token_ids: Sequence[int] = (),
                          max_len: int | None = None, stop_strings: Sequence[str] = (),
                          tokenizer=None) -> GenerationResult:
    """Continuous batching (`engine.continuous_loop`, as `Decoder.generate_continuous`):
    `rows` cache rows decode the prompts, and a row whose prompt is done takes the next one (a
    one-row prefill of the target and the proposer, the row's loop state replaced; a host hook
    hands the row over in `Proposer.host_swap`), so answers of different lengths keep every
    row busy. Outputs in prompt order; greedy output equals plain decoding's, and sampled
    output keeps the target's law (with other draws than `generate`'s). `stats` is laid out
    over the cache rows ([steps][rows], a row active while it holds a prompt; `per_prompt`
    sums a count per prompt). One device or
    a model-parallel mesh (its data axis 1); calls on one engine run one after another
    (`generate`)."""
    with self._lock:
      return self._continuous(prompts, rows=rows, max_new_tokens=max_new_tokens,
                              sampling=sampling, seed=seed, eos_token_ids=eos_token_ids,
                              max_len=max_len, stop_strings=stop_strings, tokenizer=tokenizer)

  def _continuous(self, prompts, *, rows, max_new_tokens, sampling, seed, eos_token_ids,
                  max_len, stop_strings, tokenizer) -> GenerationResult:
    P = self.proposer
    check_continuous_mesh(self.mesh)
    if not continuous_capable(P):
      raise ValueError(f"continuous batching: {self.method}'s proposer "
                       f"({type(P).__name__}) keeps per-row host state it cannot hand to "
                       f"another prompt; use generate(), with batch_size for many prompts")
    req = request(prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                  config=self.target_config, max_len=max_len, extra_slots=self.extra_slots,
                  method=self.method, mesh=self.mesh, seed=seed, eos_token_ids=eos_token_ids,
                  stop_strings=stop_strings, tokenizer=tokenizer, rows=rows)
    B, S, dtype = min(rows, req.B), req.S, compute_dtype(self.target_params)
    _, step, compile_s = self.programs(sampling, B, 1, S, dtype, start=False)
    stats = SpecStats(drafted=[], accepted=[], proposer=P)
    run, compile_s = self._host_start(req, sampling, B, dtype, max_new_tokens, max_len,
                                      compile_s, continuous=True)
    put, c = self._put_row_program(sampling, B, S, dtype)
    compile_s += c
    state = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype, device=x.sharding),
                         self.abstract_state(sampling, B, 1, S, dtype))
    # per row: its prompt's committed tokens (an idle row keeps its last prompt's: a hook's
    # block reads only active rows), and whether it holds a prompt
    host = isinstance(P, HostDrafter)
    hist = [np.zeros(1, np.int64)] * B if host else None
    held = {"hist": hist} if host else {}
    live = [False] * B

    def fill(carry, b, i, key):
      state, hist = carry
      ended = hist[b] if host and live[b] else None  # row b's prompt is done
      if i is None:  # no prompt left: the row idles (its tokens ignored)
        if ended is not None:
          P.host_swap(b, ended, None)
        live[b] = False
        return (state, hist), None, 0.0
      n = len(req.prompts[i])
      T = min(prompt_bucket(n), S)
      start, compiled = self.start_program(sampling, 1, T, S, dtype)
      first, row = start(jnp.asarray(req.tokens[i:i + 1, :T]), jnp.asarray([n], jnp.int32),
                         key)
      state = put(state, row, jnp.int32(b))
      tok = int(np.asarray(first)[0])
      if host:  # one hand-over: may compile (a drafter's one-row prefill)
        started = np.append(np.asarray(req.prompts[i], np.int64), tok)
        P.host_swap(b, ended, started)
        hist[b] = started
        compiled, run.compiled_s = compiled + run.compiled_s, 0.0
      live[b] = True
      return (state, hist), tok, compiled

    sizer, since = self._sizer(B, S)
    if sizer is not None:  # refilled rows: the call's throughput is every row's
      sizer.begin(B, slowest=False)
    advance = self._advance(sampling, step, stats, run, sizer, held)
    try:
      res = continuous_loop(req, rows, (state, hist), fill, advance, compile_s=compile_s,
                            stats=stats)
    finally:  # an error mid-run: the rows' prompts end where they are
      for b, h in enumerate(held.get("hist") or ()):
        if live[b]:
          P.host_swap(b, h, None)
    if sizer is not None:
      stats.sizing = sizer.record(since)
    return res

  def _put_row_program(self, sampling: SamplingParams, B: int, S: int, dtype):
    """(the compiled `_put_row_fn` for B rows, compile seconds: 0 when compiled before)."""
    return self._programs.get(
        self._key("put_row", sampling, B, S, jnp.dtype(dtype).name),
        lambda: self.lower(sampling, B, 1, S, dtype, programs=("put_row",))[
            "put_row"].compile())

  def _put_row_fn(self, sampling: SamplingParams, S: int, dtype):
    """put(state, row, b): a B-row loop state with row b replaced by a one-row prefill's state
    (every leaf along its row axis, found by comparing the state's shapes at 1 and 2 rows):
    continuous batching's hand-over."""
    one = self.abstract_state(sampling, 1, 1, S, dtype)
    two = self.abstract_state(sampling, 2, 1, S, dtype)

    def axis(x, y):
      diff = [a for a, (m, n) in enumerate(zip(x.shape, y.shape)) if m != n]
      if len(diff) != 1:
        raise ValueError(f"continuous batching: a loop-state leaf of {self.method} has no one "
                         f"row axis (shape {x.shape} at 1 row, {y.shape} at 2)")
      return diff[0]

    axes = jax.tree.map(axis, one, two)

    def put(state, row, b):
      return jax.tree.map(
          lambda x, r, a: jax.lax.dynamic_update_slice_in_dim(x, r.astype(x.dtype), b, axis=a),
          state, row, axes)

    put.__name__ = "speculative_put_row"
    return put

  def _host_start(self, req, sampling, B: int, dtype, max_new_tokens: int, max_len, compile_s,
                  continuous: bool = False):
    """A host hook's `HostRun` (None without one) and `host_start` called, before the clock
    (its programs' compile seconds added to `compile_s`): (run, compile_s)."""
    P = self.proposer
    if not isinstance(P, HostDrafter):
      return None, compile_s
    run = None

    def program(name, shapes, build):
      prog, seconds = self._programs.get(self._key(name, sampling, *shapes), build)
      run.compiled_s += seconds
      return prog

    run = HostRun(sampling=sampling, key=fold_in(req.key, HOST_STREAM), B=B, S=req.S,
                  dtype=dtype, room=max_new_tokens + self.extra_slots, max_len=max_len,
                  program=program, continuous=continuous)
    P.host_start(req.prompts, run)
    compile_s += run.compiled_s
    run.compiled_s = 0.0
    return run, compile_s

  def sizing_rules(self) -> dict:
    """{(rows, cache slots): the self-sizing rule (`sizing.DraftSizer`) its runs used}: the
    lengths chosen step by step (`choices`) and the running figures it chose them from."""
    return dict(self._sizers)

  def _sizer(self, B: int, S: int):
    """(the self-sizing rule of B rows over S slots, or None; where this run's choices start)."""
    if not self.self_sizing:
      return None, 0
    P = self.proposer  # host blocks cut to a width (0: a plain step), or a sized drafter
    fixed = table_length(self.sizing_table, B)
    sizer = self._sizers.get((B, S))
    if sizer is None:
      sizer = self._sizers[(B, S)] = DraftSizer(
          [shape[0][1] for shape in P.host_shapes(B)], fixed=fixed) if isinstance(
              P, HostDrafter) else DraftSizer(
                  P.sized_lengths(), plain=False, fixed=fixed,
                  reach={n: P.sized_reach(n) for n in P.sized_lengths()})
    return sizer, len(sizer.choices)

  def learned_table(self) -> dict[int, int]:
    """{batch size: the draft length its rule's figures favor now among the lengths it has
    priced (`DraftSizer.best(explore=False)`)} over
    the rules this engine's runs measured (the longest cache's where several): a table for
    `sizing_table` that the next runs take without measuring."""
    out = {}
    for (B, S), sizer in sorted(self._sizers.items()):
      if sizer.fixed is None and sizer._times:
        out[B] = sizer.best(explore=False)
    return out

  def plain_decoder(self) -> Decoder:
    """The target's plain decoder over this engine's target params (made once): the programs
    a sizing table's plain calls and a `Resumable` drafter's plain steps run, shared with the
    process's plain decoders of the same params (`engine.ProgramCache`)."""
    if self._plain is None:
      self._plain = Decoder(self.target_params, self.target_config, mesh=self.mesh)
    return self._plain

  def _plain_call(self, prompts, *, sampling: SamplingParams, **kw) -> GenerationResult:
    """A call that a sizing table makes plain decoding: the plain decoder's `generate`, its
    steps recorded as undrafted ones (a row active while it decoded)."""
    res = self.plain_decoder().generate(prompts, sampling=sampling, **kw)
    B = len(res.tokens)
    active = [[s + 1 < len(res.tokens[b]) for b in range(B)] for s in range(res.steps)]
    stats = SpecStats(drafted=[[0] * B for _ in active], accepted=[[0] * B for _ in active],
                      active=active, proposer=self.proposer)
    stats.sizing = {"rule": "a sizing table's n = 0: plain decoding's programs",
                    "table": dict(self.sizing_table), "choices": {0: res.steps}}
    return dataclasses.replace(res, stats=stats)

  def _handoff(self, sizer, sampling: SamplingParams, B: int, S: int, dtype):
    """Where a sized step of 0 drafts runs the plain decoder's step program: (plain step
    getter, resume getter), or None (no rule, a drafter that is not `Resumable`, a mesh, a
    row-state vocabulary policy: those keep the engine's own plain step)."""
    P = self.proposer
    if (sizer is None or not isinstance(P, Resumable) or self.mesh is not None
        or row_vocab_of(P) is not None or 0 not in sizer.lengths):
      return None

    def plain():
      return self.plain_decoder().step_program(sampling, B, S, dtype)

    def resume(W: int):
      def build():
        lw = step_lowering(self.lowering)

        def fn(dp, state, block):
          ctx = Context(last=state.last, lengths=state.target_cache.lengths)
          dp = with_lowering(dp, lw) if isinstance(dp, dict) else dp
          return state.replace(draft=P.resume(dp, state.draft, ctx, block))
        fn.__name__ = "speculative_resume"
        state = self.abstract_state(sampling, B, 1, S, dtype)
        return jax.jit(fn, donate_argnums=(1,)).lower(
            self.proposer_params, state, self._placed((B, W), jnp.int32, B)).compile()
      return self._programs.get(self._key("resume", sampling, B, S, jnp.dtype(dtype).name, W),
                                build)

    return plain, resume

  def _advance(self, sampling: SamplingParams, step, stats: SpecStats, run, sizer, held: dict,
               handoff=None):
    """`host_loop`'s step for this engine: carry (loop state, each row's committed tokens for
    a host hook or a hand-over, else None); the step's counts recorded into `stats`.
    `handoff` (`_handoff`): a sized step of 0 drafts runs the plain decoder's step and the
    drafter stays idle until a drafting step, which first resumes it (`Resumable.resume`, in
    that step's time)."""
    P = self.proposer
    names = step_count_names(P)
    on_host = verifies_on_host(P, sampling)
    host = isinstance(P, HostDrafter)

    def advance(carry, i, key, active):
      state, hist = carry
      compiled = 0.0
      SP = P  # this step's proposer (a sized variant of P)
      if host:
        t_host = time.perf_counter()
        arrays, host_counts = P.host_block(hist, active)
        # a program the hook compiled first now: its seconds are compile time, not host time
        compiled, run.compiled_s = run.compiled_s, 0.0
        stats.host_s += time.perf_counter() - t_host - compiled
        if sizer is not None:  # at most the chosen length, at most what was found
          need = min(sizer.choose(active), int(np.max(host_counts, initial=0)))
          width = next(m for m in sizer.lengths if m >= need)
          arrays, host_counts = limit_block(arrays, host_counts, width)
        prog, seconds = step(tuple(host_spec(a) for a in arrays))
        compiled += seconds
        t0 = time.perf_counter()
        out = prog(self.target_params, self.proposer_params, state, key, *map(jnp.asarray, arrays))
      elif sizer is not None:  # a sized device drafter
        width = sizer.choose(active)
        behind = held.get("behind", 0)
        if (width == 0 and handoff is not None  # the resume's block must fit every row
                and min(map(len, hist)) - 1 >= behind + 1 + P.unseen_max):
          return self._plain_step(handoff[0], state, hist, key, active, stats, sizer, held)
        SP = self._sized(width)
        prog, compiled = step(width)
        t0 = time.perf_counter()
        if behind:  # the drafter reads what it missed: in this step's time
          W = resume_width(behind + P.unseen_max, min(map(len, hist)) - 1)
          resume, c = handoff[1](W)
          compiled += c
          block = np.stack([h[len(h) - 1 - W:len(h) - 1] for h in hist]).astype(np.int32)
          state = resume(self.proposer_params, state, jnp.asarray(block))
          held["behind"] = 0
        host_counts, out = None, prog(self.target_params, self.proposer_params, state, key)
      else:
        t0 = time.perf_counter()
        host_counts, out = None, step(self.target_params, self.proposer_params, state, key)
      if on_host:  # the target's probabilities; the proposer verifies, the engine commits
        state, p = out
        p = np.asarray(p)
        stats.step_s += time.perf_counter() - t0
        t_host = time.perf_counter()
        n, nxt = P.host_verify(p, active)
        stats.host_s += time.perf_counter() - t_host
        n, nxt = np.asarray(n, np.int32), np.asarray(nxt, np.int32)
        state = self._commit_host(state, n, nxt)
        drafts = np.asarray(arrays[0])
        emitted = np.full((len(n), drafts.shape[1] + 1), -1, np.int64)
        for b in range(len(n)):
          emitted[b, :n[b] + 1] = [*drafts[b, :n[b]], nxt[b]]
        rest = []
      else:
        state, emitted, n, *rest = out
        emitted, n = np.asarray(emitted), np.asarray(n)
        stats.step_s += time.perf_counter() - t0
      rest = [np.asarray(x) for x in rest]
      counts = dict(zip(names, rest))
      keep = rest[len(names)] if is_gated(P) else None
      drafted = (SP.drafted_counts(active, counts, host_counts, keep)
                 if isinstance(SP, Counted) else drafted_counts(SP, active, host_counts, keep))
      if sizer is not None:  # the step's time (not when its program compiled first)
        sizer.update(width, None if compiled else time.perf_counter() - t0, drafted, n)
      stats.drafted.append(drafted)
      stats.accepted.append([int(x) if a else 0 for x, a in zip(n, active)])
      stats.active.append([bool(a) for a in active])
      if isinstance(SP, Counted):
        SP.record_step(stats, active, {**counts, "accepted": n}, host_counts, keep)
      if hist is not None:  # idle rows' (continuous batching) stay as they are
        hist = held["hist"] = [np.concatenate([h, e[:k + 1]]) if a else h
                               for h, e, k, a in zip(hist, emitted, n, active)]
      return (state, hist), emitted, compiled
    return advance

  def _plain_step(self, plain, state: EngineState, hist, key, active, stats: SpecStats,
                  sizer: DraftSizer, held: dict):
    """One step of the plain decoder's own program (`_handoff`): the target's cache and
    `last` advance, the drafter's state stays as it was (`held["behind"]` counts the steps it
    missed). Returns `advance`'s triple."""
    prog, compiled = plain()
    t0 = time.perf_counter()
    nxt, tcache = prog(self.target_params, state.last, state.target_cache, key)
    state = state.replace(target_cache=tcache, last=nxt)
    emitted = np.asarray(nxt)[:, None].astype(np.int64)
    seconds = time.perf_counter() - t0
    stats.step_s += seconds
    held["behind"] = held.get("behind", 0) + 1
    zeros = [0] * len(active)
    sizer.update(0, None if compiled else seconds, zeros, zeros)
    stats.drafted.append(zeros)
    stats.accepted.append(zeros)
    stats.active.append([bool(a) for a in active])
    hist = held["hist"] = [np.concatenate([h, e]) if a else h
                           for h, e, a in zip(hist, emitted, active)]
    return (state, hist), emitted, compiled


def resume_width(need: int, room: int) -> int:
  """The block width a resume reads: `need` rounded up to a power of two (one program per
  width), at most `room` (the shortest row's committed tokens before `last`)."""
  return min(max(need, 1 << (need - 1).bit_length()), room)


def host_spec(a):
  """A host block array's part of a step program's key: its shape (int32), or its
  `jax.ShapeDtypeStruct` (another dtype: a sampled drafter's q rows)."""
  dtype = jnp.dtype(a.dtype)
  if dtype == jnp.int32:
    return tuple(np.shape(a))
  return jax.ShapeDtypeStruct(tuple(np.shape(a)), dtype)


def mesh_layout(layout: str, mesh) -> str:
  """A decoder's weight layout: as asked without a mesh; on one the sharding rules' [out, in]
  ("auto" or "out_in"; another layout is refused by name)."""
  if mesh is None:
    return layout
  if layout not in ("auto", "out_in"):
    raise ValueError(f"layout={layout!r}: on a mesh the weights stay [out, in] (the "
                     f"sharding rules' layout); pass layout='auto' or 'out_in'")
  return "out_in"
