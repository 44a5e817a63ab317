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


def _vocab_blocks(A: jax.Array, C: int) -> jax.Array:
  """A[V, ...] zero-padded to a multiple of C rows and laid out as [nb, C, ...]."""
  V = A.shape[0]
  nb = -(-V // C)
  return jnp.pad(A, ((0, nb * C - V),) + ((0, 0),) * (A.ndim - 1)).reshape(nb, C, *A.shape[1:])


def _valid(b, C: int, V: int) -> jax.Array:
  """[1, C] mask of block b's rows that lie inside the vocabulary (the last block is padded)."""
  return (b * C + jnp.arange(C) < V)[None, :]


def _lse_init(X: int):
  return jnp.full((X,), -jnp.inf, jnp.float32), jnp.zeros((X,), jnp.float32)


def _lse_step(m, s, z, valid):
  """One block's update of the running (max, sum of exp) pair over the block's valid columns."""
  z = jnp.where(valid, z, -jnp.inf)
  m_new = jnp.maximum(m, z.max(axis=-1))
  return m_new, s * jnp.exp(m - m_new) + jnp.exp(z - m_new[:, None]).sum(axis=-1)


def _scan_blocks(body, init, xs, nb: int):
  """lax.scan over vocabulary blocks, the body rematerialized when there is more than one (one
  block: recomputing it would cost a second product and save no memory)."""
  return jax.lax.scan(jax.checkpoint(body) if nb > 1 else body, init, xs)


def _mean(per_row, weights):
  """Mean over rows, or weighed by `weights` [X] (a 0/1 mask or weights)."""
  if weights is None:
    return per_row.mean()
  return jnp.sum(per_row * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def blockwise_logsumexp(x: jax.Array, W: jax.Array, *, block: int = 16384,
                        bf16: bool = False) -> jax.Array:
  """logsumexp over V of x[X, R] @ W[V, R]^T, in f32, one [X, block] tile at a time."""
  V = W.shape[0]
  C = min(block, V)
  Wp = _vocab_blocks(W, C)

  def body(carry, inp):
    b, Wb = inp
    return _lse_step(*carry, _product(x, Wb, bf16), _valid(b, C, V)), None

  (m, s), _ = _scan_blocks(body, _lse_init(x.shape[0]), (jnp.arange(len(Wp)), Wp), len(Wp))
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
  return _mean(per_row, weights)


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
  C = min(block, V)
  Wp, Wtp = _vocab_blocks(W, C), _vocab_blocks(Wt, C)

  def body(acc, inp):
    b, Wb, Wtb = inp
    valid = _valid(b, C, V)
    p = jnp.where(valid, jnp.exp(_product(h, Wtb, bf16) - lse_t[:, None]), 0.0)
    return acc + jnp.sum(p * jnp.where(valid, _product(x, Wb, bf16), 0.0), axis=-1), None

  expected, _ = _scan_blocks(body, jnp.zeros(x.shape[:1], jnp.float32),
                             (jnp.arange(len(Wp)), Wp, Wtp), len(Wp))
  return _mean(lse_q - expected, weights)


def teacher_prob_blocks(h: jax.Array, Wt: jax.Array, *, block: int = 16384,
                        bf16: bool = False) -> jax.Array:
  """The teacher's distribution softmax(h[X, Rt] Wt[V, Rt]^T), f32, computed once and laid out
  in vocabulary blocks [nb, X, C] (C = min(block, V), zeros past V): what
  `blocked_probs_cross_entropy` reads. No gradient reaches h or Wt. Holds [X, V] a few times
  over while it runs: for X * V in the hundreds of millions, not more."""
  h, Wt = jax.lax.stop_gradient(h), jax.lax.stop_gradient(Wt)
  C = min(block, Wt.shape[0])
  p = jax.nn.softmax(_product(h, Wt, bf16), axis=-1)
  return _vocab_blocks(p.T, C).transpose(0, 2, 1)


def blocked_probs_cross_entropy(x, W, prob_blocks, weights=None, *,
                                bf16: bool = False) -> jax.Array:
  """Mean cross-entropy of softmax(x[X, R] W[V, R]^T) against a distribution given in
  vocabulary blocks `prob_blocks` [nb, X, C] (`teacher_prob_blocks`; no gradient reaches it):
  per row lse(x W^T) - sum_v p_v (x . W[v]), both from ONE [X, C] product per block (a running
  (max, sum) pair for the lse), so forward and backward cost 3 products of x with W in all, where
  `soft_cross_entropy` costs 9 (it recomputes the teacher's products too). `weights` [X] masks
  or weighs rows (default: all 1)."""
  V = W.shape[0]
  nb, X, C = prob_blocks.shape
  if X != x.shape[0] or not (nb - 1) * C < V <= nb * C:
    raise ValueError(f"prob_blocks {prob_blocks.shape} do not fit x {x.shape} and W {W.shape}: "
                     f"expected [nb, {x.shape[0]}, C] with nb * C >= {V} > (nb - 1) * C")
  prob_blocks = jax.lax.stop_gradient(prob_blocks)
  Wp = _vocab_blocks(W, C)

  def body(carry, inp):
    m, s, acc = carry
    b, Wb, pb = inp
    z = _product(x, Wb, bf16)
    valid = _valid(b, C, V)
    m, s = _lse_step(m, s, z, valid)
    return (m, s, acc + jnp.sum(pb * jnp.where(valid, z, 0.0), axis=-1)), None

  init = (*_lse_init(X), jnp.zeros((X,), jnp.float32))
  (m, s, acc), _ = _scan_blocks(body, init, (jnp.arange(nb), Wp, prob_blocks), nb)
  return _mean(m + jnp.log(s) - acc, weights)


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
