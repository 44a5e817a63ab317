"""Grouped int4 times activations on a TPU (Mosaic): y[M, F] = x[M, D] . W[D, F], W = codes *
scales (`kernels.blocks.GroupedInt4`: int4 codes [D, F], one f32 scale per 32 inputs and
output), each weight widened and scaled in VMEM, never in HBM.

XLA:TPU fuses that widening into its dot for some shapes only: one row of D 4096 x F 14336
reads its codes and scales once (1.00x), but a block of 8 rows of D 14336 x F 4096 and of
Qwen2.5-0.5B's matrices reads 7.05-7.34x (the widened weight written to HBM and read back), and
a matrix whose outputs are not whole 128-lane tiles (a vocabulary split over 4 chips: 151,936 /
4 = 37,984 columns) 2.61x even for one row (kernels/results/tpu_bytes/grouped_int4.md,
deviceless v5e, XLA's HBM count). The kernel reads each code and scale once per call whatever
the shape.

Grid (F / bf, D / bd), the D axis innermost ("arbitrary") with an f32 accumulator in VMEM; one
block step widens codes [bd, bf] to f32, multiplies each group of 32 rows by its scales
[bd / 32, bf] (exact: a 4-bit code times a float16 value), casts to x's dtype and runs one MXU
product [M, bd] x [bd, bf] with f32 accumulation. bf: 512, 256 or 128 where it divides F, else
512 with a partial last block (its columns past F are read as whatever lies there and their
outputs dropped: each output column reads only its own weights). bd: 512 or 256 where it
divides D (the scales' block needs whole 8-row sublane tiles: bd / 32 a multiple of 8), else D
whole. `MAX_ROWS` rows at most (decoding steps, verification blocks): a prompt's prefill is
compute bound and takes XLA's dot.

On a mesh GSPMD cannot split a Pallas call: `grouped_matmul_sharded` runs it under `shard_map`
(codes split over their outputs, a column-parallel matrix or a vocabulary-split head: each
chip's columns; over their inputs, a row-parallel matrix: each chip's partial products summed
over "model"). A `custom_partitioning` rule would let GSPMD place it, but its partitioner is a
Python callback that a deviceless TPU compile cannot reach ("Custom emitter for
CustomSPMDPartitioning not found"), so it could not be checked here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from vocabjax.kernels.blocks import GROUP
MAX_ROWS = 256  # rows of x the kernel takes; more: XLA's dot (`fits`)
_BF = (512, 256, 128)
_BD = (512, 256)


def blocks_for(D: int, F: int) -> tuple[int, int]:
  """(bd, bf) for a [D, F] weight (module doc)."""
  bf = next((b for b in _BF if F % b == 0), 512)
  bd = next((b for b in _BD if D % b == 0), D)
  return bd, bf


def fits(M: int, D: int, F: int) -> bool:
  """Whether the kernel takes x [M, D] times a [D, F] weight: M <= MAX_ROWS, D whole groups of
  32 with whole 8-row tiles of scales, or D under 4,096 whole (its block)."""
  if not 0 < M <= MAX_ROWS or D % GROUP:
    return False
  bd, _ = blocks_for(D, F)
  return bd != D or D <= 4096


def _kernel(x_ref, q_ref, s_ref, o_ref, acc_ref, *, nk: int):
  k = pl.program_id(1)

  @pl.when(k == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  bd, bf = q_ref.shape
  q = q_ref[...].astype(jnp.float32).reshape(bd // GROUP, GROUP, bf)
  w = (q * s_ref[...][:, None, :]).reshape(bd, bf).astype(x_ref.dtype)
  acc_ref[...] += jnp.dot(x_ref[...], w, preferred_element_type=jnp.float32)

  @pl.when(k == nk - 1)
  def _():
    o_ref[...] = acc_ref[...]


def _call(x, codes, scales, interpret: bool = False):
  """The kernel on one device: x [M, D] (bf16 or f32), codes [D, F], scales [D / 32, F]."""
  from jax.experimental.pallas import tpu as pltpu

  M, D = x.shape
  F = codes.shape[1]
  bd, bf = blocks_for(D, F)
  nk = D // bd
  return pl.pallas_call(
      functools.partial(_kernel, nk=nk),
      grid=(pl.cdiv(F, bf), nk),
      in_specs=[pl.BlockSpec((M, bd), lambda j, k: (0, k)),
                pl.BlockSpec((bd, bf), lambda j, k: (k, j)),
                pl.BlockSpec((bd // GROUP, bf), lambda j, k: (k, j))],
      out_specs=pl.BlockSpec((M, bf), lambda j, k: (0, j)),
      out_shape=jax.ShapeDtypeStruct((M, F), jnp.float32),
      scratch_shapes=[pltpu.VMEM((M, bf), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      interpret=interpret)(x, codes, scales)


def grouped_matmul(x, codes, scales, *, interpret: bool = False):
  """x [M, D] . (codes * scales) [D, F] in f32 on a TPU (module doc); `interpret`: Pallas's
  interpreter (any backend; values only). ValueError when the shapes disagree or the kernel
  does not take them (`fits`)."""
  M, D = x.shape
  if codes.shape[0] != D or scales.shape != (D // GROUP, codes.shape[1]):
    raise ValueError(f"grouped_matmul: x {tuple(x.shape)}, codes {tuple(codes.shape)} and "
                     f"scales {tuple(scales.shape)} do not fit (codes [D, F], scales "
                     f"[D / {GROUP}, F])")
  if not fits(M, D, codes.shape[1]):
    raise ValueError(f"grouped_matmul: {M} rows of width {D} are outside the kernel "
                     f"(at most {MAX_ROWS} rows, whole groups of {GROUP})")
  return _call(x, codes, scales, interpret=interpret)


def grouped_matmul_sharded(x, codes, scales, *, mesh, split: str | None,
                           interpret: bool = False):
  """`grouped_matmul` on a mesh, under `shard_map` (a Pallas call is one device's program,
  which GSPMD does not split): codes and scales split over "model" by their outputs (`split`
  "out": each chip's columns of y), by their inputs ("in": each chip's slice of x's width, the
  partial products summed over "model"), or whole (None: every chip computes y). x is whole
  on every chip (its rows gathered from "data")."""
  if split not in ("out", "in", None):
    raise ValueError(f"split={split!r}: 'out', 'in' or None")
  w = {"out": P(None, "model"), "in": P("model", None), None: P()}[split]
  xs = P(None, "model") if split == "in" else P()
  out = P(None, "model") if split == "out" else P()

  def local(x, codes, scales):
    y = _call(x, codes, scales, interpret=interpret)
    return jax.lax.psum(y, "model") if split == "in" else y

  return jax.shard_map(local, mesh=mesh, in_specs=(xs, w, w), out_specs=out,
                       check_vma=False)(x, codes, scales)
