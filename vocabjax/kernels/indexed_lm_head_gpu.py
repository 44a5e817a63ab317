"""The indexed LM head's GPU (Triton) kernel; contract and dispatch in
`vocabjax.kernels.indexed_lm_head`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vocabjax.kernels._indexed_common import _pad_k, check_indices, check_shapes


# --- GPU (Triton) ------------------------------------------------------------------------------

def _gpu_kernel(idx_ref, h_ref, u_ref, o_ref, *, D, V, block_k, block_d):
  from jax.experimental.pallas import triton as pltr

  b, j = pl.program_id(0), pl.program_id(1)
  rows = jnp.clip(idx_ref[b, pl.ds(j * block_k, block_k)], 0, V - 1)  # [block_k]

  def chunk(c, acc):
    cols = c * block_d + jnp.arange(block_d)
    inside = cols < D
    cols = jnp.minimum(cols, D - 1)  # masked anyway; keeps every address inside U
    hv = pltr.load(h_ref.at[b, cols], mask=inside, other=0.0)
    # one gathered [block_k, block_d] tile: each selected row is read once
    uv = pltr.load(u_ref.at[rows[:, None], cols[None, :]], mask=inside[None, :], other=0.0)
    return acc + jnp.sum(uv.astype(jnp.float32) * hv.astype(jnp.float32)[None, :], axis=1)

  acc = jax.lax.fori_loop(0, pl.cdiv(D, block_d), chunk, jnp.zeros((block_k,), jnp.float32))
  o_ref[b, pl.ds(j * block_k, block_k)] = acc


def indexed_lm_head_gpu(h, U, idx, *, block_k: int = 64, block_d: int = 128,
                        num_warps: int = 4, num_stages: int = 1,
                        interpret: bool = False) -> jax.Array:
  """The Triton kernel (see the module doc); `interpret=True` runs it on any backend.
  `num_stages` > 1 lets Triton pipeline the gathered loads of the d loop (untested on a GPU:
  the H200 tables were taken with 1)."""
  check_shapes(h, U, idx)
  check_indices(idx, U.shape[0])
  B, D = h.shape
  K = idx.shape[1]
  idx_p = _pad_k(idx, block_k)
  Kp = idx_p.shape[1]
  kernel = functools.partial(_gpu_kernel, D=D, V=U.shape[0], block_k=block_k, block_d=block_d)
  compiler_params = None
  if not interpret:
    from jax.experimental.pallas import triton as pltr
    compiler_params = pltr.CompilerParams(num_warps=num_warps, num_stages=num_stages)
  out = pl.pallas_call(
      kernel, grid=(B, Kp // block_k),
      out_shape=jax.ShapeDtypeStruct((B, Kp), jnp.float32),
      compiler_params=compiler_params, interpret=interpret,
      name="indexed_lm_head_gpu")(idx_p, h, U)
  return out[:, :K]
