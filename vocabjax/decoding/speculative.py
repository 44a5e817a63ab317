"""Chain and tree speculative decoding with an independent drafter (Leviathan et al. 2023).

Letters: B batch, G gamma (drafts per step), T prompt block, S cache slots, V vocabulary.

One step, compiled once per configuration: the drafter proposes G tokens, the target scores
[last, d_1 .. d_G] in one forward, verification keeps a prefix and emits one more token, and
both caches are rolled back by resetting their lengths. Rows of a batch accept different
numbers of tokens; everything is per row.

Cache invariants at the start of a step (N[b] = target cache length):
  target: holds every committed token except `last` (N entries);
  drafter: holds every committed token except the last `pending` (1 or 2) of them. After a
    fully accepted block the drafter never saw d_G (pending 2), so the next step's first
    drafting call feeds [prev = d_G, last] as one two-token call (or, on XLA:CPU without the
    CPU kernel, a conditional T=1 catch-up call first).

`draft_vocab` swaps the drafter's vocabulary policy: a static subset (`VocabSubset`, VocabTrim /
FR-Spec) for `vocabjax.vocab.subset.static_policy`, a ranker (`SpeculativeVocab`, SpecVocab) for
`vocabjax.vocab.ranked.ranked_policy`. Only the candidates' rows are multiplied, drafts and q
stay over the target's ids (q = 0 outside the candidates), and verification is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vocabjax.decoding.autoregressive import (GenerationResult, abstract_cache, cache_slots,
                                              compile_prefill, request)
from vocabjax.decoding.base import DecodingMethod
from vocabjax.decoding.engine import ProgramCache, Request, fold_in, host_loop
from vocabjax.sampling import SamplingParams
from vocabjax.decoding.tree import TreeParams, TreeState, tree_step
from vocabjax.decoding.verify import verify_chain
from vocabjax.kernels import cpu_matmul
from vocabjax.lowering import (Lowering, decoding_lowering, default_cpu_kernel, lowered,
                               lowering_of, step_lowering, target_platform)
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import compute_dtype, forward, with_mlp_layout
from vocabjax import sharding
from vocabjax.vocab.policy import POLICY_STATE, Policy, draft_choice, full_policy
from vocabjax.vocab.ranked import SpeculativeVocab
from vocabjax.vocab.subset import VocabSubset

DraftVocab = VocabSubset | SpeculativeVocab  # a static subset or a ranker's per-step candidates
DRAFT_PREFILLS = ("bf16", "exact")  # the drafter's prompt prefill: see `compile_draft_prefill`


@struct.dataclass
class ChainState:
  """Loop state of chain speculative decoding; fixed shapes, one row per sequence."""

  target_cache: KVCache  # every committed token except `last`
  draft_cache: KVCache  # every committed token except the last `pending`
  last: jax.Array  # [B] int32 newest committed token (fed to both models next step)
  prev: jax.Array  # [B] int32 the committed token before `last`
  pending: jax.Array  # [B] int32 in {1, 2}: committed tokens the drafter has not seen


@dataclasses.dataclass
class SpecStats:
  """Per-step, per-row counts of a speculative run (rows count only while active)."""

  drafted: list[list[int]]  # [steps][B] drafts proposed (0 once a row finished)
  accepted: list[list[int]]  # [steps][B] drafts accepted

  @property
  def target_forwards(self) -> int:
    return sum(1 for row in self.drafted if any(row))

  @property
  def tau(self) -> float:
    """Mean tokens emitted per verification (accepted + 1), over active rows and steps."""
    steps = sum(1 for row in self.drafted for d in row if d)
    acc = sum(a for row in self.accepted for a in row)
    return (acc + steps) / steps if steps else float("nan")

  @property
  def acceptance_rate(self) -> float:
    drafted = sum(d for row in self.drafted for d in row)
    acc = sum(a for row in self.accepted for a in row)
    return acc / drafted if drafted else float("nan")

  def record(self) -> dict:
    """Method-specific totals for an eval record (subclasses add theirs; none here)."""
    return {}


def chain_step(target_params, draft_params, state: ChainState, key, *, target_config,
               draft_config, gamma: int, sampling: SamplingParams,
               draft_policy: Policy | None = None):
  """Draft gamma tokens, verify them in one target forward, accept, roll back the caches.

  `draft_policy`: the drafter's vocabulary policy (`vocabjax.vocab.policy`; default: its full
  LM head). Returns (state, emitted [B, gamma + 1] with -1 after the emitted tokens,
  accepted [B]).
  """
  policy = draft_policy or full_policy(draft_config)
  V = target_config.vocab_size
  G = gamma
  N = state.target_cache.lengths
  keys = jax.random.split(key, G + 1)

  # The first drafting call feeds [prev, last] at slots [N - 1, N]: after a fully accepted
  # block the drafter never saw d_G (= prev), and otherwise prev's entry is already cached
  # and is written again from the same context. With the CPU kernel (or any GPU/TPU) a
  # two-token call costs about one one-token call, so this is cheaper than a separate
  # catch-up call after every fully accepted block (which XLA:CPU's dot needed: there a
  # T=2 forward cost ~2.4 T=1 forwards, and a conditional T=1 call is used instead).
  if lowering_folds_catch_up(lowering_of(draft_params)):
    pair = jnp.stack([state.prev, state.last], axis=1)
    h, dcache = forward(draft_params, pair, (N - 1)[:, None] + jnp.arange(2)[None],
                        state.draft_cache.with_lengths(N - 1), config=draft_config)
  else:
    def catch_up(cache):
      need = state.pending == 2
      pos = jnp.where(need, N - 1, N)
      tok = jnp.where(need, state.prev, state.last)
      _, cache = forward(draft_params, tok[:, None], pos[:, None], cache.with_lengths(pos),
                         config=draft_config)
      return cache

    dcache = jax.lax.cond(jnp.any(state.pending == 2), catch_up, lambda c: c,
                          state.draft_cache)
    h, dcache = forward(draft_params, state.last[:, None], N[:, None], dcache.with_lengths(N),
                        config=draft_config)
  d0, q0 = draft_choice(policy, draft_params, h[:, -1], keys[0], sampling, V)

  def body(carry, i):
    tok, cache = carry
    h, cache = forward(draft_params, tok[:, None], (N + i)[:, None], cache, config=draft_config)
    d, q = draft_choice(policy, draft_params, h[:, -1], keys[i], sampling, V)
    return (d, cache), (d, q)

  (_, dcache), (ds, qs) = jax.lax.scan(body, (d0, dcache), jnp.arange(1, G))
  ds = jnp.concatenate([d0[None], ds])
  qs = None if q0 is None else jnp.concatenate([q0[None], qs])  # greedy drafts carry no q
  drafts = ds.T  # scan stacks on axis 0: [G, B] -> [B, G]

  v = verify_chain(target_params, state.last, drafts, state.target_cache, keys[G],
                   target_config=target_config, sampling=sampling,
                   q=None if qs is None else jnp.moveaxis(qs, 0, 1))  # q [B, G, V]
  n = v.accepted
  new_n = N + 1 + n
  pending = jnp.where(n == G, 2, 1).astype(jnp.int32)
  committed = jnp.concatenate([state.last[:, None], drafts], axis=1)
  prev = jnp.take_along_axis(committed, n[:, None], axis=1)[:, 0]
  new_state = ChainState(target_cache=v.target_cache,
                         draft_cache=dcache.with_lengths(new_n + 1 - pending),
                         last=v.next, prev=prev, pending=pending)
  return new_state, v.emitted, n


def fold_catch_up(backend: str | None = None, cpu_kernel: bool | None = None) -> bool:
  """Whether chain drafting starts with a two-token call (see `chain_step`): everywhere but
  on XLA:CPU without the CPU kernel (`backend`: the program's `Lowering.platform`;
  `cpu_kernel`: its `Lowering.cpu_kernel`; None: the defaults of decoders built now)."""
  return block_layout(backend, cpu_kernel) == "out_in"


def lowering_folds_catch_up(lowering: Lowering) -> bool:
  """`fold_catch_up` for a traced program's `lowering` (read from it, nothing else: an
  untagged program, platform "", folds, which is exact on every platform)."""
  return fold_catch_up(lowering.platform or "any", lowering.cpu_kernel)


def block_layout(backend: str | None = None, cpu_kernel: bool | None = None) -> str:
  """MLP weight layout for programs that run T > 1 tokens: PyTorch's [out, in] (what the CPU
  kernel `vocabjax.kernels.cpu_matmul` streams, and what GPU/TPU compilers lay out
  themselves); [in, out] only on XLA:CPU without the kernel, where Eigen's GEMM repacks
  [out, in] weights on every call (see `with_mlp_layout`). `backend`: the platform the
  programs are built for (None: `lowering.target_platform()`, read when a decoder is built,
  never while tracing); `cpu_kernel`: whether the programs use the kernel (None:
  `lowering.default_cpu_kernel()`, what decoders built now use)."""
  if (backend or target_platform()) != "cpu":
    return "out_in"
  kernel = default_cpu_kernel() if cpu_kernel is None else cpu_kernel
  return "out_in" if kernel and cpu_matmul.available() else "in_out"


class SpeculativeDecoder(DecodingMethod):
  """Shared host loop of chain and tree speculative decoding (subclasses define the step)."""

  method = "speculative"

  draft_block_calls = False  # whether the drafter's calls feed T > 1 tokens (layout choice)
  step_outputs = 3  # the step program returns (state, emitted, accepted, *more)

  def __init__(self, target_params, target_config: LlamaLikeConfig, draft_params,
               draft_config: LlamaLikeConfig, *, layout: str = "auto",
               draft_vocab: DraftVocab | None = None, draft_prefill: str = "bf16", mesh=None):
    """`draft_prefill`: "bf16" (default) runs the drafter's prompt prefill with bf16-rounded
    activations where the CPU has AVX512-BF16 (about 2x faster; it changes only what the
    drafter proposes, never the output), "exact" in the drafter's own precision; see
    `compile_draft_prefill`. `mesh`: a ("data", "model") mesh (`vocabjax.sharding`): the target
    and the drafter are placed on it (tensor-parallel heads / MLP, vocabulary-split LM heads;
    a policy's arrays and a head-drafter's weights replicated), the caches and every loop state
    row over "data", and every program runs partitioned (module doc of `vocabjax.sharding`)."""
    check_draft_prefill(draft_prefill)
    self.mesh = mesh
    # what every program of this decoder lowers with (`vocabjax.lowering`): on a mesh XLA's
    # dot is partitioned with the weights, while the CPU kernel is one device's custom call
    # (GSPMD would gather the weights to it), so sharded programs do without it; XLA's TopK is
    # not partitioned either, so top-k over vocabulary-split logits runs as rounds of argmax,
    # and a batch's cache writes as one update per row
    self.lowering = decoding_lowering(mesh=mesh)
    layout = mesh_layout(layout, mesh)
    self.draft_prefill = draft_prefill
    if draft_config.vocab_size != target_config.vocab_size:
      raise ValueError(
          f"drafter vocabulary V={draft_config.vocab_size} differs from the target's "
          f"V={target_config.vocab_size}; a drafter with another tokenizer needs "
          f"`vocabjax.decoding.crossvocab.CrossVocabDecoder` (OmniDraft), not {self.method} "
          f"drafting")
    if layout == "auto":  # the target only ever runs blocks (prefill, verification)
      t_layout = block_layout(self.lowering.platform, self.lowering.cpu_kernel)
      d_layout = t_layout if self.draft_block_calls else "out_in"
    else:
      t_layout = d_layout = layout
    self.tp, self.tc = with_mlp_layout(target_params, t_layout), target_config
    self.dp, self.dc = self._with_draft_layout(draft_params, d_layout), draft_config
    self.draft_policy: Policy = full_policy(draft_config)  # the drafter's vocabulary policy
    self.draft_vocab = draft_vocab
    if draft_vocab is not None:  # a trimmed head (VocabTrim / FR-Spec) or a ranker (SpecVocab)
      self.dp, self.draft_policy = draft_vocab.attach(self.dp, draft_config, mesh=mesh)
    if mesh is not None:
      self.tp = sharding.shard_params(self.tp, self.tc, mesh)
      self.dp = self._place_draft(self.dp, mesh)
    self._programs = ProgramCache()

  def _with_draft_layout(self, draft_params, layout: str):
    """The drafter's params with its MLP weights stored `layout` (`with_mlp_layout`)."""
    return with_mlp_layout(draft_params, layout)

  def _place_draft(self, draft_params, mesh):
    """The drafter's params on `mesh`: a llama drafter by the sharding rules, its policy's
    arrays replicated (head drafters override: their weights are small, all replicated)."""
    rest = {k: v for k, v in draft_params.items() if k != POLICY_STATE}
    out = sharding.shard_params(rest, self.dc, mesh)
    if POLICY_STATE in draft_params:
      out[POLICY_STATE] = sharding.replicate(draft_params[POLICY_STATE], mesh)
    return out

  def _cache(self, config: LlamaLikeConfig, B: int, S: int, dtype) -> KVCache:
    """An empty cache, placed on the mesh (rows over "data", KV heads over "model")."""
    cache = KVCache.init(config, B, S, dtype)
    return cache if self.mesh is None else sharding.shard_cache(cache, config, self.mesh)

  def _abstract_cache(self, config: LlamaLikeConfig, B: int, S: int, dtype) -> KVCache:
    return abstract_cache(config, B, S, dtype, self.mesh)

  # --- what a method defines ----------------------------------------------------------------
  drafted_per_step: int  # drafts proposed per row per verification
  extra_slots: int  # cache slots a step may write past max_new_tokens
  verify_tokens: int  # target positions one step verifies per row

  @property
  def draft_head_rows(self) -> int:
    """LM-head rows the drafter multiplies per call (K for a trimmed head, K + the ranker's
    cost in D-wide rows for a speculative vocabulary, else V)."""
    return self.draft_vocab.head_rows if self.draft_vocab is not None else self.dc.vocab_size

  def cache_len(self, longest: int, max_new_tokens: int, max_len: int | None = None) -> int:
    """Cache slots `generate` uses: `max_len`, else the longest prompt + new tokens + one
    step's extra slots, rounded up to a bucket."""
    return cache_slots(longest, max_new_tokens + self.extra_slots, max_len)

  @property
  def times_step_parts(self) -> bool:
    return True

  def drafter_calls(self) -> list[tuple[int, int]]:
    """(tokens fed, LM-head rows) per row of each drafter call in one step (for profiling)."""
    raise NotImplementedError

  def drafter_body(self):
    """(fn(params, tokens, positions, cache) -> hidden, params, cache config): the drafter's
    forward without its LM head (for profiling)."""
    return functools.partial(model_body, config=self.dc), self.dp, self.dc

  def _step_fn(self, sampling: SamplingParams):
    raise NotImplementedError

  def _lowered_step(self, sampling: SamplingParams):
    """`_step_fn` with both models' params tagged with the decoder's step lowering."""
    return lowered(self._step_fn(sampling), step_lowering(self.lowering), argnums=(0, 1))

  def _initial_state(self, tcache, dcache, first, prompts):
    raise NotImplementedError

  def _compile_start(self, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    """(start, abstract initial state): `start(tokens [B, T], lengths [B], prompt_last [B],
    key) -> (first token [B], initial loop state)` runs the compiled prefills."""
    tcache = self._abstract_cache(self.tc, B, S, dtype)
    dcache = self._abstract_cache(self.dc, B, S, dtype)
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    tprefill = compile_prefill(self.tp, self.tc, sampling, B, T, tcache, self.lowering)
    dprefill = compile_draft_prefill(self.dp, self.dc, B, T, dcache, self.draft_prefill,
                                     self.lowering)

    def start(tokens, lengths, prompt_last, key):
      first, tc = tprefill(self.tp, tokens, lengths, self._cache(self.tc, B, S, dtype), key)
      dc = dprefill(self.dp, tokens, lengths, self._cache(self.dc, B, S, dtype))
      return first, self._initial_state(tc, dc, first, prompt_last)

    return start, jax.eval_shape(self._initial_state, tcache, dcache, i32(B), i32(B))

  # --- shared -------------------------------------------------------------------------------
  def programs(self, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    """AOT-compiled (start: the prefills of a [B, T] prompt block, step) and the seconds spent
    compiling them now. The prefills are compiled per prompt block T; the step, whose loop
    state holds [B, S] caches and nothing of T, once per (B, S): prompts of another length
    bucket reuse it."""
    name = jnp.dtype(dtype).name
    (start, state), c1 = self._programs.get(
        ("start", sampling, B, T, S, name),
        lambda: self._compile_start(sampling, B, T, S, dtype))
    if self.mesh is None:
      step, c2 = self._programs.get(("step", sampling, B, S, name), lambda: jax.jit(
          self._lowered_step(sampling), donate_argnums=(2,)).lower(
              self.tp, self.dp, state, jax.random.key(0)).compile())
      return start, step, c1 + c2
    (state_sh, step), c2 = self._programs.get(
        ("step", sampling, B, S, name),
        lambda: self._compile_sharded_step(sampling, start, B, T))

    def placed_start(tokens, lengths, prompt_last, key):
      first, st = start(tokens, lengths, prompt_last, key)
      return first, jax.device_put(st, state_sh)

    return placed_start, step, c1 + c2

  def _compile_sharded_step(self, sampling, start, B: int, T: int):
    """(the loop state's shardings, step) on the mesh. The loop state keeps the shardings the
    prefills gave it (read from one start on a dummy [B, T] prompt, counted as compile time; a
    leaf made outside them, e.g. a row counter, is placed with its rows over "data"), in and out
    of the step, so the loop never reshards between steps (`programs` places every start's
    state so); the emitted tokens come back replicated."""
    mesh = self.mesh

    def placed(x):
      if isinstance(x.sharding, jax.sharding.NamedSharding) and x.sharding.mesh == mesh:
        return x.sharding
      rows = x.ndim >= 1 and x.shape[0] == B and B % mesh.shape["data"] == 0
      return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
          "data" if rows else None))

    z = jnp.zeros((B, T), jnp.int32)
    _, state = start(z, jnp.ones((B,), jnp.int32), z[:, 0], jax.random.key(0))
    state_sh = jax.tree.map(placed, state)
    rep = sharding.replicated(mesh)
    step = jax.jit(self._lowered_step(sampling), donate_argnums=(2,),
                   out_shardings=(state_sh,) + (rep,) * (self.step_outputs - 1)).lower(
        self.tp, self.dp, jax.device_put(state, state_sh), jax.random.key(0)).compile()
    return state_sh, step

  def _request(self, prompts, max_new_tokens: int, sampling: SamplingParams, seed: int,
               eos_token_ids, max_len, stop_strings, tokenizer, streamer=None) -> Request:
    """The request checked and laid out (`autoregressive.request`) for this decoder."""
    return request(prompts, max_new_tokens=max_new_tokens, sampling=sampling, config=self.tc,
                   max_len=max_len, extra_slots=self.extra_slots, method=self.method,
                   mesh=self.mesh, seed=seed, eos_token_ids=eos_token_ids,
                   stop_strings=stop_strings, tokenizer=tokenizer, streamer=streamer)

  def _start(self, req: Request, start):
    """`host_loop`'s start: the compiled prefills (`programs`) over the request."""
    def run():
      return start(jnp.asarray(req.tokens), jnp.asarray(req.lengths),
                   jnp.asarray([p[-1] for p in req.prompts], jnp.int32),
                   fold_in(req.key, 0))
    return run

  def _new_stats(self) -> SpecStats:
    return SpecStats(drafted=[], accepted=[])

  def _record(self, stats: SpecStats, active, accepted, extra) -> None:
    """Add one step's counts (host arrays; `extra`: the step's outputs after `accepted`)."""
    del extra
    stats.drafted.append([self.drafted_per_step if a else 0 for a in active])
    stats.accepted.append([int(x) if a else 0 for x, a in zip(accepted, active)])

  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               eos_token_ids: Sequence[int] = (), max_len: int | None = None,
               stop_strings: Sequence[str] = (), tokenizer=None,
               streamer=None) -> GenerationResult:
    """Generate like `Decoder.generate`; greedy output equals it token for token.

    The result's `stats` is a SpecStats; `steps` counts verifications (target forwards).
    """
    req = self._request(prompts, max_new_tokens, sampling, seed, eos_token_ids, max_len,
                        stop_strings, tokenizer, streamer)
    start, step, compile_s = self.programs(sampling, req.B, req.T, req.S, compute_dtype(self.tp))
    stats = self._new_stats()

    def advance(state, i, key, active):
      state, emitted, n, *extra = step(self.tp, self.dp, state, key)
      self._record(stats, active, np.asarray(n), [np.asarray(x) for x in extra])
      return state, emitted, 0.0

    return host_loop(req, self._start(req, start), advance, compile_s=compile_s, stats=stats)


