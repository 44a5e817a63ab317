"""GGUF blocks kept as stored (`kernels.blocks`): every kept type's values are `gguf`'s own
dequantization bit for bit, and `linear` over them (the CPU kernel dequantizing in registers,
or XLA over `dequantize`) equals the f32 path over those values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.blocks import builds_agree, random_blocks, reference
from vocabjax.kernels import cpu_matmul
from vocabjax.kernels.blocks import (BLOCK_TYPES, BlockError, BlockWeight, dequantize, from_numpy,
                                     row_bytes)
from vocabjax.kernels.cpu_matmul import linear
from vocabjax.kernels.gather import take_rows
from vocabjax.lowering import Lowering

TYPES = sorted(BLOCK_TYPES)
CPU = Lowering(platform="cpu")


def _bits(a):
  return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_is_gguf_s_bit_for_bit(qtype):
  data = random_blocks(qtype, 7, 512, seed=1)
  w = from_numpy(data, qtype)
  assert w.shape == (7, 512) and w.data.dtype == jnp.uint8 and w.nbytes == data.size
  np.testing.assert_array_equal(_bits(jax.jit(dequantize)(w)), _bits(reference(data, qtype)))
  rows = jnp.asarray([[4, 0], [6, 6]])
  np.testing.assert_array_equal(_bits(take_rows(w, rows)),
                                _bits(reference(data, qtype)[np.asarray(rows)]))


@pytest.mark.parametrize("qtype", TYPES)
def test_kernel_equals_the_f32_kernel_on_the_dequantized_rows(qtype):
  """The kernel dequantizes in registers and multiplies as the f32 kernel does: equal bit for
  bit at every number of rows (one token, a chain's block, a tree's, the bf16 GEMM's), and
  within f32 rounding of float64."""
  assert cpu_matmul.available()
  data = random_blocks(qtype, 200, 512, seed=2)
  w, u = from_numpy(data, qtype), jnp.asarray(reference(data, qtype))
  run = jax.jit(lambda x, w, lw: linear(x, w, lowering=lw), static_argnums=2)
  for M, lw in [(1, CPU), (3, CPU), (9, CPU), (40, CPU), (80, CPU.replace(any_rows=True)),
                (48, CPU.replace(bf16_blocks=True))]:
    x = jax.random.normal(jax.random.key(M), (M, 512))
    got = run(x, w, lw)
    assert got.shape == (M, 200)
    np.testing.assert_array_equal(_bits(got), _bits(run(x, u, lw)), err_msg=f"M={M}")
    if not lw.bf16_blocks:
      exact = np.asarray(x, np.float64) @ np.asarray(u, np.float64).T
      np.testing.assert_allclose(np.asarray(got), exact, atol=1e-5, rtol=1e-5)
  hlo = jax.jit(lambda x, w: linear(x, w, lowering=CPU)).lower(jnp.ones((2, 512)), w).as_text()
  assert f"VjSkinnyMatmul{qtype}" in hlo


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_an_indexed_head_over_blocks_dequantizes_the_rows_in_the_kernel(qtype):
  """`indexed_lm_head` over GGUF blocks (DynaSpec's clusters, SpecVocab's and MicroSpec's
  per-row candidates on a quantized head): each row's K rows multiplied by the kernel from
  their bytes, the f32 product of the dequantized rows within f32 rounding, and no f32 copy of
  the gathered rows in the program."""
  from vocabjax.kernels.indexed_lm_head import indexed_lm_head

  data = random_blocks(qtype, 90, 512, seed=5)
  w, u = from_numpy(data, qtype), np.asarray(reference(data, qtype), np.float64)
  h = jax.random.normal(jax.random.key(1), (3, 512))
  idx = jnp.asarray(np.random.RandomState(2).randint(0, 90, (3, 40)))
  run = jax.jit(indexed_lm_head)
  got = np.asarray(run(h, w, idx))
  want = np.einsum("bkd,bd->bk", u[np.asarray(idx)], np.asarray(h, np.float64))
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)
  text = run.lower(h, w, idx).compile().as_text()
  assert f"VjSkinnyMatmul{qtype}" in text
  assert "f32[3,40,512]" not in text.replace(" ", ""), "the gathered rows were widened"


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_without_the_kernel_xla_dots_the_dequantized_rows(qtype):
  data = random_blocks(qtype, 64, 256, seed=3)
  w, u = from_numpy(data, qtype), reference(data, qtype)
  x = jax.random.normal(jax.random.key(0), (2, 5, 256))
  for lw in (CPU.replace(cpu_kernel=False), Lowering(platform="other")):
    got = jax.jit(lambda x, w: linear(x, w, lowering=lw))(x, w)
    assert got.shape == (2, 5, 64)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x) @ u.T, atol=1e-5, rtol=1e-5)


@pytest.mark.extended
def test_a_mixed_stack_of_types_and_the_avx2_build_agree(tmp_path):
  """The AVX2 build (`VOCABJAX_CPU_MARCH=x86-64-v3`: its eight-lane block decoding) and the
  portable build (`x86-64`: the scalar `group_value` decoding every vector path must equal)
  compute what the native build computes, bit for bit, for every type, one token and blocks
  that take several passes of the register tile (a subprocess: one library per process)."""
  code = (
      "import numpy as np, jax, jax.numpy as jnp\n"
      "from tests.helpers.blocks import random_blocks\n"
      "from vocabjax.kernels.blocks import BLOCK_TYPES, from_numpy\n"
      "from vocabjax.kernels.cpu_matmul import linear\n"
      "from vocabjax.lowering import Lowering\n"
      "x = jax.random.normal(jax.random.key(0), (12, 512))\n"
      "out = {f'{q}_{m}': np.asarray(linear(x[:m], from_numpy(random_blocks(q, 40, 512, seed=5), q),\n"
      "        lowering=Lowering(platform='cpu'))) for q in sorted(BLOCK_TYPES) for m in (1, 3, 12)}\n"
      "np.savez(__import__('sys').argv[1], **out)\n")
  builds_agree(tmp_path, code)


def test_bad_blocks_are_refused_with_the_value():
  with pytest.raises(BlockError, match=r"'Q3_K' is not kept as blocks"):
    row_bytes("Q3_K", 256)
  with pytest.raises(BlockError, match=r"a row of 100 values is not a whole number of Q4_K "
                                       r"blocks of 256"):
    row_bytes("Q4_K", 100)
  with pytest.raises(BlockError, match=r"Q8_0 rows of 64 values take 68 bytes; the data's "
                                       r"rows have 67"):
    BlockWeight(jnp.zeros((2, 67), jnp.uint8), "Q8_0", 64)
  with pytest.raises(BlockError, match=r"Q6_K rows are whole blocks of 210 bytes; these have "
                                       r"200"):
    from_numpy(np.zeros((2, 200), np.uint8), "Q6_K")
  w = from_numpy(random_blocks("Q8_0", 4, 64), "Q8_0")
  with pytest.raises(ValueError, match=r"x's width 32 differs from w\(4, 64\)'s input width 64"):
    linear(jnp.ones((1, 32)), w)
