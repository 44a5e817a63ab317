"""Adaptive draft length (SpecDec++, Huang et al. 2024): an acceptance-prediction head.

Letters: D drafter hidden size, F head width (its MLP's hidden width), G drafts.

The head reads what the drafter knows when it proposes token x: its final hidden state h (the
one the LM head turned into q) and x's input embedding e(x), and predicts the probability that
the target accepts x given that every earlier draft of the block was accepted:

    a = sigmoid(w2 . relu(W1 [h; e(x)] + b1) + b2)

Drafting stops after draft i when P(at least one rejection among drafts 1..i) =
1 - prod_j a_j exceeds a threshold (SpecDec++ eq. 5 with its stopping rule), so easy stretches
get long blocks and hard ones short blocks. Training labels are min(1, p(x) / q(x)), the
acceptance probability of speculative sampling, with a weighted BCE that up-weights rejections
(rare when the drafter is good): `vocabjax.train.distill.losses.acceptance_terms`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def init_acceptance_head(key: jax.Array, hidden_size: int, width: int = 256,
                         dtype=jnp.float32) -> dict:
  """Random head for a drafter of hidden size D; the output bias starts at +2 (a ~ 0.88), so an
  untrained head drafts long blocks rather than stopping at once."""
  k1, k2 = jax.random.split(key)
  D = hidden_size
  return {"w1": (jax.random.normal(k1, (2 * D, width)) / np.sqrt(2 * D)).astype(dtype),
          "b1": jnp.zeros((width,), dtype),
          "w2": (jax.random.normal(k2, (width,)) / np.sqrt(width) * 0.1).astype(dtype),
          "b2": jnp.asarray(2.0, dtype)}


def acceptance_logit(head: dict, h: jax.Array, e: jax.Array) -> jax.Array:
  """Logit of acceptance: h [..., D] the drafter's hidden state, e [..., D] the proposed token's
  input embedding -> [...] (f32)."""
  x = jnp.concatenate([h, e], axis=-1).astype(jnp.float32)
  z = jax.nn.relu(x @ head["w1"].astype(jnp.float32) + head["b1"].astype(jnp.float32))
  return z @ head["w2"].astype(jnp.float32) + head["b2"].astype(jnp.float32)


def should_stop(p_all_accepted: jax.Array, threshold: float) -> jax.Array:
  """SpecDec++'s stopping rule: stop when P(at least one rejection) = 1 - P(all accepted)
  exceeds `threshold`."""
  return (1.0 - p_all_accepted) > threshold


def check_threshold(threshold: float) -> None:
  if not 0.0 < threshold < 1.0:
    raise ValueError(f"the adaptive stop threshold must be in (0, 1), got {threshold=}")