class ChainDecoder(SpeculativeDecoder):
  """Chain speculative decoding with an independent same-vocabulary drafter."""

  method = "chain"

  def __init__(self, target_params, target_config, draft_params, draft_config, *,
               gamma: int = 4, layout: str = "auto", draft_vocab: DraftVocab | None = None,
               draft_prefill: str = "bf16", mesh=None):
    if gamma < 1:
      raise ValueError(f"gamma must be >= 1, got {gamma=}")
    super().__init__(target_params, target_config, draft_params, draft_config, layout=layout,
                     draft_vocab=draft_vocab, draft_prefill=draft_prefill, mesh=mesh)
    self.gamma = gamma
    self.drafted_per_step = gamma
    self.extra_slots = gamma + 2  # a whole block past max_new_tokens, and the dummy slot
    self.verify_tokens = gamma + 1

  def drafter_calls(self):
    if lowering_folds_catch_up(self.lowering):  # [prev, last], then 1 per call
      return [(2, 1)] + [(1, 1)] * (self.gamma - 1)
    # the T=1 catch-up call (no head) runs only after a fully accepted block: counted as always
    return [(1, 1)] * self.gamma + [(1, 0)]

  def _step_fn(self, sampling):
    return functools.partial(chain_step, target_config=self.tc, draft_config=self.dc,
                             gamma=self.gamma, sampling=sampling,
                             draft_policy=self.draft_policy)

  def _initial_state(self, tcache, dcache, first, prompt_last):
    return ChainState(target_cache=tcache, draft_cache=dcache, last=first, prev=prompt_last,
                      pending=jnp.ones_like(first))


