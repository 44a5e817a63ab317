"""The indexed LM head: reference against numpy, the GPU (Triton) and TPU (Mosaic) kernels in
interpret mode against the reference, lowering for CUDA and TPU, the custom VJP, input checks."""

import jax
from jax.test_util import check_grads
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.kernels.indexed_lm_head import (indexed_lm_head, indexed_lm_head_gpu,
                                              indexed_lm_head_reference, indexed_lm_head_tpu)


def _inputs(B, D, V, K, dtype, seed=0):
  rs = np.random.RandomState(seed + B * 100 + K)
  h = rs.randn(B, D).astype(np.float32)
  U = rs.randn(V, D).astype(np.float32)
  idx = rs.randint(0, V, (B, K))
  idx[0, 0] = V - 1  # the last row
  idx[:, -1] = idx[:, 0]  # a repeated index
  return jnp.asarray(h, dtype), jnp.asarray(U, dtype), jnp.asarray(idx, jnp.int32)


def _numpy(h, U, idx):
  h32, U32 = np.asarray(h.astype(jnp.float32)), np.asarray(U.astype(jnp.float32))
  return np.einsum("bkd,bd->bk", U32[np.asarray(idx)], h32)


@pytest.mark.parametrize("B,D,V,K", [(1, 16, 50, 7), (4, 32, 300, 130), (3, 8, 10, 10)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_reference_matches_numpy_incl_repeated_indices(B, D, V, K, dtype):
  h, U, idx = _inputs(B, D, V, K, dtype)
  got = indexed_lm_head_reference(h, U, idx)
  assert got.dtype == jnp.float32 and got.shape == (B, K)
  np.testing.assert_allclose(np.asarray(got), _numpy(h, U, idx), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(got)[:, -1], np.asarray(got)[:, 0], rtol=1e-6)


# K not a multiple of the block, D not a multiple of the GPU's block_d (=128 by default), B = 1
@pytest.mark.parametrize("B,D,V,K", [(1, 128, 300, 64), (2, 200, 1000, 300), (5, 96, 77, 130)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_kernel_interpret_matches_reference(B, D, V, K, dtype):
  h, U, idx = _inputs(B, D, V, K, dtype)
  got = indexed_lm_head_gpu(h, U, idx, interpret=True)
  assert got.dtype == jnp.float32 and got.shape == (B, K)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(got), np.asarray(indexed_lm_head_reference(h, U, idx)),
                             rtol=tol, atol=tol * D ** 0.5)


@pytest.mark.parametrize("B,D,V,K", [(1, 128, 300, 128), (2, 256, 1000, 300), (3, 128, 90, 5)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tpu_kernel_interpret_matches_reference(B, D, V, K, dtype):
  h, U, idx = _inputs(B, D, V, K, dtype)
  got = indexed_lm_head_tpu(h, U, idx, interpret=True, block_k=128)
  assert got.dtype == jnp.float32 and got.shape == (B, K)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(got), np.asarray(indexed_lm_head_reference(h, U, idx)),
                             rtol=tol, atol=tol * D ** 0.5)


@pytest.mark.parametrize("fn", [indexed_lm_head_gpu, indexed_lm_head_tpu])
def test_kernels_clamp_traced_out_of_range_indices(fn):
  # under jit the values are unknown to the host check: the kernel clamps, never reads past V
  h, U, idx = _inputs(2, 128, 40, 3, jnp.float32)
  bad = idx.at[0, 1].set(40).at[1, 2].set(-5)
  got = jax.jit(lambda a, b, c: fn(a, b, c, interpret=True))(h, U, bad)
  want = _numpy(h, U, np.clip(np.asarray(bad), 0, 39))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("platform,fn", [("cuda", indexed_lm_head_gpu),
                                         ("tpu", indexed_lm_head_tpu),
                                         ("cuda", indexed_lm_head), ("tpu", indexed_lm_head)])
def test_kernels_lower_for_their_platform(platform, fn):
  # Qwen2.5-0.5B's head shape in bf16: the Triton / Mosaic lowering runs on this CPU machine
  h = jax.ShapeDtypeStruct((10, 896), jnp.bfloat16)
  U = jax.ShapeDtypeStruct((151936, 896), jnp.bfloat16)
  idx = jax.ShapeDtypeStruct((10, 2048), jnp.int32)
  text = jax.jit(fn).trace(h, U, idx).lower(lowering_platforms=(platform,)).as_text()
  assert ("triton" if platform == "cuda" else "tpu_custom_call") in text


def test_dispatcher_uses_reference_on_cpu_and_forced_impls_agree():
  h, U, idx = _inputs(3, 128, 200, 50, jnp.float32)
  want = np.asarray(indexed_lm_head_reference(h, U, idx))
  np.testing.assert_array_equal(np.asarray(jax.jit(indexed_lm_head)(h, U, idx)), want)
  for impl in ("gpu", "tpu"):
    got = indexed_lm_head(h, U, idx, impl=impl, interpret=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
  with pytest.raises(ValueError, match="impl='cuda' is not one of"):
    indexed_lm_head(h, U, idx, impl="cuda")


@pytest.mark.parametrize("impl", ["reference", "gpu"])
def test_custom_vjp_matches_autodiff_of_dense_logits(impl):
  h, U, idx = _inputs(3, 24, 40, 9, jnp.float32)
  w = jnp.asarray(np.random.RandomState(1).randn(3, 9), jnp.float32)

  def loss(h, U):
    return jnp.sum(w * jnp.tanh(indexed_lm_head(h, U, idx, impl=impl, interpret=True)))

  def dense(h, U):  # the same function through a full matmul and a gather of its logits
    return jnp.sum(w * jnp.tanh(jnp.take_along_axis(h @ U.T, idx, axis=1)))

  gh, gU = jax.grad(loss, argnums=(0, 1))(h, U)
  eh, eU = jax.grad(dense, argnums=(0, 1))(h, U)
  np.testing.assert_allclose(np.asarray(gh), np.asarray(eh), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(gU), np.asarray(eU), rtol=1e-4, atol=1e-5)
  assert np.abs(np.asarray(gU)).sum(axis=1)[np.setdiff1d(np.arange(40), idx)].max() == 0
  check_grads(lambda h, U: indexed_lm_head(h, U, idx, impl=impl, interpret=True),
                            (h, U), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)


def test_bad_inputs():
  h, U = jnp.ones((2, 4)), jnp.ones((10, 4))
  for fn in (indexed_lm_head_reference, indexed_lm_head):
    with pytest.raises(ValueError, match="index 10 is outside the vocabulary"):
      fn(h, U, jnp.asarray([[1, 10], [0, 2]]))
    with pytest.raises(ValueError, match="index -1"):
      fn(h, U, jnp.asarray([[1, -1], [0, 2]]))
    with pytest.raises(ValueError, match=r"hidden size of h \(4\) differs"):
      fn(h, jnp.ones((10, 5)), jnp.zeros((2, 1), jnp.int32))
    with pytest.raises(ValueError, match="idx has 3 rows"):
      fn(h, U, jnp.zeros((3, 1), jnp.int32))
  with pytest.raises(ValueError, match="block_k=100 must be a multiple of 128"):
    indexed_lm_head_tpu(h, U, jnp.zeros((2, 1), jnp.int32), block_k=100, interpret=True)
  # under jit the index check is skipped (no concrete values), the shapes are still checked
  f = jax.jit(indexed_lm_head_reference)
  assert f(h, U, jnp.zeros((2, 3), jnp.int32)).shape == (2, 3)
