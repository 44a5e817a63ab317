"""Grouped int4 times activations on a GPU (Pallas, Triton): y[M, F] = x[M, D] . W[D, F], W =
codes * scales (`kernels.blocks.GroupedInt4`: int4 codes [D, F], one f32 scale per 32 inputs
and output), each weight widened and scaled in registers, never in HBM.

Why: XLA:GPU writes every int4 matrix out widened (bf16 or f32) before its dot and reads it
back, so a decoding step with int4 weights reads more bytes than with bf16 weights (measured on
an H200: Llama-3.1-8B's plain step 16.01 ms with int4 against 7.08 ms with bf16;
kernels/results/quantized_steps/nvidia-h200/). This kernel reads each code and scale once.

Grid (M, F / block_f, splits): a program takes one row of x and block_f outputs, and walks its
share of D in chunks of block_d (whole groups of 32): it loads the chunk's int4 codes [block_d,
block_f] (Pallas's Triton lowering reads contiguous int4 as bytes and splits the nibbles), its
scales [block_d / 32, block_f], widens and scales them in f32 (exact: a 4-bit code times a
float16 value), rounds the weights to x's dtype (bf16 activations: the values XLA's dot would
take) and accumulates x * w in an f32 [block_d, block_f] accumulator, summed over D at the end.
`splits` > 1 cuts D into that many ranges (their partial sums added by XLA in a fixed order),
so a narrow matrix still fills the GPU; it depends on (D, F) only.

One program per row makes every row's arithmetic the same whatever the number of rows M: a
verification block of 4 rows computes each row's logits bit for bit as a plain step of that
row would (the greedy identity does not rest on how XLA tiles a dot for M). The price: a block
of M rows reads the weights M times from L2 or HBM; `MAX_ROWS` (32) bounds it, larger blocks
(prefill) take XLA's dot.

Checked without a GPU: in Pallas's interpreter (values), compiled deviceless by XLA:GPU for
the H100 and H200 (`vocabjax.testing.gpu_aot`), and its Triton IR compiled for sm_90a by the
`triton` package (kernels/grouped_int4_triton.py); not yet run on a GPU.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vocabjax.kernels.blocks import GROUP

MAX_ROWS = 32  # rows of x the kernel takes; more: XLA's dot (`fits`)
ENABLED = os.environ.get("VOCABJAX_GPU_INT4_KERNEL", "1") != "0"  # read at import; "0": XLA's
#   dot takes every grouped-int4 product on a GPU (to compare, or should the kernel fail there)
TARGET_PROGRAMS = 1056  # programs a matrix's grid should reach (8 per SM of an H100 / H200)
BLOCK_D, BLOCK_F = 32, 64  # the defaults: 40-48 registers a thread at 4 warps, 10-12 programs
#   an SM, no spills, for every matrix of the 1.5B and 8B pairs (sm_90a;
#   kernels/results/grouped_int4_triton/); 64 x 128 needs 167 (3 programs an SM), f32 spills
_BLOCK_F = (128, 64, 32, 16)  # the largest dividing F and at most the asked block_f
_BLOCK_D = (64, 32)  # the largest dividing D (whole groups of 32) and at most block_d


def blocks_for(D: int, F: int, block_d: int | None = None, block_f: int | None = None
               ) -> tuple[int, int] | None:
  """(block_d, block_f) for a [D, F] weight: the largest of _BLOCK_D / _BLOCK_F at most
  `block_d` / `block_f` (default BLOCK_D / BLOCK_F) that divides it, or None when none does."""
  bf = next((b for b in _BLOCK_F if F % b == 0 and b <= (block_f or BLOCK_F)), None)
  bd = next((b for b in _BLOCK_D if D % b == 0 and b <= (block_d or BLOCK_D)), None)
  return None if bf is None or bd is None else (bd, bf)


def splits_for(D: int, F: int, block_d: int | None = None, block_f: int | None = None) -> int:
  """Ranges of D for a [D, F] weight: the most that divide its chunks evenly without passing
  what F / block_f x splits needs to reach TARGET_PROGRAMS. A function of (D, F) alone: a row's
  sums are the same at every M."""
  bd, bf = blocks_for(D, F, block_d, block_f)
  chunks, tiles = D // bd, F // bf
  want = min(chunks, max(1, -(-TARGET_PROGRAMS // tiles)))
  return max(d for d in range(1, want + 1) if chunks % d == 0)  # equal ranges, static loops


def fits(M: int, D: int, F: int) -> bool:
  """Whether the kernel takes x [M, D] times a [D, F] weight: 1 <= M <= MAX_ROWS, D a whole
  number of groups and F a multiple of 16."""
  return 0 < M <= MAX_ROWS and D % GROUP == 0 and blocks_for(D, F) is not None


def _kernel(x_ref, q_ref, s_ref, o_ref, *, block_d, chunks):
  # the blocks of program (m, j, sp): x [1, D / S], codes [D / S, block_f], scales [D / S / 32,
  # block_f], out [1, 1, block_f]. Whole-width slices of the codes' block are aligned and
  # contiguous, so Pallas loads them as bytes and splits the nibbles (not byte by element).
  groups = block_d // GROUP
  dtype = x_ref.dtype

  def chunk(c, acc):
    start = pl.multiple_of(c * block_d, block_d)
    q = q_ref[pl.ds(start, block_d), :].astype(jnp.float32)  # [block_d, block_f]
    s = s_ref[pl.ds(pl.multiple_of(c * groups, groups), groups), :]  # [groups, block_f]
    bf = q.shape[1]
    w = q * s if groups == 1 else (q.reshape(groups, GROUP, bf) * s[:, None, :]).reshape(
        block_d, bf)
    xv = x_ref[0, pl.ds(start, block_d)].astype(jnp.float32)  # [block_d]
    return acc + w.astype(dtype).astype(jnp.float32) * xv[:, None]

  acc = jax.lax.fori_loop(0, chunks, chunk,
                          jnp.zeros((block_d, o_ref.shape[-1]), jnp.float32))
  o_ref[0, 0, :] = jnp.sum(acc, axis=0)


def grouped_matmul(x, codes, scales, *, block_d: int | None = None, block_f: int | None = None,
                   num_warps: int = 4, num_stages: int = 3, interpret: bool = False
                   ) -> jax.Array:
  """x [M, D] (bf16 or f32) . (codes * scales) [D, F] in f32 on a GPU (module doc);
  `interpret`: Pallas's interpreter (any backend; values only). ValueError when the shapes
  disagree or the kernel does not take them (`fits`)."""
  M, D = x.shape
  if codes.ndim != 2 or codes.shape[0] != D or scales.shape != (D // GROUP, codes.shape[1]):
    raise ValueError(f"grouped_matmul: x {tuple(x.shape)}, codes {tuple(codes.shape)} and "
                     f"scales {tuple(scales.shape)} do not fit (codes [D, F], scales "
                     f"[D / {GROUP}, F])")
  F = codes.shape[1]
  if not fits(M, D, F):
    raise ValueError(f"grouped_matmul: x of {M} rows and width {D} times {F} outputs is outside "
                     f"the kernel (1 to {MAX_ROWS} rows, D whole groups of {GROUP}, F a "
                     f"multiple of 16)")
  bd, bf = blocks_for(D, F, block_d, block_f)
  S = splits_for(D, F, bd, bf)
  compiler_params = None
  if not interpret:
    from jax.experimental.pallas import triton as pltr
    compiler_params = pltr.CompilerParams(num_warps=num_warps, num_stages=num_stages)
  Dr = D // S  # each range's width: whole chunks
  kernel = functools.partial(_kernel, block_d=bd, chunks=Dr // bd)
  parts = pl.pallas_call(
      kernel, grid=(M, F // bf, S),
      in_specs=[pl.BlockSpec((1, Dr), lambda m, j, sp: (m, sp)),
                pl.BlockSpec((Dr, bf), lambda m, j, sp: (sp, j)),
                pl.BlockSpec((Dr // GROUP, bf), lambda m, j, sp: (sp, j))],
      out_specs=pl.BlockSpec((1, 1, bf), lambda m, j, sp: (sp, m, j)),
      out_shape=jax.ShapeDtypeStruct((S, M, F), jnp.float32),
      compiler_params=compiler_params, interpret=interpret,
      name="grouped_int4_gpu")(x, codes, scales)
  y = parts[0]
  for i in range(1, S):  # in order, one add per element (a reduce's order may follow M)
    y = y + parts[i]
  return y