class TreeDecoder(SpeculativeDecoder):
  """EAGLE-2 dynamic-tree speculative decoding with an independent same-vocabulary drafter."""

  method = "tree"

  draft_block_calls = True  # the pending block and k-wide frontiers

  def __init__(self, target_params, target_config, draft_params, draft_config, *,
               tree: TreeParams = TreeParams(), layout: str = "auto",
               draft_vocab: DraftVocab | None = None, draft_prefill: str = "bf16", mesh=None):
    if draft_vocab is not None and draft_vocab.size < tree.top_k:
      raise ValueError(f"tree top_k={tree.top_k} exceeds the drafter's vocabulary subset of "
                       f"K={draft_vocab.size} tokens")
    if tree.top_k > draft_config.vocab_size:
      raise ValueError(f"tree top_k={tree.top_k} exceeds the drafter's vocabulary of "
                       f"V={draft_config.vocab_size} tokens")
    super().__init__(target_params, target_config, draft_params, draft_config, layout=layout,
                     draft_vocab=draft_vocab, draft_prefill=draft_prefill, mesh=mesh)
    self.tree = tree
    self.drafted_per_step = tree.total_tokens
    self.extra_slots = tree.total_tokens + tree.draft_slots + tree.depth + 2
    self.verify_tokens = tree.total_tokens + 1

  def drafter_calls(self):
    t = self.tree
    return [(t.depth + 1, 1)] + [(t.top_k, t.top_k)] * (t.depth - 1)

  def _step_fn(self, sampling):
    return functools.partial(tree_step, target_config=self.tc, draft_config=self.dc,
                             tree=self.tree, sampling=sampling,
                             draft_policy=self.draft_policy)

  def _initial_state(self, tcache, dcache, first, prompt_last):
    del prompt_last
    B, P = first.shape[0], self.tree.depth + 1
    return TreeState(target_cache=tcache, draft_cache=dcache, last=first,
                     pend_tokens=jnp.broadcast_to(first[:, None], (B, P)).astype(jnp.int32),
                     pend_count=jnp.ones_like(first))


