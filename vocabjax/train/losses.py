"""Vocabulary losses that never hold an [X, V] logit array at once.

Letters: X rows, R feature width (a ranker's d', or D for an LM head), V vocabulary, Kt teacher
top tokens per row, C a chunk of the vocabulary (one block).

`blockwise_logsumexp(x[X, R], W[V, R])` = logsumexp(x W^T, axis=-1), computed over blocks of C
vocabulary rows with a running (max, sum) pair in a `lax.scan` whose body is rematerialized
(`jax.checkpoint`) when there is more than one block: forward and backward each hold one
[X, C] block. With `bf16=True` (a training step's `Lowering.bf16_dots`) the products are
mixed-precision ones (`cpu_matmul.bf16_dot`).

Cross-entropy against a hard label y:    lse(x W^T) - x . W[y]
Against a teacher's top-Kt distribution:  sum_t p_t (lse - x . W[ids_t])  (= KL(p || softmax) +
H(p); the teacher's probabilities are renormalized over its top Kt).
Against a teacher's whole distribution softmax(h Wt^T) over the same V rows (EAGLE-3's
distillation target, `soft_cross_entropy`): lse(x W^T) - sum_v p_v (x . W[v]), p_v =
exp(h . Wt[v] - lse(h Wt^T)), again one [X, C] block of each product at a time. When the
teacher's [X, V] probabilities fit in memory, `teacher_prob_blocks` computes them once (one
product) and `blocked_probs_cross_entropy` reads them block by block: one product of x with
W per block forward, two backward, against nine for `soft_cross_entropy` (EAGLE's
training-time test shares one teacher pass among its depths).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from vocabjax.kernels import cpu_matmul


def blockwise_logsumexp(x: jax.Array, W: jax.Array, *, block: int = 16384,
                        bf16: bool = False) -> jax.Array:
  """logsumexp over V of x[X, R] @ W[V, R]^T, in f32, one [X, block] tile at a time."""
  V, R = W.shape
  block = min(block, V)
  nb = -(-V // block)
  Wp = jnp.pad(W, ((0, nb * block - V), (0, 0))).reshape(nb, block, R)

  def body(carry, inp):
    m, s = carry
    b, Wb = inp
    z = _product(x, Wb, bf16)
    z = jnp.where((b * block + jnp.arange(block) < V)[None, :], z, -jnp.inf)
    m_new = jnp.maximum(m, z.max(axis=-1))
    s = s * jnp.exp(m - m_new) + jnp.exp(z - m_new[:, None]).sum(axis=-1)
    return (m_new, s), None

  X = x.shape[0]
  init = (jnp.full((X,), -jnp.inf, jnp.float32), jnp.zeros((X,), jnp.float32))
  if nb > 1:  # one block: recomputing it would cost a second product and save no memory
    body = jax.checkpoint(body)
  (m, s), _ = jax.lax.scan(body, init, (jnp.arange(nb), Wp))
  return m + jnp.log(s)


def _product(x, W, bf16: bool = False):
  """x[X, R] . W[C, R]^T in f32: XLA's dot, or with `bf16` `cpu_matmul.bf16_dot`."""
  if bf16:
    return cpu_matmul.bf16_dot(x, W)
  return jnp.einsum("XR,CR->XC", x, W, preferred_element_type=jnp.float32)


def picked_logits(x: jax.Array, W: jax.Array, ids: jax.Array) -> jax.Array:
  """x[n] . W[ids[n, ...]] for ids [X] or [X, Kt], f32."""
  rows = jnp.take(W, ids, axis=0)  # [X, (Kt,) R]
  if ids.ndim == 1:
    return jnp.einsum("XR,XR->X", x, rows, preferred_element_type=jnp.float32)
  return jnp.einsum("XR,XKR->XK", x, rows, preferred_element_type=jnp.float32)


