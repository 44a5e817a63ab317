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


# K = 300: three blocks of 128 per row (the double buffer's prefetch and slot reuse), the last
# padded; V odd: in bf16 the last row (idx[0, 0] = V - 1) has no pair partner (the XLA tail);
# V = 1 in bf16: no complete pair at all
@pytest.mark.extended(params=["bfloat16-2-128-77-300", "bfloat16-2-256-1000-300",
    "bfloat16-3-128-90-5", "float32-2-256-1000-300", "float32-1-128-300-128"])
@pytest.mark.parametrize("B,D,V,K", [(1, 128, 300, 128), (2, 256, 1000, 300), (3, 128, 90, 5),
                                     (2, 128, 77, 300), (2, 128, 1, 3)])
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


def test_tpu_kernel_clamps_traced_indices_bf16_odd_vocab():
  # bf16 DMAs whole row pairs: V - 1 (clamped from V + 3) is the unpaired last row, -5 -> 0
  h, U, idx = _inputs(2, 128, 41, 130, jnp.bfloat16)
  bad = idx.at[0, 1].set(44).at[1, 2].set(-5).at[1, 129].set(39)
  got = jax.jit(lambda a, b, c: indexed_lm_head_tpu(a, b, c, block_k=128, interpret=True))(
      h, U, bad)
  want = _numpy(h, U, np.clip(np.asarray(bad), 0, 40))
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-2, atol=2e-2 * 128 ** 0.5)


@pytest.mark.parametrize("platform,fn", [("cuda", indexed_lm_head_gpu),
                                         ("tpu", indexed_lm_head_tpu),
                                         ("tpu", indexed_lm_head)])
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


def _lowered_for_cuda(B=10, D=896, K=2048, dtype=jnp.bfloat16):
  # the table is read when a program is traced (fixed for a process in real use): the tests
  # below change it between traces, so the trace caches go
  jax.clear_caches()
  h = jax.ShapeDtypeStruct((B, D), dtype)
  U = jax.ShapeDtypeStruct((151936, D), dtype)
  idx = jax.ShapeDtypeStruct((B, K), jnp.int32)
  return jax.jit(indexed_lm_head).trace(h, U, idx).lower(lowering_platforms=("cuda",)).as_text()


def test_gpu_dispatch_follows_the_measured_table(monkeypatch):
  """impl="auto" on CUDA: XLA's gather where nothing was measured (or XLA won), the Triton
  kernel with the table's blocks where the kernel won this device kind's bucket."""
  from vocabjax.kernels import dispatch

  monkeypatch.setattr(dispatch, "gpu_device_kind", lambda: "Fake GPU")
  monkeypatch.setattr(dispatch, "load_table", lambda path=None: ())
  assert "triton" not in _lowered_for_cuda()
  win = {"device_kind": "Fake GPU", "dtype": "bfloat16", "B": 10, "K": 2048, "D": 896,
         "V": 151936, "kernel_s": 1e-5, "xla_s": 2e-5,
         "config": {"block_k": 128, "block_d": 128, "num_warps": 8, "num_stages": 3,
                    "split_d": 1, "variant": "dot"}}
  monkeypatch.setattr(dispatch, "load_table", lambda path=None: (win,))
  assert "triton" in _lowered_for_cuda()
  assert "triton" in _lowered_for_cuda(B=9, K=1500, D=960)  # same bucket, D within 25%
  assert "triton" not in _lowered_for_cuda(B=4)  # another B bucket: nothing measured
  assert "triton" not in _lowered_for_cuda(dtype=jnp.float32)
  monkeypatch.setattr(dispatch, "gpu_device_kind", lambda: "Other GPU")
  assert "triton" not in _lowered_for_cuda()
  monkeypatch.setattr(dispatch, "gpu_device_kind", lambda: "Fake GPU")
  lose = {**win, "kernel_s": 1.99e-5}  # within the margin: XLA stays
  monkeypatch.setattr(dispatch, "load_table", lambda path=None: (lose,))
  assert "triton" not in _lowered_for_cuda()
  # faster by device time but slower by host-timed single calls: XLA stays
  host_lose = {**win, "kernel_host_s": 9.3e-5, "xla_host_s": 8.3e-5}
  monkeypatch.setattr(dispatch, "load_table", lambda path=None: (host_lose,))
  assert "triton" not in _lowered_for_cuda()
  host_win = {**win, "kernel_host_s": 2.9e-4, "xla_host_s": 8.2e-4}
  monkeypatch.setattr(dispatch, "load_table", lambda path=None: (host_win,))
  assert "triton" in _lowered_for_cuda()


