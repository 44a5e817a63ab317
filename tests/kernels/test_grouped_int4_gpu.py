"""The GPU grouped-int4 kernel (`kernels.grouped_int4_gpu`, Pallas on Triton): in Pallas's
interpreter it computes the grouped values' product, each row the same whatever the number of
rows beside it; compiled deviceless for Hopper GPUs (XLA:GPU and Triton of JAX's CUDA plugin,
`vocabjax.testing.gpu_aot`) it compiles at the real pairs' shapes, and an int4 decoding step
compiled for a GPU runs it and writes no matrix widened, where XLA's own dot writes them all."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.kernels import grouped_int4_gpu as g
from vocabjax.kernels.blocks import GroupedInt4, grouped_in_out
from vocabjax.models import LlamaLikeConfig

interpret = functools.partial(g.grouped_matmul, interpret=True)


def _operands(M, D, F, seed=0):
  rng = np.random.default_rng(seed + M + D + F)
  codes = jnp.asarray(rng.integers(-8, 8, (D, F)), jnp.int4)
  scales = jnp.asarray(rng.uniform(0.01, 0.1, (D // 32, F)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((M, D)), jnp.float32)
  return x, codes, scales


@pytest.mark.parametrize("M,D,F", [(1, 512, 640), (5, 256, 192), (3, 96, 48), (17, 64, 48)])
def test_the_kernel_computes_the_grouped_values(M, D, F):
  """Blocks of 64 and of 16 outputs (F = 48), one range of D and several (`splits_for`), more
  rows than a tensor core's 16; x in f32, and in bf16 against the weights rounded to bf16 (the
  values XLA's dot takes on a GPU), f32 sums."""
  x, codes, scales = _operands(M, D, F)
  w = np.asarray(grouped_in_out(GroupedInt4(codes, scales)))
  y = interpret(x, codes, scales)
  assert y.shape == (M, F) and y.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(y), np.asarray(x) @ w, rtol=1e-5, atol=1e-4)
  xb = x.astype(jnp.bfloat16)
  wb = np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32)
  np.testing.assert_allclose(np.asarray(interpret(xb, codes, scales)),
                             np.asarray(xb, np.float32) @ wb, rtol=1e-5, atol=1e-4)


def test_each_row_is_the_same_at_every_row_count():
  """A row's outputs are bit for bit those of the row alone (a verification block's logits are
  a plain step's): programs are per row, and the split of D depends on (D, F) only."""
  x, codes, scales = _operands(9, 256, 128)
  assert g.splits_for(256, 128) > 1  # partial sums added by XLA, in the same order each time
  whole = np.asarray(interpret(x, codes, scales))
  for m in range(9):
    alone = np.asarray(interpret(x[m:m + 1], codes, scales))[0]
    np.testing.assert_array_equal(alone, whole[m])
  np.testing.assert_array_equal(np.asarray(interpret(x[2:6], codes, scales)), whole[2:6])


