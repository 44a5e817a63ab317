"""Proposers that draft with an independent same-vocabulary model: a chain (Leviathan et al.
2023) or an EAGLE-2 dynamic tree (Li et al. 2024), under any drafter vocabulary policy.

Letters: B batch, G gamma (drafts per step), k top_k, d depth, S cache slots, V vocabulary.

Chain state at the start of a step (N[b] = the target cache's length): the drafter's cache holds
every committed token except the last `pending` (1 or 2) of them. After a fully accepted block
the drafter never saw d_G (pending 2), so the next step's first drafting call feeds
[prev = d_G, last] as one two-token call (or, on XLA:CPU without the CPU kernel, a conditional
T=1 catch-up call first).

Tree state: the drafter's cache holds every committed token except the `pend_count` pending
ones (the accepted path and the target's next token), which the next step's first call reads.

`draft_vocab` swaps the drafter's vocabulary policy: a static subset (`VocabSubset`, VocabTrim /
FR-Spec) for `vocabjax.vocab.subset.static_policy`, a ranker (`SpeculativeVocab`, SpecVocab) for
`vocabjax.vocab.ranked.ranked_policy`. Only the candidates' rows are multiplied, drafts and q
stay over the target's ids (q = 0 outside the candidates), and verification is unchanged.
"""

from __future__ import annotations

import copy
import functools

import jax
import jax.numpy as jnp
from flax import struct

from vocabjax import sharding
from vocabjax.decoding.proposer import (CachePrefill, Context, Drafts, Prefilled, Profiled,
                                       Resumable, SharedCachePrefill, TreeGrower)
from vocabjax.decoding.tree import (TreeBounds, TreeParams, drop_rows, grow_drafter_tree,
                                    read_pending)
from vocabjax.kernels import cpu_matmul
from vocabjax.lowering import (Lowering, default_cpu_kernel, lowered, lowering_of, target_platform,
                               scan as lowering_scan)
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import forward, with_mlp_layout
from vocabjax.sampling import SamplingParams
from vocabjax.vocab.policy import POLICY_STATE, Policy, draft_choice, full_policy
from vocabjax.vocab.ranked import SpeculativeVocab
from vocabjax.vocab.subset import VocabSubset

DraftVocab = VocabSubset | SpeculativeVocab  # a static subset or a ranker's per-step candidates
DRAFT_PREFILLS = ("bf16", "exact")  # the drafter's prompt prefill: see `compile_draft_prefill`


@struct.dataclass
class ChainState:
  """A chain drafter's state (module doc)."""

  draft_cache: KVCache  # every committed token except the last `pending`
  prev: jax.Array  # [B] int32 the committed token before `last`
  pending: jax.Array  # [B] int32 in {1, 2}: committed tokens the drafter has not seen


@struct.dataclass
class TreeState:
  """A tree drafter's state (module doc)."""

  draft_cache: KVCache  # every committed token except the `pend_count` pending ones
  pend_tokens: jax.Array  # [B, d + 1] committed tokens the drafter has not read, left-aligned
  pend_count: jax.Array  # [B] int32 in 1 .. d + 1


class PolicyHead(Profiled):
  """A drafter whose LM head is a vocabulary policy (`policy`) over the head of
  `head_vocab_config`, restricted by `draft_vocab` when there is one: what the time split
  (`vocabjax.decoding.profile`) multiplies."""

  draft_vocab: DraftVocab | None = None
  policy: Policy | None = None
  head_vocab_config: LlamaLikeConfig

  @property
  def head_rows(self) -> int:
    return (self.draft_vocab.head_rows if self.draft_vocab is not None
            else self.head_vocab_config.vocab_size)

  @property
  def head_policy(self):
    return self.policy