def vocab_cross_entropy(x, W, labels, weights=None, *, teacher_ids=None, teacher_probs=None,
                        block: int = 16384, bf16: bool = False) -> jax.Array:
  """Mean cross-entropy of softmax(x W^T) against hard `labels` [X], or against the teacher's
  top-Kt distribution when `teacher_ids`/`teacher_probs` [X, Kt] are given; `weights` [X] masks
  or weighs rows (default: all 1)."""
  lse = blockwise_logsumexp(x, W, block=block, bf16=bf16)
  if teacher_ids is None:
    per_row = lse - picked_logits(x, W, labels)
  else:
    p = teacher_probs / jnp.maximum(teacher_probs.sum(-1, keepdims=True), 1e-30)
    per_row = jnp.sum(p * (lse[:, None] - picked_logits(x, W, teacher_ids)), axis=-1)
  if weights is None:
    return per_row.mean()
  return jnp.sum(per_row * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def soft_cross_entropy(x, W, h, Wt, weights=None, *, block: int = 16384,
                       bf16: bool = False) -> jax.Array:
  """Mean cross-entropy of softmax(x[X, R] W[V, R]^T) against the teacher's softmax(h[X, Rt]
  Wt[V, Rt]^T) over the same V rows (module doc); no gradient reaches h or Wt. `weights` [X]
  masks or weighs rows (default: all 1)."""
  V = W.shape[0]
  if Wt.shape[0] != V:
    raise ValueError(f"teacher rows {Wt.shape[0]} != student rows {V}")
  h, Wt = jax.lax.stop_gradient(h), jax.lax.stop_gradient(Wt)
  lse_q = blockwise_logsumexp(x, W, block=block, bf16=bf16)
  lse_t = blockwise_logsumexp(h, Wt, block=block, bf16=bf16)
  block = min(block, V)
  nb = -(-V // block)
  pad = lambda A: jnp.pad(A, ((0, nb * block - V), (0, 0))).reshape(nb, block, -1)  # noqa: E731

  def body(acc, inp):
    b, Wb, Wtb = inp
    valid = (b * block + jnp.arange(block) < V)[None, :]
    p = jnp.where(valid, jnp.exp(_product(h, Wtb, bf16) - lse_t[:, None]), 0.0)
    return acc + jnp.sum(p * jnp.where(valid, _product(x, Wb, bf16), 0.0), axis=-1), None

  if nb > 1:
    body = jax.checkpoint(body)
  expected, _ = jax.lax.scan(body, jnp.zeros(x.shape[:1], jnp.float32),
                             (jnp.arange(nb), pad(W), pad(Wt)))
  per_row = lse_q - expected
  if weights is None:
    return per_row.mean()
  return jnp.sum(per_row * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def teacher_prob_blocks(h: jax.Array, Wt: jax.Array, *, block: int = 16384,
                        bf16: bool = False) -> jax.Array:
  """The teacher's distribution softmax(h[X, Rt] Wt[V, Rt]^T), f32, computed once and laid out
  in vocabulary blocks [nb, X, C] (C = min(block, V), zeros past V): what
  `blocked_probs_cross_entropy` reads. No gradient reaches h or Wt. Holds [X, V] a few times
  over while it runs: for X * V in the hundreds of millions, not more."""
  h, Wt = jax.lax.stop_gradient(h), jax.lax.stop_gradient(Wt)
  V = Wt.shape[0]
  C = min(block, V)
  nb = -(-V // C)
  p = jax.nn.softmax(_product(h, Wt, bf16), axis=-1)
  p = jnp.pad(p, ((0, 0), (0, nb * C - V)))
  return p.reshape(h.shape[0], nb, C).transpose(1, 0, 2)


def blocked_probs_cross_entropy(x, W, prob_blocks, weights=None, *,
                                bf16: bool = False) -> jax.Array:
  """Mean cross-entropy of softmax(x[X, R] W[V, R]^T) against a distribution given in
  vocabulary blocks `prob_blocks` [nb, X, C] (`teacher_prob_blocks`; no gradient reaches it):
  per row lse(x W^T) - sum_v p_v (x . W[v]), both from ONE [X, C] product per block (a running
  (max, sum) pair for the lse), so forward and backward cost 3 products of x with W in all, where
  `soft_cross_entropy` costs 9 (it recomputes the teacher's products too). `weights` [X] masks
  or weighs rows (default: all 1)."""
  V, R = W.shape
  nb, X, C = prob_blocks.shape
  if X != x.shape[0] or not (nb - 1) * C < V <= nb * C:
    raise ValueError(f"prob_blocks {prob_blocks.shape} do not fit x {x.shape} and W {W.shape}: "
                     f"expected [nb, {x.shape[0]}, C] with nb * C >= {V} > (nb - 1) * C")
  prob_blocks = jax.lax.stop_gradient(prob_blocks)
  Wp = jnp.pad(W, ((0, nb * C - V), (0, 0))).reshape(nb, C, R)

  def body(carry, inp):
    m, s, acc = carry
    b, Wb, pb = inp
    z = _product(x, Wb, bf16)
    valid = (b * C + jnp.arange(C) < V)[None, :]
    zm = jnp.where(valid, z, -jnp.inf)
    m_new = jnp.maximum(m, zm.max(axis=-1))
    s = s * jnp.exp(m - m_new) + jnp.exp(zm - m_new[:, None]).sum(axis=-1)
    acc = acc + jnp.sum(pb * jnp.where(valid, z, 0.0), axis=-1)
    return (m_new, s, acc), None

  init = (jnp.full((X,), -jnp.inf, jnp.float32), jnp.zeros((X,), jnp.float32),
          jnp.zeros((X,), jnp.float32))
  if nb > 1:  # one block: recomputing it would cost a second product and save no memory
    body = jax.checkpoint(body)
  (m, s, acc), _ = jax.lax.scan(body, init, (jnp.arange(nb), Wp, prob_blocks))
  per_row = m + jnp.log(s) - acc
  if weights is None:
    return per_row.mean()
  return jnp.sum(per_row * weights) / jnp.maximum(jnp.sum(weights), 1.0)


@functools.partial(jax.jit, static_argnames=("block",))
def label_ranks(x, W, labels, *, block: int = 1024):
  """Rank of each label among the scores x W^T (0 = top; ties counted in the label's favour),
  computed in row blocks so at most [block, V] scores exist at once."""
  X = x.shape[0]
  nb = -(-X // block)
  xp = jnp.pad(x, ((0, nb * block - X), (0, 0))).reshape(nb, block, -1)
  lp = jnp.pad(labels, (0, nb * block - X)).reshape(nb, block)

  def one(args):
    xb, lb = args
    s = jnp.einsum("XR,VR->XV", xb, W, preferred_element_type=jnp.float32)
    own = jnp.take_along_axis(s, lb[:, None], axis=1)
    return jnp.sum(s > own, axis=1)

  return jax.lax.map(one, (xp, lp)).reshape(-1)[:X]
