"""Shared pieces of the indexed LM head's implementations: input checks, the XLA reference
and the padding of K (see `vocabjax.kernels.indexed_lm_head` for the contract)."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from vocabjax.kernels.gather import take_rows

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
  rows = take_rows(U, idx, mode="clip")  # [B, K, D]
  return jnp.einsum("BKD,BD->BK", rows, h, preferred_element_type=jnp.float32)


def _pad_k(idx: jax.Array, block_k: int) -> jax.Array:
  K = idx.shape[1]
  Kp = pl.cdiv(K, block_k) * block_k
  return jnp.pad(idx.astype(jnp.int32), ((0, 0), (0, Kp - K)))  # index 0: a valid row