def test_dispatch_table_merge_and_bad_files(tmp_path):
  from vocabjax.kernels import dispatch

  path = tmp_path / "t.json"
  e = {"device_kind": "G", "dtype": "bfloat16", "B": 10, "K": 512, "D": 1024, "kernel_s": 1.0,
       "xla_s": 2.0, "config": {"block_k": 64}}
  dispatch.merge([e], path)
  dispatch.merge([{**e, "kernel_s": 3.0}, {**e, "K": 1024}], path)
  got = dispatch.load_table(path)
  assert [(x["K"], x["kernel_s"]) for x in got] == [(512, 3.0), (1024, 1.0)]
  assert dispatch.choose("G", "bfloat16", 10, 1000, 1024, got) == {"block_k": 64}
  assert dispatch.choose("G", "bfloat16", 10, 512, 1024, got) is None  # XLA won
  assert got[0]["history"] == [{"kernel_s": 1.0, "xla_s": 2.0}]  # the replaced run is kept
  # a later win does not undo a recorded loss: runs disagreed, XLA stays until every run agrees
  dispatch.merge([{**e, "kernel_s": 0.5, "commit": "c3"}], path)
  got = dispatch.load_table(path)
  assert [r["kernel_s"] for r in got[0]["history"]] == [3.0, 1.0]  # newest first
  assert dispatch.choose("G", "bfloat16", 10, 512, 1024, got) is None
  dispatch.merge([{**e, "kernel_s": 0.5}], path, history=False)  # the kernel changed: start over
  got = dispatch.load_table(path)
  assert "history" not in got[0]
  assert dispatch.choose("G", "bfloat16", 10, 512, 1024, got) == {"block_k": 64}
  for i in range(dispatch.HISTORY + 3):  # history is capped
    dispatch.merge([{**e, "kernel_s": 0.4 + i / 100}], path)
  got = dispatch.load_table(path)
  assert len(got[0]["history"]) == dispatch.HISTORY
  assert dispatch.choose("G", "bfloat16", 10, 512, 1024, got) == {"block_k": 64}
  # a host-timed loss in an earlier run counts too
  dispatch.merge([{**e, "kernel_s": 0.5, "kernel_host_s": 2.0, "xla_host_s": 1.0}], path)
  dispatch.merge([{**e, "kernel_s": 0.5, "kernel_host_s": 0.5, "xla_host_s": 1.0}], path)
  assert dispatch.choose("G", "bfloat16", 10, 512, 1024, dispatch.load_table(path)) is None
  with pytest.raises(ValueError, match="lacks 'config'"):
    dispatch.merge([{k: v for k, v in e.items() if k != "config"}], path)
  path.write_text("{not json")
  with pytest.raises(ValueError, match="is not JSON"):
    dispatch.load_table(path)
  # the shipped table parses (it may be empty: then XLA runs everywhere on GPU)
  assert isinstance(dispatch.load_table(), tuple)


@pytest.mark.parametrize("variant", ["fma", "dot"])
@pytest.mark.parametrize("B,D,V,K,block_d,split_d", [
    (1, 128, 300, 64, 64, 1), (2, 200, 1000, 300, 64, 3),  # D = 200: masked chunks
    (5, 96, 77, 130, 64, 2),  # block_d lowered to 32 (divides 96), ragged K
    (3, 256, 500, 33, 64, 3)])  # 4 chunks over 3 splits: 2 + 2
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_kernel_variants_and_splits_interpret(variant, B, D, V, K, block_d, split_d, dtype):
  h, U, idx = _inputs(B, D, V, K, dtype)
  got = indexed_lm_head_gpu(h, U, idx, interpret=True, variant=variant, split_d=split_d,
                            block_d=block_d, block_k=32)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(got), np.asarray(indexed_lm_head_reference(h, U, idx)),
                             rtol=tol, atol=tol * D ** 0.5)


