"""The indexed LM head's TPU (Mosaic) kernel; contract and dispatch in
`vocabjax.kernels.indexed_lm_head`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vocabjax.kernels._indexed_common import _pad_k, check_indices, check_shapes


# --- TPU (Mosaic) ------------------------------------------------------------------------------

def _tpu_kernel(idx_smem, h_ref, u_hbm, o_ref, buf, sem, *, V, block_k):
  from jax.experimental.pallas import tpu as pltpu

  b, j = pl.program_id(0), pl.program_id(1)
  base = b * (pl.num_programs(1) * block_k) + j * block_k

  def copy(r):
    row = jnp.clip(idx_smem[base + r], 0, V - 1)
    return pltpu.make_async_copy(u_hbm.at[pl.ds(row, 1)], buf.at[pl.ds(r, 1)], sem)

  @pl.loop(0, block_k)
  def _(r):
    copy(r).start()

  @pl.loop(0, block_k)
  def _(r):
    copy(r).wait()

  z = jax.lax.dot_general(h_ref[...], buf[...], (((1,), (1,)), ((), ())),
                          preferred_element_type=jnp.float32)  # [1, block_k]
  o_ref[...] = z


def indexed_lm_head_tpu(h, U, idx, *, block_k: int = 256, interpret: bool = False) -> jax.Array:
  """The Mosaic kernel (see the module doc); `interpret=True` simulates it (DMAs included) on
  the CPU. block_k must be a multiple of 128 (the lane width of the output tile)."""
  from jax.experimental.pallas import tpu as pltpu

  check_shapes(h, U, idx)
  check_indices(idx, U.shape[0])
  if block_k % 128:
    raise ValueError(f"block_k={block_k} must be a multiple of 128 on TPU")
  B, D = h.shape
  K = idx.shape[1]
  idx_p = _pad_k(idx, block_k)
  nk = idx_p.shape[1] // block_k
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(B, nk),
      in_specs=[pl.BlockSpec((None, 1, D), lambda b, j, idx: (b, 0, 0)),
                pl.BlockSpec(memory_space=pltpu.MemorySpace.HBM)],
      out_specs=pl.BlockSpec((None, 1, block_k), lambda b, j, idx: (b, 0, j)),
      scratch_shapes=[pltpu.VMEM((block_k, D), U.dtype), pltpu.SemaphoreType.DMA(())])
  out = pl.pallas_call(
      functools.partial(_tpu_kernel, V=U.shape[0], block_k=block_k),
      grid_spec=grid_spec,
      out_shape=jax.ShapeDtypeStruct((B, 1, nk * block_k), jnp.float32),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      interpret=pltpu.InterpretParams() if interpret else False,
      name="indexed_lm_head_tpu")(idx_p.reshape(-1), h[:, None, :], U)
  return out[:, 0, :K]
