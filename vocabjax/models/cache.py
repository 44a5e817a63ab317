"""Static-shape KV cache with per-row lengths.

Letters: L layers, B batch, S cache slots (S_max), N key/value heads, hd head dim.

Every forward call writes its T new entries at slots `lengths[b] .. lengths[b] + T - 1` and
advances `lengths` by T. Speculative decoding discards rejected entries by resetting `lengths`
(`with_lengths`); nothing is ever copied out. Slots at or past `lengths[b]` are garbage and are
masked out of attention, so right-padded prefill is exact.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from vocabjax.models.config import LlamaLikeConfig


@functools.partial(jax.jit, static_argnums=(0, 1))
def _zeros(shape, dtype):
  # one compiled call per shape (eagerly: a dispatched broadcast per buffer, per generate call)
  return jnp.zeros(shape, dtype)


@struct.dataclass
class KVCache:
  """Per-layer keys and values in fixed buffers."""

  k: jax.Array  # [L, B, S, N, hd] keys, RoPE already applied
  v: jax.Array  # [L, B, S, N, hd] values
  lengths: jax.Array  # [B] int32: number of valid slots per row

  @classmethod
  def init(cls, config: LlamaLikeConfig, batch_size: int, max_len: int,
           dtype=jnp.float32) -> "KVCache":
    if max_len <= 0 or batch_size <= 0:
      raise ValueError(f"cache needs positive sizes, got {batch_size=} {max_len=}")
    shape = (config.num_layers, batch_size, max_len, config.num_kv_heads, config.head_dim)
    dtype = jnp.dtype(dtype)
    return cls(k=_zeros(shape, dtype), v=_zeros(shape, dtype),
               lengths=_zeros((batch_size,), jnp.dtype(jnp.int32)))

  @property
  def batch_size(self) -> int:
    return self.k.shape[1]

  @property
  def max_len(self) -> int:
    """S_max, the number of slots per row."""
    return self.k.shape[2]

  def with_lengths(self, lengths: jax.Array) -> "KVCache":
    """Keep the first `lengths[b]` slots of each row (rollback of rejected drafts)."""
    return self.replace(lengths=jnp.asarray(lengths, jnp.int32))

  def nbytes(self) -> int:
    return self.k.nbytes + self.v.nbytes