class ModelProposer(PolicyHead, SharedCachePrefill):
  """A drafter model of the target's vocabulary, with its vocabulary policy."""

  draft_block_calls = False

  def __init__(self, draft_params, draft_config: LlamaLikeConfig,
               target_config: LlamaLikeConfig, *, draft_vocab: DraftVocab | None = None,
               draft_prefill: str = "bf16"):
    check_draft_prefill(draft_prefill)
    if draft_config.vocab_size != target_config.vocab_size:
      raise ValueError(
          f"drafter vocabulary V={draft_config.vocab_size} differs from the target's "
          f"V={target_config.vocab_size}; a drafter with another tokenizer needs "
          f"`vocabjax.decoding.crossvocab.CrossVocabProposer` (OmniDraft), not {self.method} "
          f"drafting")
    self.params, self.config = draft_params, draft_config
    self.draft_config = self.head_vocab_config = draft_config
    self.draft_vocab, self.draft_prefill = draft_vocab, draft_prefill
    self.policy: Policy = full_policy(draft_config)  # the drafter's vocabulary policy

  def prepare(self, *, layout: str, lowering, mesh=None) -> None:
    self.params = with_mlp_layout(self.params, layout)
    if self.draft_vocab is not None:  # a trimmed head (VocabTrim / FR-Spec) or a ranker
      self.params, self.policy = self.draft_vocab.attach(self.params, self.config, mesh=mesh)

  def place(self, mesh, target_config) -> None:
    """A llama drafter by the sharding rules, its policy's arrays by `sharding.place_policy`
    (a trimmed head's rows split as the full head's)."""
    rest = {k: v for k, v in self.params.items() if k != POLICY_STATE}
    out = sharding.shard_params(rest, self.config, mesh)
    if POLICY_STATE in self.params:
      out[POLICY_STATE] = sharding.place_policy(self.params[POLICY_STATE], mesh)
    self.params = out

  def caches(self) -> dict:
    return {"draft": self.config}

  def prefill_lowering(self, target: Lowering, base: Lowering) -> Lowering:
    return base.replace(bf16_blocks=self.draft_prefill == "bf16")

  def cache_prefill(self) -> CachePrefill:
    """The drafter model's prompt prefill into its cache: one program for every proposer over
    this drafter (chain, tree, each vocabulary policy: the policy's arrays are not read)."""
    return CachePrefill(
        cache="draft", key=("drafter", self.config, self.draft_prefill),
        model_params=lambda params: {k: v for k, v in params.items() if k != POLICY_STATE},
        fn=functools.partial(prefill_drafter, config=self.config))

  def _prefill_cache(self, params, pre: Prefilled) -> KVCache:
    if "draft" in pre.filled:  # the engine ran `cache_prefill`
      return pre.caches["draft"]
    return prefill_drafter(params, pre.tokens, pre.lengths, pre.caches["draft"],
                          config=self.config)

  def drafter_body(self):
    return functools.partial(model_body, config=self.config), self.params, self.config

  def draft_width(self) -> int:
    return self.config.hidden_size


class ChainProposer(Resumable, ModelProposer):
  """A drafter model proposing a chain of `gamma` tokens (sampled drafts carry their q)."""

  method = "chain"

  def __init__(self, draft_params, draft_config, target_config, *, gamma: int = 4,
               draft_vocab: DraftVocab | None = None, draft_prefill: str = "bf16"):
    if gamma < 1:
      raise ValueError(f"gamma must be >= 1, got {gamma=}")
    super().__init__(draft_params, draft_config, target_config, draft_vocab=draft_vocab,
                     draft_prefill=draft_prefill)
    self.gamma = gamma
    self.drafted_per_step = gamma
    self.extra_slots = gamma + 2  # a whole block past max_new_tokens, and the dummy slot

  def key(self):
    return ("chain", self.config, self.gamma, self.policy, self.draft_prefill)

  def prefill(self, params, target_params, pre: Prefilled) -> ChainState:
    prompt_last = jnp.take_along_axis(pre.tokens, (pre.lengths - 1)[:, None], axis=1)[:, 0]
    return ChainState(draft_cache=self._prefill_cache(params, pre), prev=prompt_last,
                      pending=jnp.ones_like(pre.first))

  def propose(self, params, state: ChainState, ctx: Context, key, *,
              sampling: SamplingParams, keep=None):
    del keep
    if self.gamma == 0:  # a sized chain's plain step (`sized(0)`)
      return plain_chain(params, state, ctx, config=self.config, sampling=sampling)
    return chain_drafts(params, state, ctx, key, config=self.config, gamma=self.gamma,
                        sampling=sampling, policy=self.policy)

  def commit(self, params, dcache, ctx: Context, drafts: Drafts, verdict) -> ChainState:
    G = self.gamma
    n = verdict.accepted
    new_n = ctx.lengths + 1 + n
    pending = jnp.where(n == G, 2, 1).astype(jnp.int32)
    committed = jnp.concatenate([ctx.last[:, None], drafts.tokens], axis=1)
    prev = jnp.take_along_axis(committed, n[:, None], axis=1)[:, 0]
    return ChainState(draft_cache=dcache.with_lengths(new_n + 1 - pending), prev=prev,
                      pending=pending)

  def sized_lengths(self) -> tuple[int, ...]:
    return tuple(range(0, self.gamma + 1))

  unseen_max = 1  # `prev` (pending 2)

  def resume(self, params, state: ChainState, ctx: Context, block) -> ChainState:
    """The drafter's cache refilled from `block` (the committed tokens before `last`), so it
    holds every one of them: pending 1, `prev` the last of them."""
    return ChainState(draft_cache=feed_block(params, state.draft_cache, block, ctx.lengths,
                                             config=self.config),
                      prev=block[:, -1].astype(jnp.int32), pending=jnp.ones_like(state.pending))

  def sized(self, n: int) -> "ChainProposer":
    """A chain of n <= gamma drafts sharing this one's params, cache and state (its slots are
    this chain's: `extra_slots` kept); n = 0 a plain step (`plain_chain`)."""
    if not 0 <= n <= self.gamma:
      raise ValueError(f"a sized chain drafts 0 <= n <= gamma={self.gamma} tokens, got {n}")
    if n == self.gamma:
      return self
    out = copy.copy(self)
    out.gamma = out.drafted_per_step = n
    return out

  def drafter_calls(self):
    if self.gamma == 0:  # a plain step: the catch-up call, when a row is behind
      return [(1, 0)]
    if self._folds:
      return [(2, 1)] + [(1, 1)] * (self.gamma - 1)  # [prev, last], then 1 per call
    # the T=1 catch-up call (no head) runs only after a fully accepted block: counted as always
    return [(1, 1)] * self.gamma + [(1, 0)]

  _folds = True  # set by `prepare` from the engine's lowering

  def prepare(self, *, layout: str, lowering, mesh=None) -> None:
    super().prepare(layout=layout, lowering=lowering, mesh=mesh)
    self._folds = lowering_folds_catch_up(lowering)


