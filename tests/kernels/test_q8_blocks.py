"""Blocks multiplied with int8 activations (`BlockWeight.arith == "q8"`, llama.cpp's
arithmetic): x quantized per block (256 values for the K types, 32 for Q8_0 / Q4_0), integer
dot products with the weights' codes, scales in f32. The kernel equals that arithmetic (a
float64 reference of the same quantized operands), stays within quantization noise of the exact
f32 product, and gives every row the same bits whatever the number of rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.blocks import builds_agree, random_blocks, reference
from vocabjax.kernels import cpu_matmul
from vocabjax.kernels.blocks import (BLOCK_TYPES, Q8_TYPES, BlockError, BlockWeight, from_numpy,
                                     with_arith)
from vocabjax.kernels.cpu_matmul import linear
from vocabjax.lowering import Lowering

CPU = Lowering(platform="cpu")
QK = {"Q4_K": 256, "Q6_K": 256, "Q8_0": 32, "Q4_0": 32, "Q5_0": 32}


def _bits(a):
  return np.asarray(a, np.float32).view(np.uint32)


def quantized_x(x: np.ndarray, qk: int):
  """x [M, D] f32 -> (q [M, D] as float64, d [M, D / qk] float64): the kernel's rule, in f32."""
  x = np.asarray(x, np.float32)
  M, D = x.shape
  xb = x.reshape(M, D // qk, qk)
  amax = np.abs(xb).max(-1)
  with np.errstate(divide="ignore"):
    inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
  q = np.clip(np.rint(xb * inv[..., None]), -127, 127)
  return q.reshape(M, D).astype(np.float64), (amax / np.float32(127)).astype(np.float64)


def q8_reference(x, data, qtype):
  """y = sum over x's blocks of d_x[b] * (W's dequantized values . q_x) in float64."""
  qk = QK[qtype]
  w = reference(data, qtype).astype(np.float64)  # [F, D]
  q, d = quantized_x(x, qk)
  M, D = q.shape
  per_block = np.einsum("mbk,fbk->mfb", q.reshape(M, D // qk, qk), w.reshape(-1, D // qk, qk))
  return (per_block * d[:, None, :]).sum(-1)


@pytest.mark.parametrize("qtype", Q8_TYPES)
def test_q8_kernel_is_the_int8_activation_arithmetic_at_every_row_count(qtype):
  assert cpu_matmul.available()
  data = random_blocks(qtype, 150, 512, seed=2)
  w = from_numpy(data, qtype)
  q8 = with_arith(w, "q8")
  assert q8.arith == "q8" and w.arith == "exact"
  run = jax.jit(lambda x, w, lw: linear(x, w, lowering=lw), static_argnums=2)
  x = jax.random.normal(jax.random.key(7), (80, 512)) * jnp.linspace(0.1, 3.0, 512)
  ones = np.stack([np.asarray(run(x[m:m + 1], q8, CPU))[0] for m in range(9)])
  for M, lw in [(1, CPU), (3, CPU), (9, CPU), (40, CPU), (80, CPU.replace(any_rows=True)),
                (48, CPU.replace(bf16_blocks=True))]:
    got = np.asarray(run(x[:M], q8, lw))
    assert got.shape == (M, 150)
    # a row's result is its one-row result bit for bit, whatever M (and never the bf16 GEMM)
    np.testing.assert_array_equal(_bits(got[:min(M, 9)]), _bits(ones[:min(M, 9)]),
                                  err_msg=f"M={M}")
    want = q8_reference(np.asarray(x[:M]), data, qtype)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, atol=2e-5 * scale, rtol=1e-5, err_msg=f"M={M}")
  # within quantization noise of the exact product (8-bit x: ~0.5% of the product's size)
  exact = np.asarray(run(x[:9], w, CPU))
  err = np.linalg.norm(ones - exact) / np.linalg.norm(exact)
  assert 0 < err < 0.02, err
  hlo = jax.jit(lambda x, w: linear(x, w, lowering=CPU)).lower(jnp.ones((2, 512)), q8).as_text()
  assert f"VjQ8Matmul{qtype}" in hlo


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_q8_rows_of_a_long_block_are_their_one_row_results(qtype):
  """A prefill's rows are multiplied in passes of as many rows as fit the cache (192 KiB of
  quantized x: 24 rows of 8,192 values) and register tiles of 4 or 8 rows: every row of 61,
  across three passes and a ragged last tile, is its one-row result bit for bit."""
  data = random_blocks(qtype, 20, 8192, seed=4)
  q8 = with_arith(from_numpy(data, qtype), "q8")
  run = jax.jit(lambda x, w: linear(x, w, lowering=CPU.replace(any_rows=True)))
  x = jax.random.normal(jax.random.key(9), (61, 8192))
  got = np.asarray(run(x, q8))
  ones = np.concatenate([np.asarray(run(x[m:m + 1], q8)) for m in range(61)])
  np.testing.assert_array_equal(_bits(got), _bits(ones))


def test_q8_edge_rows_zero_and_non_finite():
  """A row of zeros gives zeros; a non-finite x gives a non-finite y (the engine's non-finite
  check then names it), never a finite guess."""
  data = random_blocks("Q4_K", 16, 256, seed=3)
  q8 = with_arith(from_numpy(data, "Q4_K"), "q8")
  x = np.zeros((3, 256), np.float32)
  x[1, 5] = np.inf
  x[2, 7] = np.nan
  y = np.asarray(jax.jit(lambda x, w: linear(x, w, lowering=CPU))(jnp.asarray(x), q8))
  assert (y[0] == 0).all() and not np.isfinite(y[1]).any() and not np.isfinite(y[2]).any()


def test_long_blocks_take_the_kernel_and_no_kernel_multiplies_exactly():
  """Blocks of any number of rows (a prefill past MAX_ROWS, outside a decoding step) take the
  int8-activation kernel, so a token's keys and values are that arithmetic's whether a prefill
  or a step computed them; a program without the kernel multiplies the dequantized values in
  f32, as the exact arithmetic does."""
  data = random_blocks("Q6_K", 32, 256, seed=4)
  w = from_numpy(data, "Q6_K")
  q8 = with_arith(w, "q8")
  x = jax.random.normal(jax.random.key(0), (cpu_matmul.MAX_ROWS + 6, 256))
  long = np.asarray(jax.jit(lambda x, w: linear(x, w, lowering=CPU))(x, q8))
  one = np.asarray(jax.jit(lambda x, w: linear(x, w, lowering=CPU))(x[-1:], q8))
  np.testing.assert_array_equal(_bits(long[-1:]), _bits(one))
  off = CPU.replace(cpu_kernel=False)
  run = jax.jit(lambda x, w: linear(x, w, lowering=off))
  np.testing.assert_array_equal(_bits(run(x, q8)), _bits(run(x, w)))


def test_arith_is_checked_and_kept_by_row_takes():
  data = random_blocks("Q5_1", 4, 64, seed=1)
  with pytest.raises(BlockError, match="Q5_1 blocks have no int8-activation kernel"):
    BlockWeight(jnp.asarray(data), "Q5_1", 64, "q8")
  with pytest.raises(BlockError, match="arith='int8': choose one of"):
    BlockWeight(jnp.asarray(data), "Q5_1", 64, "int8")
  mixed = with_arith({"a": from_numpy(data, "Q5_1"),
                      "b": from_numpy(random_blocks("Q8_0", 4, 64), "Q8_0")}, "q8")
  assert (mixed["a"].arith, mixed["b"].arith) == ("exact", "q8")
  assert mixed["b"].take(jnp.asarray([1, 0])).arith == "q8"
  assert set(Q8_TYPES) <= set(BLOCK_TYPES)


@pytest.mark.extended
def test_the_avx2_and_portable_builds_compute_the_same_bits(tmp_path):
  """The AVX2 build (`x86-64-v3`: maddubs / madd lanes) and the portable one (`x86-64`: the
  same lanes in scalar code, std::fma) give what the native build gives, bit for bit (a
  subprocess: one library per process)."""
  code = (
      "import numpy as np, jax, jax.numpy as jnp\n"
      "from tests.helpers.blocks import random_blocks\n"
      "from vocabjax.kernels.blocks import Q8_TYPES, from_numpy, with_arith\n"
      "from vocabjax.kernels.cpu_matmul import linear\n"
      "from vocabjax.lowering import Lowering\n"
      "x = jax.random.normal(jax.random.key(0), (12, 512))\n"
      "out = {f'{q}_{m}': np.asarray(linear(x[:m], with_arith(from_numpy(random_blocks(q, 40, 512,"
      " seed=5), q), 'q8'), lowering=Lowering(platform='cpu'))) for q in Q8_TYPES for m in (1, 12)}\n"
      "np.savez(__import__('sys').argv[1], **out)\n")
  builds_agree(tmp_path, code)
