"""Block drafting with a DFlash drafter (`vocabjax.models.dflash`): bs - 1 drafts per step from
one pass, verified as a chain (or as a tree, `tree=`).

Letters: B batch, bs block size, G = bs - 1 drafts, P = bs pending entries, Lf*Dt fused
target feature width, S cache slots, V target vocabulary.

Features are handed over as for an EAGLE head: the target's prefill and each verification return
the outputs of the drafter's `target_layer_ids` (the last layer: its final normed hidden state);
the accepted positions' features are the pending context the next pass writes into the draft
cache. At the start of a step (N = the target cache's length, per row) the draft cache holds
positions 0 .. N - 1 - pend_count, the pending features complete it to N - 1, and the block sits
at N .. N + bs - 1. Drafts go through the target's LM head (or a `speculators` head's own rows),
restricted by `draft_vocab`; sampled drafts return each position's law as `q`, so the chain keeps
the target's law. DFlash 2 drafts through its candidate selector (`select_drafts`;
`selector=False`: the head's argmax). A tree takes each position's top-k as a depth's children
(deterministic, not with the selector). docs/dflash.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import struct

from vocabjax import sharding
from vocabjax.decoding.drafter import DraftVocab, PolicyHead
from vocabjax.decoding.proposer import Context, Drafts, Prefilled, static_tree
from vocabjax.decoding.tree import TreeBounds
from vocabjax.lowering import lowering_of, with_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.dflash import (
  DFlashConfig,
  block_forward,
  context_prefill,
  scale_logits,
  selector_context,
  selector_scores,
)
from vocabjax.models.llamalike import (
  FINAL_NORMED,
  float_dtype,
  is_int8,
  lm_head_matrix,
  with_mlp_layout,
)
from vocabjax.models.medusa import MedusaError, medusa_tree
from vocabjax.sampling import SamplingParams, log_probs, top_k
from vocabjax.vocab.policy import (
  POLICY_STATE,
  Policy,
  bound_policy,
  candidate_sampling,
  draft_choice,
  full_policy,
  scatter_full,
  to_target_many,
)
from vocabjax.vocab.subset import HeadRows

DRAFTER_KEY = "dflash"  # the drafter's own params inside the proposer's pytree


@struct.dataclass
class DFlashState:
  cache: KVCache  # context entries 0 .. N - 1 - pend_count (module doc)
  pend_feats: jax.Array  # [B, P, Lf*Dt] features of the pending committed positions
  pend_count: jax.Array  # [B] int32 in 0 .. P


def _scaled(params, h, *, inner, config: DFlashConfig):
  """A vocabulary policy whose logits pass through the drafter's multiplier and soft cap."""
  ids, logits = inner(params, h)
  return ids, scale_logits(logits, config)


def _drafter(params) -> dict:
  return with_lowering(params[DRAFTER_KEY], lowering_of(params))


def select_drafts(policy: Policy, params, h: jax.Array, anchor: jax.Array, key,
                  sampling: SamplingParams, *, config: DFlashConfig, vocab_size: int
                  ) -> tuple[jax.Array, jax.Array | None]:
  """DFlash 2's candidate selector over a block's G positions (module doc): h [B, G, D] the
  final normed hidden states of the drafted positions, anchor [B] the block's first token.
  (tokens [B, G] int32, q [B, G, V] or None when greedy)."""
  B, G, D = h.shape
  selector = params[DRAFTER_KEY]["selector"]
  ids, logits = policy(params, h.reshape(B * G, D))
  k = min(config.selector_top_k, logits.shape[-1])  # a policy of fewer rows: all of them
  lw = lowering_of(params)
  unary, j = top_k(logits, k, split=lw.split_top_k, block=lw.block_top_k)
  cands = to_target_many(ids, j).reshape(B, G, k)
  context = selector_context(selector, h, lw)
  sp = candidate_sampling(sampling, k)

  def step(prev, xs):
    ctx, un, cand, key = xs
    scores = selector_scores(selector, ctx, prev, un, cand)
    if sampling.greedy:
      pick, q = jnp.argmax(scores, axis=-1), None
    else:
      lp = log_probs(scores, sp)
      pick = jax.random.categorical(key, lp, axis=-1)
      q = scatter_full(cand, jnp.exp(lp), vocab_size)
    tok = jnp.take_along_axis(cand, pick[:, None].astype(jnp.int32), axis=-1)[:, 0]
    return tok, (tok, q)

  keys = jnp.zeros((G,)) if sampling.greedy else jax.random.split(key, G)  # greedy: unread
  xs = (context.swapaxes(0, 1), unary.reshape(B, G, k).swapaxes(0, 1), cands.swapaxes(0, 1),
        keys)
  _, (tokens, q) = jax.lax.scan(step, anchor.astype(jnp.int32), xs)
  return tokens.swapaxes(0, 1), None if q is None else q.swapaxes(0, 1)


