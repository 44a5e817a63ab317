"""Vocabulary losses that never hold a [N, V] logit array at once.

Letters: N rows, R feature width (a ranker's d', or D for an LM head), V vocabulary, T teacher
top tokens per row, C vocabulary block.

`blockwise_logsumexp(x[N, R], W[V, R])` = logsumexp(x W^T, axis=-1), computed over blocks of C
vocabulary rows with a running (max, sum) pair in a `lax.scan` whose body is rematerialized
(`jax.checkpoint`): forward and backward each hold one [N, C] block.

Cross-entropy against a hard label y:    lse(x W^T) - x . W[y]
Against a teacher's top-T distribution:  sum_t p_t (lse - x . W[ids_t])  (= KL(p || softmax) +
H(p); the teacher's probabilities are renormalized over its top T).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def blockwise_logsumexp(x: jax.Array, W: jax.Array, *, block: int = 16384) -> jax.Array:
  """logsumexp over V of x[N, R] @ W[V, R]^T, in f32, one [N, block] tile at a time."""
  V, R = W.shape
  block = min(block, V)
  nb = -(-V // block)
  Wp = jnp.pad(W, ((0, nb * block - V), (0, 0))).reshape(nb, block, R)

  @jax.checkpoint
  def body(carry, inp):
    m, s = carry
    b, Wb = inp
    z = jnp.einsum("NR,CR->NC", x, Wb, preferred_element_type=jnp.float32)
    z = jnp.where((b * block + jnp.arange(block) < V)[None, :], z, -jnp.inf)
    m_new = jnp.maximum(m, z.max(axis=-1))
    s = s * jnp.exp(m - m_new) + jnp.exp(z - m_new[:, None]).sum(axis=-1)
    return (m_new, s), None

  N = x.shape[0]
  init = (jnp.full((N,), -jnp.inf, jnp.float32), jnp.zeros((N,), jnp.float32))
  (m, s), _ = jax.lax.scan(body, init, (jnp.arange(nb), Wp))
  return m + jnp.log(s)


def picked_logits(x: jax.Array, W: jax.Array, ids: jax.Array) -> jax.Array:
  """x[n] . W[ids[n, ...]] for ids [N] or [N, T], f32."""
  rows = jnp.take(W, ids, axis=0)  # [N, (T,) R]
  if ids.ndim == 1:
    return jnp.einsum("NR,NR->N", x, rows, preferred_element_type=jnp.float32)
  return jnp.einsum("NR,NTR->NT", x, rows, preferred_element_type=jnp.float32)


def vocab_cross_entropy(x, W, labels, weights=None, *, teacher_ids=None, teacher_probs=None,
                        block: int = 16384) -> jax.Array:
  """Mean cross-entropy of softmax(x W^T) against hard `labels` [N], or against the teacher's
  top-T distribution when `teacher_ids`/`teacher_probs` [N, T] are given; `weights` [N] masks
  or weighs rows (default: all 1)."""
  lse = blockwise_logsumexp(x, W, block=block)
  if teacher_ids is None:
    per_row = lse - picked_logits(x, W, labels)
  else:
    p = teacher_probs / jnp.maximum(teacher_probs.sum(-1, keepdims=True), 1e-30)
    per_row = jnp.sum(p * (lse[:, None] - picked_logits(x, W, teacher_ids)), axis=-1)
  if weights is None:
    return per_row.mean()
  return jnp.sum(per_row * weights) / jnp.maximum(jnp.sum(weights), 1.0)


@functools.partial(jax.jit, static_argnames=("block",))
def label_ranks(x, W, labels, *, block: int = 1024):
  """Rank of each label among the scores x W^T (0 = top; ties counted in the label's favour),
  computed in row blocks so at most [block, V] scores exist at once."""
  N = x.shape[0]
  nb = -(-N // block)
  xp = jnp.pad(x, ((0, nb * block - N), (0, 0))).reshape(nb, block, -1)
  lp = jnp.pad(labels, (0, nb * block - N)).reshape(nb, block)

  def one(args):
    xb, lb = args
    s = jnp.einsum("NR,VR->NV", xb, W, preferred_element_type=jnp.float32)
    own = jnp.take_along_axis(s, lb[:, None], axis=1)
    return jnp.sum(s > own, axis=1)

  return jax.lax.map(one, (xp, lp)).reshape(-1)[:N]
