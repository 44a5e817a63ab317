"""Row gathers from an embedding or LM-head table that XLA:CPU does not widen (`take_rows`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vocabjax.kernels.blocks import dequantize, is_blocks


def take_rows(table: jax.Array, idx: jax.Array, mode: str | None = None,
              shards: int = 1) -> jax.Array:
  """`jnp.take(table, idx, axis=0, mode=mode)` (rows of an embedding or an LM head), without
  XLA:CPU widening the whole table on every call.

  XLA:CPU computes a bf16 / f16 gather in f32 by converting the table; inside a while loop (a
  drafter's or EAGLE head's steps, a ranked head's row gather) that convert of the loop-invariant
  table was hoisted out of the loop, so every step wrote the whole [V, D] table in f32
  (docs/engine.md, 'CPU speed'). On the CPU the table therefore passes through an optimization
  barrier together with the indices, so nothing computed from it is loop-invariant; the barrier
  is no computation. Other platforms and dtypes: `jnp.take`. GGUF blocks (`kernels.blocks`): the
  rows' bytes are gathered and dequantized (f32 rows). An int8 table (`quantize_int8`) off the
  CPU, split by rows over `shards` chips (`Lowering.model_shards`; 0: unknown): whole 32-row
  tiles (`_take_from_tiles`) where each chip's rows are whole tiles (else the tiles straddle
  chips and XLA gathers the table: Gemma-3-4B's 262,208 rows over 4 chips)."""
  if is_blocks(table):  # GGUF blocks: gather the rows' bytes, then widen only those rows
    return dequantize(table.take(idx, mode=mode))

  def take(t, i):
    return jnp.take(t, i, axis=0, mode=mode)

  if (table.dtype == jnp.int8 and table.ndim == 2 and shards > 0
      and table.shape[0] % (INT8_TILE_ROWS * shards) == 0):
    return jax.lax.platform_dependent(
        table, idx, cpu=take, default=lambda t, i: _take_from_tiles(t, i, mode))
  if table.dtype not in (jnp.bfloat16, jnp.float16):
    return take(table, idx)

  def tied(t, i):
    return take(*jax.lax.optimization_barrier((t, i)))

  return jax.lax.platform_dependent(table, idx, cpu=tied, default=take)


INT8_TILE_ROWS = 32  # XLA:TPU lays an int8 [V, D] table out in tiles of 32 rows


def _take_from_tiles(table: jax.Array, idx: jax.Array, mode: str | None) -> jax.Array:
  """`jnp.take(table, idx, axis=0, mode=mode)` of an int8 table [V, D] (an int8 model's
  embedding, `quantize_int8`; V whole tiles) as a take of whole 32-row tiles from the table
  viewed [V / 32, 32, D], each row picked out of its tile by a masked sum (one nonzero term:
  exact). XLA:TPU serves a take of single int8 rows by copying the whole table into another
  tiling on every call (an int8 Qwen2.5-0.5B's plain step: 136 MB written and read again for a
  136 MB embedding, kernels/results/tpu_bytes); whole tiles need no copy, and on a mesh the
  tiles split over "model" as the rows do (GSPMD's masked local gather). Indices as
  `jnp.take`'s (a "clip" mode clips; else negative ones count from the end and rows out of
  range are int8's fill, -128)."""
  V, n = table.shape[0], INT8_TILE_ROWS
  flat = idx.reshape(-1).astype(jnp.int32)
  if mode != "clip":  # numpy's negative indices count from the end
    flat = jnp.where(flat < 0, flat + V, flat)
  inside = (flat >= 0) & (flat < V)
  safe = jnp.clip(flat, 0, V - 1)
  tiles = jnp.take(table.reshape(V // n, n, table.shape[1]), safe // n, axis=0)  # [N, 32, D]
  pick = (jnp.arange(n)[None, :] == (safe % n)[:, None])[..., None]
  rows = jnp.where(pick, tiles.astype(jnp.float32), 0).sum(1).astype(jnp.int8)
  if mode != "clip":
    rows = jnp.where(inside[:, None], rows, jnp.int8(jnp.iinfo(jnp.int8).min))
  return rows.reshape(*idx.shape, table.shape[1])
