"""The indexed LM head's TPU (Mosaic) kernel; contract and dispatch in
`vocabjax.kernels.indexed_lm_head`.

Letters: B batch rows, D hidden size, V vocabulary, K selected rows per batch row; P rows per
packed sublane word (1 for 32-bit U, 2 for bf16/f16, 4 for 8-bit types).

U stays in HBM in XLA's own layout (reshaping it would relayout the whole table on every call).
For each index the kernel DMAs the aligned group of P rows holding it ([row & -P, +P): a DMA
moves whole 32-bit words and Mosaic slices packed dtypes on multiples of P) into a
double-buffered [P*block_k, D] VMEM tile, indices scalar-prefetched into SMEM; grid
(B, K / block_k), block j+1's DMAs start before block j's product, one MXU product
[1, D] x [D, P*block_k] per block; the wrapper keeps each candidate's row of its group. Indices
are clamped into [0, V) and K padded to a multiple of block_k with index 0 in the wrapper, so the
kernel never reads out of bounds; the last V % P rows, if any, are scored by the wrapper in XLA.
Why so: docs/engine.md, 'The indexed LM head's GPU and TPU kernels'.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vocabjax.kernels._indexed_common import _pad_k, check_indices, check_shapes


# --- TPU (Mosaic) ------------------------------------------------------------------------------

def _tpu_kernel(idx_smem, h_ref, u_hbm, o_ref, buf, sem, *, block_k: int, pack: int):
  """One (b, j) step. idx_smem: int32[B * Kp] clamped indices (SMEM); h_ref: [1, D] (VMEM);
  u_hbm: U[V, D] (HBM); o_ref: f32[1, pack * block_k]; buf: [2, pack * block_k, D] (VMEM);
  sem: DMA semaphores [2], one per slot of buf."""
  from jax.experimental.pallas import tpu as pltpu

  b, j, nj = pl.program_id(0), pl.program_id(1), pl.num_programs(1)

  def group_copy(jj, slot, r):
    # candidate r of block jj: its P-row group of U -> rows [r*P, r*P + P) of the slot. The
    # group start is row & -P (row >= 0: one scalar op, where signed // needs sign fix-ups)
    row = idx_smem[(b * nj + jj) * block_k + r]
    start = row if pack == 1 else pl.multiple_of(jnp.bitwise_and(row, -pack), pack)
    dst = pl.ds(pl.multiple_of(r * pack, pack), pack)
    return pltpu.make_async_copy(u_hbm.at[pl.ds(start, pack)], buf.at[slot, dst], sem.at[slot])

  def start_block(jj, slot):
    @pl.loop(0, block_k)
    def _(r):
      group_copy(jj, slot, r).start()

  slot = jnp.bitwise_and(j, 1)

  @pl.when(j == 0)  # the first block of this b: nothing was prefetched for it
  def _():
    start_block(0, 0)

  @pl.when(j + 1 < nj)  # prefetch block j+1 into the other slot, read by step j-1 (done)
  def _():
    start_block(j + 1, 1 - slot)

  # block_k copies of P*D elements each signalled sem[slot]; a wait consumes one copy's bytes,
  # so any descriptor of that size will do (row 0: no index to read again)
  @pl.loop(0, block_k)
  def _(r):
    pltpu.make_async_copy(u_hbm.at[pl.ds(0, pack)], buf.at[slot, pl.ds(0, pack)],
                          sem.at[slot]).wait()

  o_ref[...] = jax.lax.dot_general(h_ref[...], buf[slot], (((1,), (1,)), ((), ())),
                                   preferred_element_type=jnp.float32)  # [1, P * block_k]


def _rows_per_word(dtype) -> int:
  """P: how many rows of U share one 32-bit word in TPU memory (the DMA's row granularity)."""
  return max(1, 4 // jnp.dtype(dtype).itemsize)


def indexed_lm_head_tpu(h, U, idx, *, block_k: int = 256, interpret: bool = False) -> jax.Array:
  """The Mosaic kernel (see the module doc): h[B, D], U[V, D], idx[B, K] -> z[B, K] f32.
  `interpret=True` simulates it (DMAs and semaphores included) on the CPU. block_k must be a
  multiple of 128 (the lane width of the output tile). The VMEM double buffer takes
  2 * P * block_k * D * itemsize = 8 * block_k * D bytes whatever U's dtype: with block_k=256,
  D = 8192 still compiles for v5e, D = 10240 exceeds its scoped VMEM (Mosaic refuses it)."""
  from jax.experimental.pallas import tpu as pltpu

  check_shapes(h, U, idx)
  check_indices(idx, U.shape[0])
  if block_k % 128:
    raise ValueError(f"block_k={block_k} must be a multiple of 128 on TPU")
  B, D = h.shape
  V, K = U.shape[0], idx.shape[1]
  P = _rows_per_word(U.dtype)
  V_main = V - V % P  # rows in complete P-row groups: the kernel's part of U
  idx = jnp.clip(idx.astype(jnp.int32), 0, V - 1)  # traced indices may be anything

  if V_main:
    idx_p = _pad_k(jnp.minimum(idx, V_main - 1), block_k)  # [B, Kp]
    Kp = idx_p.shape[1]
    nk = Kp // block_k
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(B, nk),
        in_specs=[pl.BlockSpec((None, 1, D), lambda b, j, idx: (b, 0, 0)),
                  pl.BlockSpec(memory_space=pltpu.MemorySpace.HBM)],
        out_specs=pl.BlockSpec((None, 1, P * block_k), lambda b, j, idx: (b, 0, j)),
        scratch_shapes=[pltpu.VMEM((2, P * block_k, D), U.dtype),
                        pltpu.SemaphoreType.DMA((2,))])
    out = pl.pallas_call(
        functools.partial(_tpu_kernel, block_k=block_k, pack=P),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((B, 1, P * Kp), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=pltpu.InterpretParams() if interpret else False,
        name="indexed_lm_head_tpu")(idx_p.reshape(-1), h[:, None, :], U)
    # lane r*P + s of out holds the logit of row s of candidate r's group: keep s = idx & (P-1).
    # Strided slices, not a [B, K, P] reshape: XLA would pad that minor dim of P to 128 lanes
    pos = jnp.bitwise_and(idx, P - 1)  # [B, K]
    z = out[:, 0, 0::P][:, :K]
    for s in range(1, P):
      z = jnp.where(pos == s, out[:, 0, s::P][:, :K], z)
  else:
    z = jnp.zeros((B, K), jnp.float32)

  if V_main < V:  # the incomplete last group (V % P rows), outside the kernel's reach
    z_tail = jnp.einsum("BD,TD->BT", h, U[V_main:], preferred_element_type=jnp.float32)
    t = jnp.take_along_axis(z_tail, jnp.maximum(idx - V_main, 0), axis=1)  # [B, K]
    z = jnp.where(idx >= V_main, t, z)
  return z