def chain_drafts(params, state: ChainState, ctx: Context, key, *, config: LlamaLikeConfig,
                 gamma: int, sampling: SamplingParams, policy: Policy):
  """Draft `gamma` tokens with the drafter model: (Drafts with q where sampled, the drafter's
  cache with every draft's entry written)."""
  V = config.vocab_size
  G = gamma
  N = ctx.lengths
  keys = jax.random.split(key, G)

  # The first drafting call feeds [prev, last] at slots [N - 1, N]: after a fully accepted
  # block the drafter never saw d_G (= prev), and otherwise prev's entry is already cached
  # and is written again from the same context. With the CPU kernel (or any GPU/TPU) a
  # two-token call costs about one one-token call, so this is cheaper than a separate
  # catch-up call after every fully accepted block (which XLA:CPU's dot needed: there a
  # T=2 forward cost ~2.4 T=1 forwards, and a conditional T=1 call is used instead).
  if lowering_folds_catch_up(lowering_of(params)):
    pair = jnp.stack([state.prev, ctx.last], axis=1)
    h, dcache = forward(params, pair, (N - 1)[:, None] + jnp.arange(2)[None],
                        state.draft_cache.with_lengths(N - 1), config=config)
  else:
    dcache = catch_up(params, state, ctx, config=config)
    h, dcache = forward(params, ctx.last[:, None], N[:, None], dcache.with_lengths(N),
                        config=config)
  d0, q0 = draft_choice(policy, params, h[:, -1], keys[0], sampling, V)

  def body(carry, i):
    tok, cache = carry
    h, cache = forward(params, tok[:, None], (N + i)[:, None], cache, config=config)
    d, q = draft_choice(policy, params, h[:, -1], keys[i], sampling, V)
    return (d, cache), (d, q)

  (_, dcache), (ds, qs) = lowering_scan(body, (d0, dcache), jnp.arange(1, G),
                                        lowering_of(params))
  ds = jnp.concatenate([d0[None], ds])
  qs = None if q0 is None else jnp.concatenate([q0[None], qs])  # greedy drafts carry no q
  drafts = ds.T.astype(jnp.int32)  # scan stacks on axis 0: [G, B] -> [B, G]
  return Drafts(tokens=drafts, q=None if qs is None else jnp.moveaxis(qs, 0, 1)), dcache


