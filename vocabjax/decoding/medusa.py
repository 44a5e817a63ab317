"""Medusa-1 decoding (Cai et al. 2024): heads on the target's own hidden state draft a static
tree (Medusa's `medusa_choices`), which the target verifies with the engine's tree verification.

Letters: B batch, D the target's hidden size, V its vocabulary, Hm heads, n tree nodes besides
the root, k top-k per head, S cache slots.

One step: the heads read the target's final hidden state h that produced `last` (the tree's
root); head j's top-k tokens fill the tree's depth-(j + 1) nodes as the choices say; one target
forward over [last, nodes] with the ancestor mask scores them (`verify_tree`); the accepted
path's KV is compacted, and the hidden state of the path's end (which produced the new `last`)
is the next step's h. The heads cost no extra target forward.

Exactness: the nodes are a deterministic function of h, siblings are distinct (one head's
top-k), so greedy verification reproduces plain greedy decoding, and sampling with the
multi-draft rule for point-mass drafts (`verify_tree_sampling`) follows the target's law
exactly. Medusa's "typical acceptance" (a thresholded, lossy rule) is not offered.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vocabjax import sharding
from vocabjax.lowering import lowering_of
from vocabjax.sampling import SamplingParams, top_k
from vocabjax.decoding.proposer import Context, Drafts, Prefilled, Profiled, static_tree
from vocabjax.decoding.tree import MAX_TREE_NODES, TreeBounds
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import is_int8, lm_head_weight
from vocabjax.models.medusa import (MedusaConfig, MedusaError, MedusaTree, medusa_hidden,
                                    medusa_tree)
from vocabjax.vocab.policy import POLICY_STATE, policy_state, with_policy_state
from vocabjax.vocab.subset import VocabSubset

MEDUSA_KEY = "medusa"  # the heads inside the decoder's drafter pytree


@struct.dataclass
class MedusaState:
  """The heads' state (the engine keeps the target cache and `last`, the next root)."""

  hidden: jax.Array  # [B, D] the target's final hidden state that produced `last`


def medusa_projection(dp, x):
  """(ids [K] or None for all V, logits [..., Hm, K or V] f32) of the heads' hidden states
  x [..., Hm, D]: each head's projection (its own, or the shared target head), restricted to an
  attached subset's rows (`POLICY_STATE`). Also the drafter-head part of the time split."""
  sub = policy_state(dp)
  heads = dp[MEDUSA_KEY]["heads"]
  if sub is not None:
    ids = sub["ids"]
    if "head" in sub:  # the shared head's K rows
      return ids, jnp.einsum("...HD,KD->...HK", x, sub["head"],
                             preferred_element_type=jnp.float32)
    rows = sub["heads"]  # each head's own K rows
  else:
    ids = None
    if "lm_head" in dp:
      return None, jnp.einsum("...HD,VD->...HV", x, dp["lm_head"],
                              preferred_element_type=jnp.float32)
    rows = [h["lm_head"] for h in heads]
  return ids, jnp.stack([jnp.einsum("...D,KD->...K", x[..., i, :], r,
                                    preferred_element_type=jnp.float32)
                         for i, r in enumerate(rows)], axis=-2)


def medusa_candidates(dp, hidden, *, config: MedusaConfig, tree: MedusaTree):
  """(node tokens [B, n]) of the static tree: node j is head j's rank-r token (`tree`); with a
  subset attached, the ranks are taken among its K tokens only."""
  x = medusa_hidden(dp[MEDUSA_KEY], hidden, config=config)  # [B, Hm, D]
  ids, logits = medusa_projection(dp, x)
  lw = lowering_of(dp)
  _, top = top_k(logits, tree.top_k, split=lw.split_top_k, block=lw.block_top_k)  # [B, Hm, k]
  if ids is not None:
    top = ids[top]
  return top[:, tree.head, tree.rank].astype(jnp.int32)