class DFlashProposer(PolicyHead):
  """A DFlash or DFlash 2 drafter proposing a chain of bs - 1 tokens per pass (module doc)."""

  method = "dflash"
  draft_block_calls = True  # one call over the block

  def __init__(self, target_params, target_config: LlamaLikeConfig, drafter_params,
               config: DFlashConfig, *, draft_vocab: DraftVocab | None = None,
               selector: bool = True, tree: Sequence[Sequence[int]] | None = None):
    config.check_target(target_config)
    if ("lm_head" in drafter_params) != (config.draft_vocab_size is not None):
      raise ValueError(f"the drafter's params {'hold' if 'lm_head' in drafter_params else 'lack'}"
                       f" an LM head of its own, its config says draft_vocab_size="
                       f"{config.draft_vocab_size}")
    if config.draft_vocab_size is not None:  # a head of its own: its rows are the policy
      if draft_vocab is not None:
        raise ValueError(f"this DFlash drafter drafts over its own head of "
                         f"{config.draft_vocab_size} rows (draft_vocab_size); a second "
                         f"vocabulary policy on top of it is not supported")
      K = config.draft_vocab_size
      draft_vocab = HeadRows(rows=drafter_params["lm_head"],
                             ids=jnp.arange(K, dtype=jnp.int32)
                             + jnp.asarray(drafter_params["d2t"], jnp.int32))
      drafter_params = {k: v for k, v in drafter_params.items() if k not in ("lm_head", "d2t")}
    if config.dflash2:
      self.method = "dflash2"
    self.selector = selector and config.dflash2
    self.tree = None
    if tree is not None:  # Medusa-style choices over the block's positions (module doc)
      if self.selector:
        raise ValueError("DFlash 2's selector drafts one path (each pick rescored given the one "
                         "before it); a tree over the positions' top-k needs selector=False")
      try:
        self.tree = medusa_tree(tree, config.gamma)
      except MedusaError as e:  # its "heads" are the block's drafted positions here
        raise ValueError(f"tree choices: {e} (DFlash: the block's {config.gamma} drafted "
                         f"positions)") from None
      self.bounds = TreeBounds(top_k=self.tree.max_children, depth=self.tree.max_depth)
    if is_int8(target_params):
      raise ValueError("a DFlash drafter reads the target's embedding rows and features as "
                       "floats; an int8 target (`quantize_int8`) is not supported: load the "
                       "target in float32 or bfloat16 (or a GGUF file's own blocks)")
    self.config = config
    self.gamma = config.gamma
    self.drafted_per_step = config.gamma if self.tree is None else self.tree.size
    # the block (or the tree's nodes) past max_new_tokens, and one more
    self.extra_slots = max(config.block_size, self.drafted_per_step + 1) + 1
    L = target_config.num_layers
    # the reference reads `output_hidden_states[i + 1]`: the last layer's is the final normed one
    self.feature_layers = tuple(FINAL_NORMED if i == L - 1 else i
                                for i in config.target_layer_ids)
    self.head_vocab_config = target_config.replace(tie_word_embeddings=False)
    self.params = {DRAFTER_KEY: drafter_params, "embed": target_params["embed"],
                   "lm_head": lm_head_matrix(target_params, target_config)}
    self.draft_vocab = draft_vocab
    rows = draft_vocab.size if draft_vocab is not None else target_config.vocab_size
    if self.tree is not None and self.tree.top_k > rows:
      raise ValueError(f"the tree's choices use rank {self.tree.top_k - 1}, beyond the "
                       f"{rows} candidates each position drafts over")
    self._inner = full_policy(self.head_vocab_config)
    self.policy = bound_policy(_scaled, inner=self._inner, config=config)

  def key(self):
    return ("dflash", self.config, self.policy, self.feature_layers, self.selector,
            None if self.tree is None else self.tree.choices)

  def prepare(self, *, layout: str, lowering, mesh=None) -> None:
    dp = self.params
    self.params = {**dp, DRAFTER_KEY: with_mlp_layout(dp[DRAFTER_KEY], layout)}
    if self.draft_vocab is not None:
      self.params, self._inner = self.draft_vocab.attach(self.params, self.head_vocab_config,
                                                         mesh=mesh)
      self.policy = bound_policy(_scaled, inner=self._inner, config=self.config)

  def place(self, mesh, target_config) -> None:
    """The embedding and LM head split by rows as the target's, a policy's arrays by
    `sharding.place_policy`, the drafter's layers by the target's layer rules."""
    def drafter(tree):
      return {k: [sharding.shard_layer(x, self.config.layer, mesh) for x in v]
              if k == "layers" else sharding.replicate(v, mesh) for k, v in tree.items()}

    self.params = {k: sharding.shard_rows(v, mesh) if k in ("embed", "lm_head")
                   else sharding.place_policy(v, mesh) if k == POLICY_STATE
                   else drafter(v) if k == DRAFTER_KEY
                   else sharding.replicate(v, mesh) for k, v in self.params.items()}

  def caches(self) -> dict:
    return {"dflash": self.config.cache_config()}

  def prefill(self, params, target_params, pre: Prefilled) -> DFlashState:
    cache = context_prefill(_drafter(params), pre.features, pre.caches["dflash"],
                            config=self.config)
    B, P = pre.tokens.shape[0], self.config.block_size
    return DFlashState(cache=cache.with_lengths(pre.lengths),
                       pend_feats=jnp.zeros((B, P, self.config.fused_width),
                                            pre.features.dtype),
                       pend_count=jnp.zeros_like(pre.lengths))

  def propose(self, params, state: DFlashState, ctx: Context, key, *,
              sampling: SamplingParams, keep=None):
    del keep
    c = self.config
    B, G = ctx.last.shape[0], c.gamma
    block = jnp.concatenate([ctx.last[:, None].astype(jnp.int32),
                             jnp.full((B, G), c.mask_token_id, jnp.int32)], axis=1)
    h, cache = block_forward(_drafter(params), params["embed"], block, state.pend_feats,
                             state.pend_count, state.cache, config=c)
    h = h[:, 1:]  # position i predicts the token at N + i
    V = self.head_vocab_config.vocab_size
    if self.tree is not None:  # deterministic nodes: each position's rank-r candidate
      t = self.tree
      ids, logits = self.policy(params, h.reshape(B * G, -1))
      lw = lowering_of(params)
      _, top = top_k(logits, t.top_k, split=lw.split_top_k, block=lw.block_top_k)
      top = to_target_many(ids, top).reshape(B, G, t.top_k)
      parent, depth = static_tree(t.parent, t.depth, B)
      drafts = Drafts(tokens=top[:, t.head, t.rank].astype(jnp.int32), parent=parent,
                      depth=depth, bounds=self.bounds)
      return drafts, state.replace(cache=cache)
    if self.selector:
      tok, q = select_drafts(self.policy, params, h, ctx.last, key, sampling, config=c,
                             vocab_size=V)
    else:
      tok, q = draft_choice(self.policy, params, h.reshape(B * G, -1), key, sampling, V)
    drafts = Drafts(tokens=tok.reshape(B, G).astype(jnp.int32),
                    q=None if q is None else q.reshape(B, G, -1))
    return drafts, state.replace(cache=cache)

  def commit(self, params, state: DFlashState, ctx: Context, drafts: Drafts, v) -> DFlashState:
    feats = v.features.astype(state.pend_feats.dtype)  # a tree's path: depth + 1 <= P entries
    feats = jnp.pad(feats, ((0, 0), (0, state.pend_feats.shape[1] - feats.shape[1]), (0, 0)))
    return state.replace(pend_feats=feats, pend_count=(v.accepted + 1).astype(jnp.int32))

  # --- profiling (`vocabjax.decoding.profile`) ------------------------------------------------

  def drafter_calls(self):
    return [(self.config.block_size, self.config.gamma)]

  def drafter_body(self):
    """(fn(params, tokens, positions, cache) -> (hidden, cache), params, cache config): one
    pass over a block with no pending context (the feature fusion of a step's pending entries
    is left out: it is one [P, Lf*Dt] x [Lf*Dt, D] product)."""
    c = self.config

    def body(dp, tokens, positions, cache):
      del positions
      B, T = tokens.shape
      feats = jnp.zeros((B, T, c.fused_width), float_dtype(dp["embed"]))
      return block_forward(_drafter(dp), dp["embed"], tokens, feats,
                           jnp.zeros((B,), jnp.int32), cache, config=c)

    return body, self.params, c.cache_config()

  def draft_width(self) -> int:
    return self.config.layer.hidden_size