def model_body(params, tokens, positions, cache, *, config):
  """The hidden states of `forward` alone (what profiling times as a model's body)."""
  return forward(params, tokens, positions, cache, config=config)[0]


def mesh_layout(layout: str, mesh) -> str:
  """A decoder's weight layout: as asked without a mesh; on one the sharding rules' [out, in]
  ("auto" or "out_in"; another layout is refused by name)."""
  if mesh is None:
    return layout
  if layout not in ("auto", "out_in"):
    raise ValueError(f"layout={layout!r}: on a mesh the weights stay [out, in] (the "
                     f"sharding rules' layout); pass layout='auto' or 'out_in'")
  return "out_in"


def check_draft_prefill(draft_prefill: str) -> None:
  if draft_prefill not in DRAFT_PREFILLS:
    raise ValueError(f"unknown draft_prefill={draft_prefill!r}; choose one of {DRAFT_PREFILLS}")


def compile_draft_prefill(params, config: LlamaLikeConfig, B: int, T: int, cache: KVCache,
                          precision: str = "bf16", lowering: Lowering = Lowering()):
  """AOT-compiled drafter prefill of a [B, T] prompt block (the cache argument is donated).

  `precision="bf16"`: on a CPU with AVX512-BF16 the projections of blocks of >= 32 tokens run
  `vocabjax.kernels.cpu_matmul`'s bf16 GEMM (activations rounded to bf16, f32 accumulation),
  twice XLA's f32 GEMM rate: a 709-token prompt's drafter prefill is a third of the target's
  prefill time in f32, so this is time every speculative method pays and plain decoding does
  not. The drafter's precision only changes which tokens it proposes; the target verifies
  every one, so outputs are unchanged (greedy identical, sampling lossless). Elsewhere (GPU,
  TPU, CPUs without AVX512-BF16, short prompts) it is the same program as "exact".
  """
  check_draft_prefill(precision)
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
  lowering = lowering.replace(bf16_blocks=precision == "bf16")
  return jax.jit(lowered(functools.partial(_draft_prefill, config=config), lowering),
                 donate_argnums=(3,)).lower(params, i32(B, T), i32(B), cache).compile()


def _draft_prefill(params, tokens, prompt_lengths, cache, *, config):
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  _, cache = forward(params, tokens, positions, cache, config=config, fresh=True,
                     valid_lengths=prompt_lengths)
  return cache.with_lengths(prompt_lengths)
