"""The indexed LM head's GPU (Triton) kernel; contract and dispatch in
`vocabjax.kernels.indexed_lm_head`.

    indexed_lm_head_gpu(h[B, D], U[V, D], idx[B, K]) -> z[B, K] f32

Grid (B, K / block_k, split_d): a program loads its block_k row indices once, then walks its
share of D in aligned, contiguous chunks of block_d (one vectorized load per row and chunk,
which Triton's pipeliner can prefetch; masked, never clamped, where D fits no power-of-two block
>= 16), accumulating in f32. `variant`: "fma" (a 2-D accumulator reduced once at the end) or
"dot" (an MMA against h padded to 16 columns). `split_d` > 1 splits D over a third grid axis
(partial sums added by XLA). `persist` = P > 0: P programs share the (tile, chunk) iterations in
equal contiguous ranges, a tile cut by a range boundary summed from the two slots of a
[2, B, K] output in a fixed order (deterministic). Why so: docs/engine.md, 'The indexed LM
head's GPU and TPU kernels'.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vocabjax.kernels._indexed_common import _pad_k, check_indices, check_shapes

VARIANTS = ("fma", "dot")
_MMA_N = 16  # Triton's smallest dot operand dimension


def aligned_block_d(D: int, block_d: int) -> int:
  """The largest power of two <= block_d that divides D, if one >= 16 exists (loads stay
  unmasked and aligned), else block_d itself (the loads are masked past D)."""
  bd = 1 << (max(block_d, 1).bit_length() - 1)
  while bd >= 16:
    if D % bd == 0:
      return bd
    bd //= 2
  return block_d


def _tile(h_ref, u_ref, b, rows, c, *, D, block_d):
  """(U tile [block_k, block_d] of `rows`, h chunk [block_d] of row b) at chunk c, in the
  inputs' dtype: aligned contiguous slices, or masked past D (never clamped)."""
  from jax.experimental.pallas import triton as pltr

  start = pl.multiple_of(c * block_d, block_d)
  if D % block_d == 0:
    return u_ref[rows, pl.ds(start, block_d)], h_ref[b, pl.ds(start, block_d)]
  cols = start + jnp.arange(block_d)
  inside = cols < D  # masked past D: the addresses beyond are never read
  hv = pltr.load(h_ref.at[b, cols], mask=inside, other=0.0)
  uv = pltr.load(u_ref.at[rows[:, None], cols[None, :]], mask=inside[None, :], other=0.0)
  return uv, hv


def _accumulator(block_k, block_d, variant):
  """(the f32 accumulator's initial value, add(acc, U tile, h chunk) -> acc): "dot" an MMA
  against h in column 0 of 16 (acc [block_k, 16], the other columns stay zero), "fma"
  elementwise (acc [block_k, block_d]). Call it outside the loop (the MMA's column mask is
  built here once)."""
  if variant == "dot":
    from jax.experimental.pallas import triton as pltr

    first = (jnp.arange(_MMA_N) == 0)[None, :]

    def add(acc, uv, hv):
      hm = jnp.where(first, hv[:, None], jnp.zeros((), hv.dtype)).astype(uv.dtype)
      return acc + pltr.dot(uv, hm, allow_tf32=False)

    return jnp.zeros((block_k, _MMA_N), jnp.float32), add

  def add(acc, uv, hv):
    return acc + uv.astype(jnp.float32) * hv.astype(jnp.float32)[None, :]

  return jnp.zeros((block_k, block_d), jnp.float32), add


def _gpu_kernel(idx_ref, h_ref, u_ref, o_ref, *, D, V, block_k, block_d, chunks_per_split,
                variant):
  b, j, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  rows = jnp.clip(idx_ref[b, pl.ds(j * block_k, block_k)], 0, V - 1)  # [block_k]
  n_chunks = pl.cdiv(D, block_d)
  c0 = s * chunks_per_split
  c1 = jnp.minimum(c0 + chunks_per_split, n_chunks)
  acc0, add = _accumulator(block_k, block_d, variant)

  def chunk(c, acc):
    return add(acc, *_tile(h_ref, u_ref, b, rows, c, D=D, block_d=block_d))

  acc = jax.lax.fori_loop(c0, c1, chunk, acc0)
  o_ref[s, b, pl.ds(j * block_k, block_k)] = jnp.sum(acc, axis=1)


def _persistent_kernel(idx_ref, h_ref, u_ref, o_ref, *, D, V, block_k, block_d, n_tiles,
                       k_blocks, programs, variant):
  p = pl.program_id(0)
  nc = pl.cdiv(D, block_d)
  start, end = persistent_range(p, n_tiles * nc, programs)
  acc0, add = _accumulator(block_k, block_d, variant)

  def body(it, acc):
    t, c = it // nc, it % nc
    b, j = t // k_blocks, t % k_blocks
    rows = jnp.clip(idx_ref[b, pl.ds(pl.multiple_of(j * block_k, block_k), block_k)], 0, V - 1)
    acc = add(acc, *_tile(h_ref, u_ref, b, rows, c, D=D, block_d=block_d))
    done = (c == nc - 1) | (it == end - 1)  # the tile ends here, or this program's range does

    @pl.when(done)
    def _():
      out = pl.ds(pl.multiple_of(j * block_k, block_k), block_k)
      holds_start = t * nc >= start
      o_ref[jnp.where(holds_start, 0, 1), b, out] = jnp.sum(acc, axis=1)

      @pl.when(holds_start & (c == nc - 1))  # the whole tile was here: nothing to add
      def _():
        o_ref[1, b, out] = jnp.zeros((block_k,), jnp.float32)

    return jnp.where(done, 0.0, acc)

  jax.lax.fori_loop(start, end, body, acc0)