@pytest.mark.parametrize("variant", ["fma", "dot"])
@pytest.mark.parametrize("B,D,V,K,block_d,persist", [
    (3, 96, 500, 70, 32, 2),  # 15 tiles of 3 chunks over 2 programs: ranges cut tiles
    (3, 100, 500, 70, 32, 7),  # D = 100: masked chunks; 7 programs
    (2, 128, 300, 64, 64, 1),  # one program walks everything
    (1, 40, 300, 33, 32, 50)])  # more programs asked than tiles (3): one per tile
def test_gpu_kernel_persistent_interpret(variant, B, D, V, K, block_d, persist):
  for dtype, tol in ((jnp.bfloat16, 2e-2), (jnp.float32, 1e-5)):
    h, U, idx = _inputs(B, D, V, K, dtype)
    got = indexed_lm_head_gpu(h, U, idx, interpret=True, variant=variant, block_d=block_d,
                              block_k=16, persist=persist)
    np.testing.assert_allclose(np.asarray(got),
                               np.asarray(indexed_lm_head_reference(h, U, idx)),
                               rtol=tol, atol=tol * D ** 0.5)


def test_persistent_ranges_cut_each_tile_at_most_once():
  """The persistent kernel writes a tile's partial sums to two slots: that needs every tile to
  meet at most two programs' ranges, which holds when there are no more programs than tiles."""
  from vocabjax.kernels.indexed_lm_head_gpu import persistent_range, programs

  for tiles in (1, 3, 15, 320):
    for nc in (1, 3, 32):
      for P in sorted({min(p, tiles) for p in (1, 2, 7, 132, 264)}):
        ranges = [persistent_range(p, tiles * nc, P) for p in range(P)]
        assert ranges[0][0] == 0 and ranges[-1][1] == tiles * nc
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, no gaps
        lengths = [e - s for s, e in ranges]
        assert max(lengths) - min(lengths) <= 1  # even shares
        for t in range(tiles):
          meets = [p for p, (s, e) in enumerate(ranges) if s < (t + 1) * nc and e > t * nc]
          assert 1 <= len(meets) <= 2, (tiles, nc, P, t, meets)
  assert programs(10, 4096, 2048, {"block_k": 64, "persist": 264}) == 264
  assert programs(10, 4096, 2048, {"block_k": 64, "persist": 500}) == 320  # capped at tiles
  assert programs(10, 4096, 2048, {"block_k": 64, "block_d": 128, "split_d": 2}) == 640
  # left-out knobs take the kernel's own defaults (block_k 64, one split, no persistence)
  assert programs(10, 4096, 2048, {}) == 320 and programs(10, 4096, 2000, {"block_k": 128}) == 160
  assert programs(3, 896, 100, {"split_d": 7}) == 3 * 2 * 7  # 896 = 7 chunks of 128


def test_gpu_kernel_bad_options():
  from vocabjax.kernels.indexed_lm_head_gpu import aligned_block_d

  assert [aligned_block_d(D, 128) for D in (896, 96, 200, 4096, 576)] == [128, 32, 128, 128, 64]
  h, U, idx = _inputs(2, 128, 40, 3, jnp.float32)
  with pytest.raises(ValueError, match="variant='mma' is not one of"):
    indexed_lm_head_gpu(h, U, idx, variant="mma", interpret=True)
  with pytest.raises(ValueError, match="block_k=48 must be a power of two"):
    indexed_lm_head_gpu(h, U, idx, block_k=48, interpret=True)
  with pytest.raises(ValueError, match=r"split_d=5 must be in \[1, 2\]"):
    indexed_lm_head_gpu(h, U, idx, block_d=64, split_d=5, interpret=True)
  with pytest.raises(ValueError, match=r"persist=-1 must be 0"):
    indexed_lm_head_gpu(h, U, idx, persist=-1, interpret=True)
  with pytest.raises(ValueError, match=r"persist=4 .* split_d=1 \(got split_d=2\)"):
    indexed_lm_head_gpu(h, U, idx, block_d=64, split_d=2, persist=4, interpret=True)
