"""Low-rank draft LM head (SlimSpec, Plaksin et al. 2026, arXiv 2605.10453): the drafter's head
U [V, D] replaced by two factors, every token still a candidate.

Letters: D drafter hidden size, R rank, V vocabulary.

    z = W_up (W_down h)        W_down [R, D], W_up [V, R]:  R*D + V*R multiply-adds, not V*D

The drafting law is softmax(z) over all V tokens (no shortlist, no per-step state, nothing a
token can fall out of); the target verifies with its own full head, so output is exactly the
target's whatever the factors are, and only acceptance depends on how well z tracks the head.
SlimSpec trains the factors with the drafter (forward KL to the target; rank D/8 recommended).
In vocabjax the factors are a ranker file (`vocabjax.vocab.ranked.Ranker`: `down` = W_down,
`vocab` = W_up, with the drafter's identity), so the same two ways make them: `svd_ranker`
(the head's best rank-R approximation, no data) and `python -m vocabjax.train.ranker` in frozen
mode (cross-entropy to the target's tokens, or `loss: kl` to its top-Kt distribution, from the
SVD start). SpecVocab uses such factors to rank candidates and then computes exact logits for
the top k; SlimSpec uses them as the head itself.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.vocab.policy import policy_state, require_float_head, with_policy_state
from vocabjax.vocab.ranked import Ranker, RankerError, ranker_scores


@dataclasses.dataclass(frozen=True)
class LowRankHead:
  """A drafter vocabulary policy: the head W_up W_down of `factors` (module doc)."""

  factors: Ranker

  @property
  def size(self) -> int:  # every token is a candidate
    return self.factors.vocab_size

  @property
  def head_rows(self) -> int:  # cost in D-wide head rows: (V*R + R*D) / D, rounded up
    f = self.factors
    return -(-(f.vocab_size * f.rank + f.rank * f.hidden_size) // f.hidden_size)

  def attach(self, params: dict, config: LlamaLikeConfig, mesh=None):
    """(params with the factors beside them, the policy). The factors are checked against the
    drafter (its hidden size, vocabulary, layers and LM-head fingerprint)."""
    del mesh  # the factors are replicated (V*R values: an eighth of the head at R = D/8)
    require_float_head(params, RankerError, "low-rank head factors are matched to their "
                       "drafter's float LM head (by fingerprint)")
    self.factors.check_drafter(params, config)
    dtype = lm_head_weight(params, config).dtype
    return (with_policy_state(params, {"down": jnp.asarray(self.factors.down, dtype),
                                       "vocab": jnp.asarray(self.factors.vocab, dtype)}),
            low_rank_policy)


def low_rank_policy(params: dict, h: jax.Array) -> tuple[None, jax.Array]:
  """(None: every token, logits [..., V] = W_up (W_down h), f32 accumulation)."""
  return None, ranker_scores(policy_state(params), h)
