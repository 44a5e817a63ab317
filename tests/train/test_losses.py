"""Blockwise vocabulary losses against dense computations."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vocabjax.train.losses import (blocked_probs_cross_entropy, blockwise_logsumexp,
                                   label_ranks, soft_cross_entropy, teacher_prob_blocks,
                                   vocab_cross_entropy)


@pytest.mark.extended
@pytest.mark.parametrize("V,block", [(50, 16), (64, 64), (70, 1000)])
def test_blockwise_losses_match_dense(V, block):
  rs = np.random.RandomState(V)
  x = jnp.asarray(rs.randn(9, 5), jnp.float32)
  W = jnp.asarray(rs.randn(V, 5), jnp.float32)
  y = jnp.asarray(rs.randint(0, V, 9))
  ids = jnp.asarray(np.stack([rs.choice(V, 4, replace=False) for _ in range(9)]))
  p = jnp.asarray(rs.dirichlet(np.ones(4), 9), jnp.float32)
  w = jnp.asarray((rs.rand(9) > 0.3).astype(np.float32))
  dense = x @ W.T
  np.testing.assert_allclose(blockwise_logsumexp(x, W, block=block),
                             jax.nn.logsumexp(dense, -1), rtol=1e-5)

  def ce_dense(x, W):
    per = optax.softmax_cross_entropy_with_integer_labels(x @ W.T, y)
    return jnp.sum(per * w) / jnp.sum(w)

  def kl_dense(x, W):
    lp = jax.nn.log_softmax(x @ W.T, -1)
    return -jnp.mean(jnp.sum(p * jnp.take_along_axis(lp, ids, -1), -1))

  for got_f, want_f in [
      (lambda x, W: vocab_cross_entropy(x, W, y, w, block=block), ce_dense),
      (lambda x, W: vocab_cross_entropy(x, W, None, teacher_ids=ids, teacher_probs=p,
                                        block=block), kl_dense)]:
    np.testing.assert_allclose(got_f(x, W), want_f(x, W), rtol=1e-5)
    for g, e in zip(jax.grad(got_f, (0, 1))(x, W), jax.grad(want_f, (0, 1))(x, W)):
      np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("V,block", [(50, 16), (64, 64), (70, 1000)])
def test_soft_cross_entropy_matches_dense(V, block):
  """The teacher's whole distribution softmax(h Wt^T) (ragged last block included): the loss
  and its gradients equal the dense ones, and none reaches the teacher."""
  rs = np.random.RandomState(V + 1)
  x, W = jnp.asarray(rs.randn(9, 5), jnp.float32), jnp.asarray(rs.randn(V, 5), jnp.float32)
  h, Wt = jnp.asarray(rs.randn(9, 7), jnp.float32), jnp.asarray(rs.randn(V, 7), jnp.float32)
  w = jnp.asarray((rs.rand(9) > 0.3).astype(np.float32))

  def dense(x, W, h, Wt):
    p = jax.nn.softmax(jax.lax.stop_gradient(h @ Wt.T), -1)
    per = -jnp.sum(p * jax.nn.log_softmax(x @ W.T, -1), -1)
    return jnp.sum(per * w) / jnp.sum(w)

  got = lambda *a: soft_cross_entropy(*a, w, block=block)  # noqa: E731
  np.testing.assert_allclose(got(x, W, h, Wt), dense(x, W, h, Wt), rtol=1e-5)
  gs, es = jax.grad(got, (0, 1, 2, 3))(x, W, h, Wt), jax.grad(dense, (0, 1))(x, W, h, Wt)
  for g, e in zip(gs[:2], es):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
  assert not np.any(gs[2]) and not np.any(gs[3])
  # the same teacher computed once, in vocabulary blocks (ragged last block: zeros past V)
  pb = teacher_prob_blocks(h, Wt, block=block)
  C = min(block, V)
  assert pb.shape == (-(-V // C), 9, C)
  np.testing.assert_allclose(pb.transpose(1, 0, 2).reshape(9, -1)[:, :V],
                             jax.nn.softmax(h @ Wt.T, -1), rtol=1e-5, atol=1e-7)
  assert not np.any(pb.transpose(1, 0, 2).reshape(9, -1)[:, V:])
  given = lambda x, W, pb: blocked_probs_cross_entropy(x, W, pb, w)  # noqa: E731
  np.testing.assert_allclose(given(x, W, pb), dense(x, W, h, Wt), rtol=1e-5)
  gp = jax.grad(given, (0, 1, 2))(x, W, pb)
  for g, e in zip(gp[:2], es):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
  assert not np.any(gp[2])
  assert not np.any(jax.grad(lambda h: teacher_prob_blocks(h, Wt, block=block).sum())(h))
  with pytest.raises(ValueError, match="teacher rows 3 != student rows"):
    soft_cross_entropy(x, W, h, Wt[:3])
  with pytest.raises(ValueError, match=r"prob_blocks .* do not fit x \(9, 5\)"):
    blocked_probs_cross_entropy(x, W, pb[:, :4], w)
  if pb.shape[0] > 1:
    with pytest.raises(ValueError, match=f"nb \\* C >= {V}"):
      blocked_probs_cross_entropy(x, W, pb[:-1], w)


def test_label_ranks_match_a_sort():
  rs = np.random.RandomState(0)
  x, W = jnp.asarray(rs.randn(37, 4)), jnp.asarray(rs.randn(90, 4))
  y = jnp.asarray(rs.randint(0, 90, 37))
  s = np.asarray(x @ W.T)
  want = (s > s[np.arange(37), np.asarray(y)][:, None]).sum(1)
  np.testing.assert_array_equal(np.asarray(label_ranks(x, W, y, block=8)), want)
