"""Blockwise vocabulary losses against dense computations."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vocabjax.train.losses import blockwise_logsumexp, label_ranks, vocab_cross_entropy


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


def test_label_ranks_match_a_sort():
  rs = np.random.RandomState(0)
  x, W = jnp.asarray(rs.randn(37, 4)), jnp.asarray(rs.randn(90, 4))
  y = jnp.asarray(rs.randint(0, 90, 37))
  s = np.asarray(x @ W.T)
  want = (s > s[np.arange(37), np.asarray(y)][:, None]).sum(1)
  np.testing.assert_array_equal(np.asarray(label_ranks(x, W, y, block=8)), want)
