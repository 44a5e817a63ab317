"""Row gathers from an embedding or LM-head table that XLA:CPU does not widen (`take_rows`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vocabjax.kernels.blocks import dequantize, is_blocks


def take_rows(table: jax.Array, idx: jax.Array, mode: str | None = None) -> jax.Array:
  """`jnp.take(table, idx, axis=0, mode=mode)` (rows of an embedding or an LM head), without
  XLA:CPU widening the whole table on every call.

  XLA:CPU computes a bf16 / f16 gather in f32 by converting the table; inside a while loop (a
  drafter's or EAGLE head's steps, a ranked head's row gather) that convert of the loop-invariant
  table was hoisted out of the loop, so every step wrote the whole [V, D] table in f32
  (docs/engine.md, 'CPU speed'). On the CPU the table therefore passes through an optimization
  barrier together with the indices, so nothing computed from it is loop-invariant; the barrier
  is no computation. Other platforms and dtypes: `jnp.take`. GGUF blocks (`kernels.blocks`): the
  rows' bytes are gathered and dequantized (f32 rows)."""
  if is_blocks(table):  # GGUF blocks: gather the rows' bytes, then widen only those rows
    return dequantize(table.take(idx, mode=mode))

  def take(t, i):
    return jnp.take(t, i, axis=0, mode=mode)

  if table.dtype not in (jnp.bfloat16, jnp.float16):
    return take(table, idx)

  def tied(t, i):
    return take(*jax.lax.optimization_barrier((t, i)))

  return jax.lax.platform_dependent(table, idx, cpu=tied, default=take)
