"""Parallel drafting with a P-EAGLE head (parallel EAGLE-3, as vLLM's `speculators` defines and
trains it): K tokens per head pass, verified as a chain.

Letters: B batch, K drafts per step, P = K + 1 pending entries, Lf*Dt fused target feature
width, D head width, S cache slots, V target vocabulary.

The head is an EAGLE-3 head (`vocabjax.models.eagle`) trained with depths: depth 0 is EAGLE-3's
own step (token x_{p+1} with the target's feature f_p predicts x_{p+2}); an entry at depth d > 0
sits at position p + d, reads the mask token and the learned `mask_hidden` feature, attends to
every committed entry and the depths before it, and predicts x_{p+d+2}. So one causal pass over
the root (the step's `last` with the feature before it) and K - 1 mask entries reads K drafts
(`speculators`' `peagle/attention.py`); mask entries are never kept. State, feature hand-over
and vocabulary are EAGLE's (`vocabjax.decoding.eagle`); sampled drafts return each position's
law as `q`, so the chain keeps the target's law (docs/peagle.md).
"""

from __future__ import annotations

import jax.numpy as jnp

from vocabjax.decoding.drafter import DraftVocab
from vocabjax.decoding.eagle import HEAD_KEY, EagleProposer, EagleState, _head, _norm
from vocabjax.decoding.proposer import Context, Drafts
from vocabjax.decoding.tree import TreeParams
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import EagleConfig, eagle_forward, fuse_features
from vocabjax.sampling import SamplingParams
from vocabjax.vocab.policy import draft_choice


class PEagleProposer(EagleProposer):
  """A P-EAGLE head drafting a chain of K tokens per pass (module doc)."""

  method = "peagle"
  draft_block_calls = True
  parallel_head = True

  def __init__(self, target_params, target_config: LlamaLikeConfig, head_params,
               head_config: EagleConfig, *, drafts: int = 8, lm_head: str = "own",
               draft_vocab: DraftVocab | None = None):
    if not head_config.parallel:
      raise ValueError("the head has no mask_token_id: an EAGLE-3 head, not a P-EAGLE one "
                       "(method eagle drafts with it)")
    if drafts < 1:
      raise ValueError(f"drafts={drafts}: a P-EAGLE pass drafts at least one token")
    own_embed = head_params.get("embed_tokens")
    head_params = {k: v for k, v in head_params.items() if k != "embed_tokens"}
    super().__init__(target_params, target_config, head_params, head_config,
                     tree=TreeParams(1, drafts, drafts), lm_head=lm_head,
                     draft_vocab=draft_vocab)
    if own_embed is not None:  # trained with the head: it embeds with its own
      self.params["embed"] = own_embed
    self.gamma = self.drafted_per_step = drafts
    self.pend_width = drafts + 1  # a step's accepted drafts and the next token, at most
    self.extra_slots = 2 * drafts + 2  # the pending entries, then the mask entries

  def key(self):
    return ("peagle", self.head_config, self.gamma, self.policy, self.pend_width)

  def propose(self, params, pre, ctx: Context, key, *, sampling: SamplingParams, keep=None):
    del keep  # never gated
    state, x_root, cache, _ = pre
    hc, K = self.head_config, self.gamma
    B = x_root.shape[0]
    xs = x_root[:, None]
    if K > 1:  # depths 1 .. K - 1 at the positions after the root's, causal among them
      head = _head(params)
      masks = jnp.full((B, K - 1), hc.mask_token_id, jnp.int32)
      h = fuse_features(head, head["mask_hidden"][None, None].astype(x_root.dtype))
      positions = (cache.lengths - 1)[:, None] + jnp.arange(1, K)[None]
      x, _ = eagle_forward(head, params["embed"], masks,
                           jnp.broadcast_to(h, (B, K - 1, h.shape[-1])), positions, cache,
                           config=hc)  # the mask entries' cache writes are dropped
      xs = jnp.concatenate([xs, x.astype(xs.dtype)], axis=1)
    hs = _norm(params, xs, hc)
    tok, q = draft_choice(self.policy, params, hs.reshape(B * K, -1), key, sampling,
                          self.head_vocab_config.vocab_size)
    return (Drafts(tokens=tok.reshape(B, K).astype(jnp.int32),
                   q=None if q is None else q.reshape(B, K, -1)), (state, cache))

  def commit(self, params, carry, ctx: Context, drafts: Drafts, v) -> EagleState:
    state, cache = carry
    return EagleState(head_cache=cache,
                      pend_tokens=jnp.maximum(v.emitted, 0).astype(jnp.int32),
                      pend_feats=v.features.astype(state.pend_feats.dtype),
                      pend_count=(v.accepted + 1).astype(jnp.int32))

  def drafter_calls(self):
    K = self.gamma
    return [(self.pend_width, 1)] + ([(K - 1, K - 1)] if K > 1 else [])


__all__ = ["HEAD_KEY", "PEagleProposer"]