def persistent_range(p, total: int, programs: int):
  """[start, end) of program p's (tile, chunk) iterations among `total` split over `programs`:
  the first total % programs ranges one longer. p may be traced (int32: no product of p with
  `total`, which would overflow for large grids)."""
  q, r = divmod(total, programs)
  start = p * q + (p < r) * p + (p >= r) * r
  return start, start + q + (p < r)


def tiles(B: int, K: int, block_k: int) -> int:
  """The kernel's (row, block of block_k indices) tiles for B rows of K indices each."""
  return B * pl.cdiv(K, block_k)


def programs(B: int, D: int, K: int, config: dict) -> int:
  """Programs in the kernel's grid for (B, D, K) and a configuration (`indexed_lm_head_gpu`'s
  keyword arguments; those left out take its defaults)."""
  c = {**_defaults(), **config}
  n_tiles = tiles(B, K, c["block_k"])
  if c["persist"]:
    return min(c["persist"], n_tiles)
  n_chunks = pl.cdiv(D, aligned_block_d(D, c["block_d"]))
  cps = pl.cdiv(n_chunks, c["split_d"])
  return n_tiles * pl.cdiv(n_chunks, cps)


def _defaults() -> dict:
  """`indexed_lm_head_gpu`'s keyword defaults (block_k, block_d, ..., persist)."""
  import inspect
  return {n: p.default for n, p in inspect.signature(indexed_lm_head_gpu).parameters.items()
          if p.default is not inspect.Parameter.empty}


def indexed_lm_head_gpu(h, U, idx, *, block_k: int = 64, block_d: int = 128,
                        num_warps: int = 4, num_stages: int = 3, split_d: int = 1,
                        variant: str = "fma", persist: int = 0,
                        interpret: bool = False) -> jax.Array:
  """The Triton kernel (module doc); `interpret=True` runs it on any backend. block_d is
  lowered to a power of two dividing D where one >= 16 exists (`aligned_block_d`)."""
  check_shapes(h, U, idx)
  check_indices(idx, U.shape[0])
  if variant not in VARIANTS:
    raise ValueError(f"variant={variant!r} is not one of {VARIANTS}")
  if block_k < 16 or block_k & (block_k - 1):
    raise ValueError(f"block_k={block_k} must be a power of two >= 16")
  if block_d < 16 or block_d & (block_d - 1):
    raise ValueError(f"block_d={block_d} must be a power of two >= 16")
  B, D = h.shape
  K = idx.shape[1]
  block_d = aligned_block_d(D, block_d)
  n_chunks = pl.cdiv(D, block_d)
  if not 1 <= split_d <= n_chunks:
    raise ValueError(f"split_d={split_d} must be in [1, {n_chunks}] (D={D} in chunks of "
                     f"block_d={block_d})")
  if persist < 0 or (persist and split_d != 1):
    raise ValueError(f"persist={persist} must be 0 (one program per tile) or a program count "
                     f"> 0 with split_d=1 (got split_d={split_d})")
  cps = pl.cdiv(n_chunks, split_d)
  split_d = pl.cdiv(n_chunks, cps)  # no empty split
  idx_p = _pad_k(idx, block_k)
  Kp = idx_p.shape[1]
  compiler_params = None
  if not interpret:
    from jax.experimental.pallas import triton as pltr
    compiler_params = pltr.CompilerParams(num_warps=num_warps, num_stages=num_stages)
  if persist:
    n_tiles = tiles(B, K, block_k)  # = B * (Kp // block_k)
    P = min(persist, n_tiles)  # every range at least a tile long: a tile meets <= 2 programs
    kernel = functools.partial(_persistent_kernel, D=D, V=U.shape[0], block_k=block_k,
                               block_d=block_d, n_tiles=n_tiles, k_blocks=Kp // block_k,
                               programs=P, variant=variant)
    grid, slots = (P,), 2
  else:
    kernel = functools.partial(_gpu_kernel, D=D, V=U.shape[0], block_k=block_k,
                               block_d=block_d, chunks_per_split=cps, variant=variant)
    grid, slots = (B, Kp // block_k, split_d), split_d
  out = pl.pallas_call(
      kernel, grid=grid, out_shape=jax.ShapeDtypeStruct((slots, B, Kp), jnp.float32),
      compiler_params=compiler_params, interpret=interpret,
      name="indexed_lm_head_gpu")(idx_p, h, U)
  out = out[0] if slots == 1 else (out[0] + out[1] if slots == 2 else jnp.sum(out, axis=0))
  return out[:, :K]
