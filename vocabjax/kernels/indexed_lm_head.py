"""Indexed LM head: logits of selected vocabulary rows only (SpecVocab's
`fused_batched_gather_dot` contract). Groundwork for issue 7: the pure-jnp reference and input
checks; the Pallas GPU/TPU kernels, their custom VJP and the dispatcher come with that issue.

Letters: B batch rows, D hidden size, V vocabulary, K selected rows per batch row.

    indexed_lm_head(h[B, D], U[V, D], idx[B, K]) -> z[B, K],   z[b, j] = U[idx[b, j]] . h[b]

accumulated in f32. Indices may repeat; an index outside [0, V) is an error (a kernel must never
read out of bounds), checked on the host by `check_indices` for concrete inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


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
  rows = jnp.take(U, idx, axis=0)  # [B, K, D]
  return jnp.einsum("BKD,BD->BK", rows, h, preferred_element_type=jnp.float32)
