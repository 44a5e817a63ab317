"""Indexed LM head: logits of selected vocabulary rows only (SpecVocab's
`fused_batched_gather_dot`, Williams et al. 2026).

Letters: B batch rows, D hidden size, V vocabulary, K selected rows per batch row.

    indexed_lm_head(h[B, D], U[V, D], idx[B, K]) -> z[B, K] f32,   z[b, j] = U[idx[b, j]] . h[b]

Equivalent jnp (this is `indexed_lm_head_reference`):

    rows = jnp.take(U, idx, axis=0)                                        # [B, K, D]
    z = jnp.einsum("BKD,BD->BK", rows, h, preferred_element_type=jnp.float32)

XLA materializes `rows` (B*K*D values written, then read again); the Pallas kernels read each
selected row once, straight into the dot product, which is what makes the per-step speculative
vocabulary cheaper than the full head (V*D reads) when K << V:

  GPU (Triton): grid (B, K / block_k); a program loads its block_k indices, then walks D in
    chunks of block_d, gathering a [block_k, block_d] tile of U by pointer (masked past D) and
    accumulating the row-wise products in f32.
  TPU (Mosaic): the indices are scalar-prefetched into SMEM; grid (B, K / block_k); a program
    starts block_k row DMAs from U (left in HBM) into a VMEM tile, waits for them, and does one
    [1, D] x [D, block_k] MXU product.

K is padded to a multiple of block_k in the wrapper (with index 0) and the result sliced back.
Indices may repeat. An index outside [0, V) is an error for concrete inputs (`check_indices`);
under tracing the values are unknown, so the kernels clamp indices into [0, V): they never read
out of bounds, whatever they are given.

`indexed_lm_head` is the public entry: a `custom_vjp` (dh = sum_j g[b,j] U[idx[b,j]],
dU = scatter-add of g[b,j] h[b] into rows idx[b,j]) around a dispatcher that lowers to the GPU
kernel on CUDA/ROCm, the TPU kernel on TPU and the XLA reference elsewhere
(`jax.lax.platform_dependent`, decided when the program is lowered). `impl=` forces one:
"reference", "gpu", "tpu" (`interpret=True` runs a kernel's logic on the CPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

IMPLS = ("auto", "reference", "gpu", "tpu")


def check_shapes(h, U, idx) -> None:
  """Raise ValueError naming the mismatch when the shapes do not fit the contract."""
  if h.ndim != 2 or U.ndim != 2 or idx.ndim != 2:
    raise ValueError(f"indexed_lm_head takes h[B, D], U[V, D], idx[B, K]; got h{h.shape}, "
                     f"U{U.shape}, idx{idx.shape}")
  if h.shape[1] != U.shape[1]:
    raise ValueError(f"hidden size of h ({h.shape[1]}) differs from U's rows ({U.shape[1]})")
  if idx.shape[0] != h.shape[0]:
    raise ValueError(f"idx has {idx.shape[0]} rows, h has {h.shape[0]}")
  if not jnp.issubdtype(idx.dtype, jnp.integer):
    raise ValueError(f"idx must be integer, got {idx.dtype}")


def check_indices(idx, vocab_size: int) -> None:
  """Raise ValueError if a concrete index lies outside [0, vocab_size) (no-op under tracing)."""
  if isinstance(idx, jax.core.Tracer):
    return
  a = np.asarray(idx)
  if a.size and (a.min() < 0 or a.max() >= vocab_size):
    bad = a[(a < 0) | (a >= vocab_size)].ravel()[0]
    raise ValueError(f"index {bad} is outside the vocabulary [0, {vocab_size})")


def indexed_lm_head_reference(h: jax.Array, U: jax.Array, idx: jax.Array) -> jax.Array:
  """XLA gather + einsum: reads the K selected rows per batch row, f32 accumulation."""
  check_shapes(h, U, idx)
  check_indices(idx, U.shape[0])
  rows = jnp.take(U, idx, axis=0, mode="clip")  # [B, K, D]
  return jnp.einsum("BKD,BD->BK", rows, h, preferred_element_type=jnp.float32)


def _pad_k(idx: jax.Array, block_k: int) -> jax.Array:
  K = idx.shape[1]
  Kp = pl.cdiv(K, block_k) * block_k
  return jnp.pad(idx.astype(jnp.int32), ((0, 0), (0, Kp - K)))  # index 0: a valid row


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


# --- dispatch and gradient ---------------------------------------------------------------------

def _forward(h, U, idx, impl: str, interpret: bool):
  if impl == "reference":
    return indexed_lm_head_reference(h, U, idx)
  if impl == "gpu":
    return indexed_lm_head_gpu(h, U, idx, interpret=interpret)
  if impl == "tpu":
    return indexed_lm_head_tpu(h, U, idx, interpret=interpret)
  return jax.lax.platform_dependent(
      h, U, idx, default=indexed_lm_head_reference,
      cuda=indexed_lm_head_gpu, rocm=indexed_lm_head_gpu, tpu=indexed_lm_head_tpu)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _indexed(h, U, idx, impl, interpret):
  return _forward(h, U, idx, impl, interpret)


def _indexed_fwd(h, U, idx, impl, interpret):
  return _forward(h, U, idx, impl, interpret), (h, U, idx)


def _indexed_bwd(impl, interpret, res, g):
  del impl, interpret
  h, U, idx = res
  idx = jnp.clip(idx, 0, U.shape[0] - 1)
  rows = jnp.take(U, idx, axis=0)  # [B, K, D]
  dh = jnp.einsum("BK,BKD->BD", g, rows, preferred_element_type=jnp.float32)
  contrib = g[..., None] * h.astype(jnp.float32)[:, None, :]  # [B, K, D]
  dU = jnp.zeros(U.shape, jnp.float32).at[idx.reshape(-1)].add(
      contrib.reshape(-1, U.shape[1]))
  return dh.astype(h.dtype), dU.astype(U.dtype), np.zeros(idx.shape, jax.dtypes.float0)


_indexed.defvjp(_indexed_fwd, _indexed_bwd)


def indexed_lm_head(h: jax.Array, U: jax.Array, idx: jax.Array, *, impl: str = "auto",
                    interpret: bool = False) -> jax.Array:
  """z[b, j] = U[idx[b, j]] . h[b] in f32 (module doc); differentiable in h and U."""
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
  check_shapes(h, U, idx)
  check_indices(idx, U.shape[0])
  return _indexed(h, U, idx.astype(jnp.int32), impl, interpret)
