"""The CPU weight-streaming matmul against its jnp reference: shapes, dtypes, ragged widths,
independence of a row's result from the block size, gradients, and the switch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.kernels import cpu_matmul
from vocabjax.kernels.cpu_matmul import linear, linear_reference, uses_kernel
from vocabjax.lowering import (Lowering, decoding_lowering, lowering_of, step_lowering,
                               with_lowering)
from tests.helpers.kernels import matmul_operands


def test_kernel_builds_here():
  assert jax.default_backend() == "cpu"
  assert cpu_matmul.available(), cpu_matmul._built["error"]
  assert cpu_matmul.library_path().exists()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("M,D,F", [(1, 64, 40), (1, 33, 9), (3, 100, 37), (4, 16, 8),
                                   (5, 17, 70), (9, 130, 129), (64, 48, 67), (2, 8, 1)])
def test_matches_reference(M, D, F, dtype):
  x, w, scale = matmul_operands(M, D, F, dtype)
  assert uses_kernel(x.shape, x.dtype, w.dtype)
  y = jax.jit(linear)(x, w, scale)
  ref = linear_reference(x, w, scale)
  assert y.dtype == jnp.float32 and y.shape == (M, F)
  np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=2e-5, atol=2e-5 * np.sqrt(D))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_a_rows_result_does_not_depend_on_the_block(dtype):
  # what makes greedy speculative output identical to one-token decoding bit for bit; the
  # blocks cover every register tile the kernel picks by M (1, 2..4, 5..6, 7..9, 10+) and
  # F spans several thread chunks, so the prefetch of the next rows runs too
  x, w, scale = matmul_operands(20, 200, 300, dtype, seed=1)
  f = jax.jit(linear)
  full = np.asarray(f(x, w, scale))
  for lo, hi in [(0, 1), (3, 4), (2, 5), (2, 7), (1, 7), (0, 8), (4, 13), (5, 13), (12, 13),
                 (0, 9), (1, 18), (0, 20)]:
    np.testing.assert_array_equal(np.asarray(f(x[lo:hi], w, scale)), full[lo:hi])


def test_leading_dims_and_bf16_activations():
  x, w, _ = matmul_operands(6, 40, 24, "bfloat16", seed=2)
  x3 = x.reshape(2, 3, 40)
  y = jax.jit(linear)(x3, w)
  assert y.shape == (2, 3, 24)
  np.testing.assert_allclose(np.asarray(y).reshape(6, 24),
                             np.asarray(linear_reference(x, w)), rtol=2e-5, atol=1e-4)
  yb = jax.jit(linear)(x3.astype(jnp.bfloat16), w)  # widened to f32 inside
  np.testing.assert_allclose(np.asarray(yb), np.asarray(linear_reference(
      x3.astype(jnp.bfloat16).astype(jnp.float32), w.astype(jnp.float32))), rtol=2e-5, atol=1e-4)


def test_large_blocks_and_the_switch_take_xlas_dot():
  x, w, _ = matmul_operands(cpu_matmul.MAX_ROWS + 1, 16, 8, "float32")
  assert not uses_kernel(x.shape, x.dtype, w.dtype)
  np.testing.assert_allclose(np.asarray(linear(x, w)), np.asarray(linear_reference(x, w)),
                             rtol=1e-5, atol=1e-5)
  off = Lowering(cpu_kernel=False)
  assert not uses_kernel((1, 16), jnp.float32, jnp.float32, off)
  hlo = jax.jit(lambda a, b: linear(a, b, lowering=off)).lower(x[:2], w).as_text()
  assert "custom_call" not in hlo
  assert "custom_call" in jax.jit(lambda a, b: linear(a, b)).lower(x[:2], w).as_text()


def test_a_programs_lowering_is_part_of_its_key():
  """The same jitted function over params tagged with two lowerings compiles twice (the
  lowering is in the params' treedef), and a program compiled for one refuses the other."""
  x, w, _ = matmul_operands(2, 16, 8, "float32")
  f = jax.jit(lambda p, a: linear(a, p["w"], lowering=lowering_of(p)))
  on, off = {"w": w}, with_lowering({"w": w}, Lowering(cpu_kernel=False))
  assert "custom_call" in f.lower(on, x).as_text()
  assert "custom_call" not in f.lower(off, x).as_text()
  np.testing.assert_allclose(np.asarray(f(on, x)), np.asarray(f(off, x)), rtol=1e-5, atol=1e-5)
  with pytest.raises(TypeError, match="pytree"):
    f.lower(on, x).compile()(off, x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gradients_match_the_reference(dtype):
  x, w, _ = matmul_operands(3, 24, 10, dtype, seed=3)
  loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b)))  # noqa: E731
  gx, gw = jax.grad(loss(linear), argnums=(0, 1))(x, w)
  rx, rw = jax.grad(loss(linear_reference), argnums=(0, 1))(x, w)
  assert gw.dtype == w.dtype
  np.testing.assert_allclose(np.asarray(gx), np.asarray(rx), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(gw, np.float32), np.asarray(rw, np.float32),
                             rtol=2e-2, atol=2e-2)