class MedusaProposer(Profiled):
  """Medusa-1 heads on the target's final hidden state drafting a static tree (module doc).

  `draft_vocab`: a static subset (VocabTrim / FR-Spec, `VocabSubset`) restricting every head's
  projection to its K rows (FR-Spec on Medusa); the ranks of `choices` are then ranks among
  those K tokens."""

  method = "medusa"
  draft_block_calls = True  # no drafter model: the layout choice is the target's alone

  def __init__(self, target_params, target_config: LlamaLikeConfig, medusa_params,
               medusa_config: MedusaConfig, *, choices: Sequence[Sequence[int]],
               draft_vocab: VocabSubset | None = None):
    medusa_config.check_target(target_config.hidden_size, target_config.vocab_size)
    if is_int8(target_params):
      raise ValueError("Medusa heads read the target's float hidden states and LM head; an "
                       "int8 target (`quantize_int8`) is not supported")
    tree = medusa_tree(choices, medusa_config.num_heads)
    if tree.top_k > target_config.vocab_size:
      raise ValueError(f"Medusa choices use rank {tree.top_k - 1}, beyond the vocabulary of "
                       f"V={target_config.vocab_size} tokens")
    self.mc, self.medusa_tree, self.target_config = medusa_config, tree, target_config
    # the verifier's bounds: siblings, depth and node count of this static tree
    self.bounds = self.tree = TreeBounds(top_k=tree.max_children, depth=tree.max_depth)
    dp = {MEDUSA_KEY: medusa_params}
    self.subset_size = None
    if draft_vocab is not None:
      if not isinstance(draft_vocab, VocabSubset):
        raise ValueError(f"Medusa heads take a static subset (VocabTrim / FR-Spec), not "
                         f"{type(draft_vocab).__name__}: a SpecVocab ranker is trained on a "
                         f"drafter's hidden states, not on the heads'")
      if draft_vocab.vocab_size != target_config.vocab_size:
        raise ValueError(f"the subset is over a vocabulary of {draft_vocab.vocab_size} tokens, "
                         f"the target has V={target_config.vocab_size}")
      if draft_vocab.size < tree.top_k:
        raise ValueError(f"Medusa choices use rank {tree.top_k - 1}, beyond the subset's "
                         f"K={draft_vocab.size} tokens")
      ids = jnp.asarray(np.asarray(draft_vocab.ids), jnp.int32)
      if medusa_config.shared_lm_head:
        sub = {"head": jnp.take(lm_head_weight(target_params, target_config), ids, axis=0)}
      else:
        sub = {"heads": [jnp.take(h["lm_head"], ids, axis=0) for h in medusa_params["heads"]]}
        dp = {MEDUSA_KEY: {"heads": [{k: v for k, v in h.items() if k != "lm_head"}
                                     for h in medusa_params["heads"]]}}
      dp = with_policy_state(dp, {**sub, "ids": ids})
      self.subset_size = draft_vocab.size
    elif medusa_config.shared_lm_head:
      dp["lm_head"] = lm_head_weight(target_params, target_config)
    self.params = dp
    self.drafted_per_step = tree.size
    self.extra_slots = tree.size + 2

  def key(self):
    return ("medusa", self.mc, self.medusa_tree.choices, self.subset_size)

  def place(self, mesh, target_config) -> None:
    """On a mesh: a shared LM head, and each head's own [V, D] projection, split by rows as
    the target's head is (replicated, each head's V x D would sit whole on every chip); a
    subset's rows split too (`sharding.place_policy`); the heads' residual blocks replicated."""
    def heads(tree):
      return {"heads": [{k: sharding.shard_rows(v, mesh) if k == "lm_head"
                         else sharding.replicate(v, mesh) for k, v in h.items()}
                        for h in tree["heads"]]}

    self.params = {k: sharding.shard_rows(v, mesh) if k == "lm_head"
                   else heads(v) if k == MEDUSA_KEY
                   else sharding.place_policy(v, mesh) if k == POLICY_STATE
                   else sharding.replicate(v, mesh) for k, v in self.params.items()}

  def prefill(self, params, target_params, pre: Prefilled) -> MedusaState:
    return MedusaState(hidden=pre.hidden)

  def propose(self, params, state: MedusaState, ctx: Context, key, *,
              sampling: SamplingParams, keep=None):
    del key, sampling, keep  # deterministic drafts
    tok = medusa_candidates(params, state.hidden, config=self.mc, tree=self.medusa_tree)
    parent, depth = static_tree(self.medusa_tree.parent, self.medusa_tree.depth, tok.shape[0])
    return Drafts(tokens=tok, parent=parent, depth=depth, bounds=self.bounds), state

  def commit(self, params, state: MedusaState, ctx: Context, drafts: Drafts, v) -> MedusaState:
    return MedusaState(hidden=v.hidden.astype(state.hidden.dtype))

  @property
  def head_rows(self) -> int:
    """LM-head rows the heads multiply per step: V (or the subset's K) per head."""
    return self.mc.num_heads * (self.subset_size or self.target_config.vocab_size)

  head_policy = staticmethod(medusa_projection)  # what the time split times as the head

  def drafter_calls(self):
    return [(1, self.mc.num_heads)]

  def drafter_body(self):
    """The heads' residual blocks on the target's hidden state (their LM-head part is
    `medusa_projection`); the cache argument is unused: the heads keep none."""
    mc = self.mc

    def body(dp, tokens, positions, cache):
      del positions, cache
      h = jnp.zeros(tokens.shape + (mc.hidden_size,), jnp.float32)
      return medusa_hidden(dp[MEDUSA_KEY], h, config=mc)

    return body, self.params, self.target_config

  def draft_width(self) -> int:
    return self.target_config.hidden_size


def medusa_choices_for(num_heads: int, top_k: int) -> list[list[int]]:
  """A simple full tree: every path of ranks < `top_k` down to depth `num_heads` (k + k^2 + ...
  nodes); Medusa's tuned sparse trees (e.g. `mc_sim_7b_63`) can be passed as they are."""
  n = sum(top_k ** d for d in range(1, num_heads + 1))
  if n > MAX_TREE_NODES:
    raise MedusaError(f"a full tree of top_k={top_k} ranks over {num_heads} heads has {n:,} "
                      f"nodes; one verification reads them all as one block: at most "
                      f"{MAX_TREE_NODES:,} (set depth, or pass a sparse `choices` list)")
  paths: list[list[int]] = [[]]
  out = []
  for _ in range(num_heads):
    paths = [p + [r] for p in paths for r in range(top_k)]
    out += paths
  return [list(p) for p in out]