def catch_up(params, state: ChainState, ctx: Context, *, config: LlamaLikeConfig) -> KVCache:
  """The chain drafter's cache with `prev` written at slot N - 1 where it was pending (a row
  with pending 1 writes `last` at N instead: the same entry a drafting call writes), under a
  conditional: no call when no row is behind."""
  N = ctx.lengths

  def feed(cache):
    need = state.pending == 2
    pos = jnp.where(need, N - 1, N)
    tok = jnp.where(need, state.prev, ctx.last)
    _, cache = forward(params, tok[:, None], pos[:, None], cache.with_lengths(pos),
                       config=config)
    return cache

  return jax.lax.cond(jnp.any(state.pending == 2), feed, lambda c: c, state.draft_cache)


def feed_block(params, cache: KVCache, block, lengths, *, config: LlamaLikeConfig) -> KVCache:
  """A drafter's cache holding `lengths` [B] entries per row, its last W rewritten from
  `block` [B, W] (the committed tokens at positions lengths - W .. lengths - 1): what a
  drafter left idle by plain steps reads back in one call (`Resumable.resume`). Entries it had
  already written are computed again from the same tokens; nothing past `lengths` is written."""
  W = block.shape[1]
  start = lengths - W
  _, cache = forward(params, block.astype(jnp.int32), start[:, None] + jnp.arange(W)[None],
                     cache.with_lengths(start), config=config)
  return cache.with_lengths(lengths)


def plain_chain(params, state: ChainState, ctx: Context, *, config: LlamaLikeConfig,
                sampling: SamplingParams):
  """A sized chain's plain step: no drafts (the target verifies `last` alone), and the
  drafter's cache caught up to everything but `last` (`catch_up`: a call only where `prev` was
  pending), so `commit`'s rule for n = 0 = gamma (pending 2: prev = last, then the next token)
  holds for the next step's first call."""
  B, V = ctx.last.shape[0], config.vocab_size
  tokens = jnp.zeros((B, 0), jnp.int32)
  q = None if sampling.greedy else jnp.zeros((B, 0, V), jnp.float32)
  return Drafts(tokens=tokens, q=q), catch_up(params, state, ctx, config=config)