def test_blocks_and_splits():
  assert g.blocks_for(1536, 8960) == (g.BLOCK_D, g.BLOCK_F) == (32, 64)
  assert g.blocks_for(1536, 8960, 64, 128) == (64, 128)
  assert g.blocks_for(96, 48) == (32, 16) and g.blocks_for(96, 40) is None
  for D, F in ((1536, 8960), (8960, 1536), (1536, 256), (4096, 128256), (14336, 4096)):
    bd, bf = g.blocks_for(D, F)
    S = g.splits_for(D, F)
    assert (D // bd) % S == 0, (D, F, S)  # equal ranges of whole chunks
    assert S <= -(-g.TARGET_PROGRAMS // (F // bf)), (D, F, S)  # no more ranges than needed
  assert g.splits_for(4096, 128256) == 1  # a vocabulary's head fills the GPU by its columns


def test_bad_input_is_refused_in_one_line():
  x, codes, scales = _operands(2, 64, 48)
  with pytest.raises(ValueError, match=r"x \(2, 64\), codes \(64, 47\) and scales \(2, 48\) "
                                       r"do not fit"):
    interpret(x, codes[:, :47], scales)
  with pytest.raises(ValueError, match=r"x of 33 rows and width 64 times 48 outputs is outside "
                                       r"the kernel \(1 to 32 rows"):
    interpret(jnp.zeros((33, 64)), codes, scales)
  x2, codes2, scales2 = _operands(1, 64, 40)
  assert not g.fits(1, 64, 40) and not g.fits(0, 64, 48) and g.fits(32, 64, 48)
  with pytest.raises(ValueError, match="F a multiple of 16"):
    interpret(x2, codes2, scales2)


QCFG = LlamaLikeConfig(arch="qwen2", vocab_size=80, hidden_size=96, intermediate_size=160,
                       num_layers=2, num_heads=6, num_kv_heads=2, head_dim=16,
                       attention_bias=True)

# (D, F) of Qwen2.5-Coder-1.5B's and Llama-3.1-8B's matrices and heads
REAL = ((1536, 1536), (1536, 256), (1536, 8960), (8960, 1536), (1536, 151936), (4096, 4096),
        (4096, 1024), (4096, 14336), (14336, 4096), (4096, 128256))


@pytest.mark.integration  # compiles for GPU (.ci/run's second step)
@pytest.mark.parametrize("target", ["h100", "h200"])
def test_it_compiles_for_hopper_gpus_at_the_real_shapes(target):
  from vocabjax.testing import gpu_aot

  S = jax.ShapeDtypeStruct
  for (D, F), M in zip(REAL, (1, 17) * len(REAL)):
    compiled = gpu_aot.compile_for_gpu(
        g.grouped_matmul, S((M, D), jnp.bfloat16), S((D, F), jnp.int4),
        S((D // 32, F), jnp.float32), target=target, name=f"grouped int4 {M}x{D}x{F}")
    assert "__gpu$xla.gpu.triton" in compiled.as_text(), (D, F)


@pytest.mark.integration
@pytest.mark.parametrize("method", ["ar", "chain_g3", "tree_k2d2n4"])
def test_an_int4_step_compiled_for_a_gpu_widens_no_matrix(method, monkeypatch):
  """The decoder's own step over grouped-int4 weights (a 96-wide, 2-layer model whose matrices'
  sizes no cache or activation shares), compiled by
  XLA:GPU for an H100: its projections and heads are the Triton kernel, and no float array as
  large as the smallest matrix is written; with the kernel switched off, XLA's dot writes
  them (the step the H200 measured at 2.26x bf16's time)."""
  import re

  from vocabjax.bench import stand_ins, tpu

  setup = stand_ins.Setup(QCFG, QCFG, head_vocab=32, head_intermediate=64, ranker_rank=8,
                          weights="int4")
  D, I = QCFG.hidden_size, QCFG.intermediate_size
  q, kv = QCFG.num_heads * QCFG.head_dim, QCFG.num_kv_heads * QCFG.head_dim
  matrices = {(D, q), (D, kv), (q, D), (D, I), (I, D), (D, QCFG.vocab_size)}  # (in, out)

  def widened(text):
    """Float arrays holding a matrix's values: as many, in a shape of its outputs and its
    inputs or their groups of 32 (XLA's widened Q4_0: bf16[D / 32, 32, F], [F, D / 32, 32])."""
    out = []
    for t, d in re.findall(r"= (bf16|f32|f16)\[([0-9,]+)\]", text):
      dims = [int(n) for n in d.split(",")]
      if any(int(np.prod(dims)) == i * o and o in dims and (i in dims or i // 32 in dims)
             for i, o in matrices):
        out.append(f"{t}[{d}]")
    return out

  def steps():
    step = tpu.lower_step(method, setup, topology="gpu:h100", S=128, T=16, compile=True)
    assert step.step_programs
    return [step.programs[n].compiled.as_text() for n in step.step_programs]

  for text in steps():
    assert text.count("__gpu$xla.gpu.triton") >= 2 * 7 + 1, method  # 2 layers x 7, the head
    assert not widened(text), (method, widened(text))
  monkeypatch.setattr(g, "fits", lambda M, D, F: False)
  for text in steps():
    assert "__gpu$xla.gpu.triton" not in text and widened(text), method
