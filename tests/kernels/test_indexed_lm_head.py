"""The indexed LM head reference against numpy, and its input checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.kernels.indexed_lm_head import indexed_lm_head_reference


@pytest.mark.parametrize("B,D,V,K", [(1, 16, 50, 7), (4, 32, 300, 130), (3, 8, 10, 10)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matches_numpy_incl_repeated_indices(B, D, V, K, dtype):
  rs = np.random.RandomState(B * 100 + K)
  h = rs.randn(B, D).astype(np.float32)
  U = rs.randn(V, D).astype(np.float32)
  idx = rs.randint(0, V, (B, K))
  idx[:, -1] = idx[:, 0]  # a repeated index
  got = indexed_lm_head_reference(jnp.asarray(h, dtype), jnp.asarray(U, dtype), jnp.asarray(idx))
  assert got.dtype == jnp.float32 and got.shape == (B, K)
  h32 = np.asarray(jnp.asarray(h, dtype).astype(jnp.float32))
  U32 = np.asarray(jnp.asarray(U, dtype).astype(jnp.float32))
  want = np.einsum("bkd,bd->bk", U32[idx], h32)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(got)[:, -1], np.asarray(got)[:, 0], rtol=1e-6)


def test_bad_inputs():
  h, U = jnp.ones((2, 4)), jnp.ones((10, 4))
  with pytest.raises(ValueError, match="index 10 is outside the vocabulary"):
    indexed_lm_head_reference(h, U, jnp.asarray([[1, 10], [0, 2]]))
  with pytest.raises(ValueError, match="index -1"):
    indexed_lm_head_reference(h, U, jnp.asarray([[1, -1], [0, 2]]))
  with pytest.raises(ValueError, match=r"hidden size of h \(4\) differs"):
    indexed_lm_head_reference(h, jnp.ones((10, 5)), jnp.zeros((2, 1), jnp.int32))
  with pytest.raises(ValueError, match="idx has 3 rows"):
    indexed_lm_head_reference(h, U, jnp.zeros((3, 1), jnp.int32))
  # under jit the index check is skipped (no concrete values), the shapes are still checked
  f = jax.jit(indexed_lm_head_reference)
  assert f(h, U, jnp.zeros((2, 3), jnp.int32)).shape == (2, 3)