def test_width_mismatch_is_refused():
  x, w, _ = matmul_operands(2, 16, 8, "float32")
  with pytest.raises(ValueError, match=r"x's width 15 differs from w\(8, 16\)"):
    linear(x[:, :15], w)


def _bf16(a):
  return np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


@pytest.mark.parametrize("M,D,F", [(32, 31, 13), (70, 97, 50), (100, 64, 130), (33, 896, 48)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_bf16_gemm_matches_the_rounded_product(M, D, F, dtype):
  """Under `Lowering.bf16_blocks` a block of >= GEMM_MIN_ROWS rows is x rounded to bf16 times
  W rounded to bf16 (exact for bf16 and int8 weights), accumulated in f32; ragged M, D, F."""
  x, w, scale = matmul_operands(M, D, F, dtype, seed=5)
  lw = Lowering(bf16_blocks=True)
  on = cpu_matmul.uses_gemm(x.shape, x.dtype, w.dtype, lw)
  y = np.asarray(jax.jit(lambda a, b, s: linear(a, b, s, lowering=lw))(x, w, scale))
  hlo = jax.jit(lambda a, b, s: linear(a, b, s, lowering=lw)).lower(x, w, scale).as_text()
  assert on == cpu_matmul.gemm_available()
  assert ("VjGemmBF16" in hlo) == on
  if on:
    wq = np.asarray(w, np.float64) if dtype == "int8" else _bf16(w)
    ref = _bf16(x) @ wq.T * (np.asarray(scale)[None] if scale is not None else 1)
  else:  # the CPU has no AVX512-BF16: XLA's exact f32 product
    ref = np.asarray(linear_reference(x, w.astype(jnp.float32), scale), np.float64)
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4 * np.sqrt(D))


def test_bf16_blocks_only_under_the_switch_and_for_long_blocks():
  x, w, _ = matmul_operands(cpu_matmul.GEMM_MIN_ROWS, 32, 16, "float32")

  def lower(a, lw=Lowering()):
    return jax.jit(lambda a, b: linear(a, b, lowering=lw)).lower(a, w).as_text()

  assert "VjGemmBF16" not in lower(x)  # off by default: exact f32 everywhere
  on = Lowering(bf16_blocks=True)
  assert "VjGemmBF16" not in lower(x[:-1], on)  # below GEMM_MIN_ROWS
  assert ("VjGemmBF16" in lower(x, on)) == cpu_matmul.gemm_available()
  assert "VjGemmBF16" not in lower(x, on.replace(cpu_kernel=False))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_decode_steps_take_the_kernel_for_any_block(dtype):
  # a batch's verified block can outgrow MAX_ROWS (16 rows x 5 tokens); with any_rows (a
  # decoding step's lowering) it still takes the kernel, so each row equals its one-row result
  # bit for bit
  M = cpu_matmul.MAX_ROWS + 9
  x, w, scale = matmul_operands(M, 40, 24, dtype, seed=4)

  def lower(a, lw=Lowering()):
    return jax.jit(lambda a, b, s: linear(a, b, s, lowering=lw)).lower(a, w, scale)

  assert "custom_call" not in lower(x).as_text()  # by default: XLA's dot for long blocks
  steps = step_lowering(decoding_lowering(mesh=False, cpu_kernel=True))
  assert steps.any_rows and cpu_matmul.uses_kernel(x.shape, x.dtype, w.dtype, steps)
  block = np.asarray(lower(x, steps).compile()(x, w, scale))
  one = lower(x[5:6], steps).compile()
  assert not cpu_matmul.uses_kernel(x.shape, x.dtype, w.dtype)
  np.testing.assert_array_equal(block[5:6], np.asarray(one(x[5:6], w, scale)))
  np.testing.assert_allclose(block, np.asarray(linear_reference(x, w, scale)), rtol=2e-5,
                             atol=2e-4)


@pytest.mark.parametrize("M", [3, 200])
def test_bf16_dots_round_products_and_their_gradients(M):
  """With `Lowering.bf16_dots`, `linear` (any M: the kernel's range and beyond) is the product of
  bf16-rounded operands in f32, its gradients the products of the bf16-rounded cotangent with
  the rounded operands, returned in the f32 operands' dtype; outside, exact f32 as before."""
  x, w, _ = matmul_operands(M, 96, 40, "float32", seed=3)
  g = jnp.asarray(np.random.default_rng(4).standard_normal((M, 40)), jnp.float32)

  def vjp(x, w, lw=Lowering(bf16_dots=True)):
    y, back = jax.vjp(lambda a, b: linear(a, b, lowering=lw), x, w)
    return y, *back(g)

  y, dx, dw = jax.jit(vjp)(x, w)
  assert y.dtype == dx.dtype == dw.dtype == jnp.float32
  xr, wr, gr = _bf16(x), _bf16(w), _bf16(g)
  np.testing.assert_allclose(np.asarray(y), xr @ wr.T, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(dx), gr @ wr, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(np.asarray(dw), gr.T @ xr, rtol=1e-5, atol=1e-4)
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
  assert np.abs(np.asarray(y) - exact).max() > 1e-3  # it did round
  y32 = jax.jit(lambda x, w: vjp(x, w, Lowering())[0])(x, w)  # the default: exact f32
  np.testing.assert_allclose(np.asarray(y32), exact, rtol=1e-5, atol=1e-4)


@pytest.mark.extended
def test_an_avx2_target_builds_its_own_library_without_the_bf16_gemm(tmp_path):
  """`VOCABJAX_CPU_MARCH=x86-64-v3` (an AVX2-only host's code path): a library of its own
  beside the native one, without the AVX512-BF16 GEMM, whose matmuls (int8 weights, the
  decoders' drafter path) still match the reference; a value that is no target name is
  refused naming it. In a subprocess: the kernel library is loaded once per process."""
  import os
  import subprocess
  import sys

  from tests.helpers.compile import subprocess_xla_flags

  code = (
      "import jax, numpy as np\n"
      "from tests.helpers.kernels import matmul_operands\n"
      "from vocabjax.kernels import cpu_matmul\n"
      "x, w, s = matmul_operands(3, 100, 37, 'int8')\n"
      "y = jax.jit(cpu_matmul.linear)(x, w, s)\n"
      "ref = cpu_matmul.linear_reference(x, w, s)\n"
      "np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=2e-5, atol=2e-4)\n"
      "print(cpu_matmul.available(), cpu_matmul.gemm_available(), cpu_matmul.library_path())\n")
  env = {**os.environ, "VOCABJAX_CPU_MARCH": "x86-64-v3", "VOCABJAX_CACHE": str(tmp_path),
         "XLA_FLAGS": subprocess_xla_flags(1)}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  assert out.returncode == 0, out.stderr[-2000:]
  available, gemm, path = out.stdout.split()
  assert available == "True" and gemm == "False"
  assert path.startswith(str(tmp_path)) and path != str(cpu_matmul.library_path())
  os.environ["VOCABJAX_CPU_MARCH"] = "native; rm -rf /"
  try:
    with pytest.raises(ValueError, match=r"VOCABJAX_CPU_MARCH='native; rm -rf /' is not a "
                                         r"compiler target name"):
      cpu_matmul.march()
  finally:
    del os.environ["VOCABJAX_CPU_MARCH"]