class TreeProposer(Resumable, TreeGrower, ModelProposer):
  """A drafter model growing an EAGLE-2 dynamic tree (`tree.grow_tree`)."""

  method = "tree"
  draft_block_calls = True  # the pending block and k-wide frontiers
  gated = False  # `gate` reads the pending tokens; every row drafts

  def __init__(self, draft_params, draft_config, target_config, *,
               tree: TreeParams = TreeParams(), draft_vocab: DraftVocab | None = None,
               draft_prefill: str = "bf16"):
    if draft_vocab is not None and draft_vocab.size < tree.top_k:
      raise ValueError(f"tree top_k={tree.top_k} exceeds the drafter's vocabulary subset of "
                       f"K={draft_vocab.size} tokens")
    if tree.top_k > draft_config.vocab_size:
      raise ValueError(f"tree top_k={tree.top_k} exceeds the drafter's vocabulary of "
                       f"V={draft_config.vocab_size} tokens")
    super().__init__(draft_params, draft_config, target_config, draft_vocab=draft_vocab,
                     draft_prefill=draft_prefill)
    self.tree = tree
    self.bounds = TreeBounds(tree.top_k, tree.depth)
    self.pend_width = tree.depth + 1  # P: a step's accepted tokens + the next, at most
    self.drafted_per_step = tree.total_tokens
    self.extra_slots = tree.total_tokens + tree.draft_slots + tree.depth + 2

  def key(self):
    return ("tree", self.config, self.tree, self.policy, self.draft_prefill, self.pend_width)

  def prefill(self, params, target_params, pre: Prefilled) -> TreeState:
    B, P = pre.first.shape[0], self.pend_width
    return TreeState(draft_cache=self._prefill_cache(params, pre),
                     pend_tokens=jnp.broadcast_to(pre.first[:, None], (B, P)).astype(jnp.int32),
                     pend_count=jnp.ones_like(pre.first))

  def gate(self, params, state: TreeState, ctx: Context):
    """Every row drafts; the drafter reads its pending tokens here (the root's output), so a
    hybrid's step that grows no tree still leaves the drafter's cache caught up."""
    h_root, dcache = read_pending(params, state.draft_cache, state.pend_tokens,
                                  state.pend_count, config=self.config)
    return None, (h_root, dcache)

  def grow(self, params, pre, keep):
    """(tokens, parent, depth [B, n] of the tree grown from the root, the drafter cache); rows
    not in `keep` made padding."""
    h_root, dcache = pre
    tok, parent, depth, dcache = grow_drafter_tree(params, h_root, dcache, config=self.config,
                                                   tree=self.tree, policy=self.policy)
    return (*drop_rows(tok, parent, depth, keep), dcache)

  def skip(self, pre):
    return pre[1]

  def propose(self, params, pre, ctx: Context, key, *, sampling: SamplingParams, keep=None):
    del key, sampling  # deterministic drafts
    if self.tree is None:  # a sized tree's plain step (`sized(0)`): the root alone
      e = jnp.zeros((ctx.last.shape[0], 0), jnp.int32)
      return (Drafts(tokens=e, parent=e, depth=e, bounds=TreeBounds(1, self.bounds.depth)),
              self.skip(pre))
    tok, parent, depth, dcache = self.grow(params, pre, keep)
    return Drafts(tokens=tok, parent=parent, depth=depth, bounds=self.bounds), dcache

  def commit(self, params, dcache, ctx: Context, drafts: Drafts, verdict) -> TreeState:
    return TreeState(draft_cache=dcache, pend_tokens=verdict.pend_tokens,
                     pend_count=verdict.accepted + 1)

  def sized_lengths(self) -> tuple[int, ...]:
    """0 (a plain step), then trees of 1, 2, 4, .. nodes up to `total_tokens`."""
    n = self.tree.total_tokens
    return tuple(sorted({0, n} | {1 << i for i in range(n.bit_length()) if 1 << i <= n}))

  def sized_reach(self, n: int) -> int:
    return self.sized(n).tree.depth if n else 0

  @property
  def unseen_max(self) -> int:
    return self.pend_width - 1  # the pending block but its root

  def resume(self, params, state: TreeState, ctx: Context, block) -> TreeState:
    """The drafter's cache refilled from `block` (the committed tokens before `last`), `last`
    alone pending (as after a step that accepted nothing)."""
    B, P = state.pend_tokens.shape
    return TreeState(draft_cache=feed_block(params, state.draft_cache, block, ctx.lengths,
                                            config=self.config),
                     pend_tokens=jnp.broadcast_to(ctx.last[:, None], (B, P)).astype(jnp.int32),
                     pend_count=jnp.ones_like(state.pend_count))

  def sized(self, n: int) -> "TreeProposer":
    """A tree of n nodes (top_k and depth at most n) sharing this one's params, cache, state
    and bounds (so the pending block keeps its width); n = 0 a plain step (the drafter still
    reads its pending tokens in `gate`)."""
    if n not in self.sized_lengths():
      raise ValueError(f"a sized tree drafts one of {self.sized_lengths()} nodes, got {n}")
    if n == self.tree.total_tokens:
      return self
    out = copy.copy(self)
    t = self.tree
    out.tree = TreeParams(min(t.top_k, n), min(t.depth, n), n) if n else None
    out.drafted_per_step = n
    return out

  def drafter_calls(self):
    t = self.tree
    if t is None:  # a plain step: the pending block alone
      return [(self.pend_width, 0)]
    return [(t.depth + 1, 1)] + [(t.top_k, t.top_k)] * (t.depth - 1)


def model_body(params, tokens, positions, cache, *, config):
  """`forward` without the head: (hidden states, the cache with the tokens written), what
  profiling times as a model's body (the cache returned, so a timing can donate it as a step
  does: a cache that is neither donated nor returned is copied whole every call)."""
  return forward(params, tokens, positions, cache, config=config)


def fold_catch_up(backend: str | None = None, cpu_kernel: bool | None = None) -> bool:
  """Whether chain drafting starts with a two-token call (see `chain_drafts`): everywhere but
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
  TPU, CPUs without AVX512-BF16, short prompts) it is the same program as "exact". (The
  speculative engine runs the same function inside its prefill program, lowered so.)
  """
  check_draft_prefill(precision)
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
  lowering = lowering.replace(bf16_blocks=precision == "bf16")
  return jax.jit(lowered(functools.partial(prefill_drafter, config=config), lowering),
                 donate_argnums=(3,)).lower(params, i32(B, T), i32(B), cache).compile()


def prefill_drafter(params, tokens, prompt_lengths, cache, *, config):
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  _, cache = forward(params, tokens, positions, cache, config=config, fresh=True,
                     valid_lengths=prompt_lengths)
  return cache.with_lengths(prompt_lengths)
