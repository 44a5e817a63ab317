"""Static-shape KV cache with per-row lengths.

Letters: L layers, B batch, S cache slots (S_max), N key/value heads, hd head dim.

Every forward call writes its T new entries at slots `lengths[b] .. lengths[b] + T - 1` and
advances `lengths` by T. Speculative decoding discards rejected entries by resetting `lengths`
(`with_lengths`); nothing is ever copied out. Slots at or past `lengths[b]` are garbage and are
masked out of attention, so right-padded prefill is exact.

Sliding-window layers (Gemma 3's local layers, `LlamaLikeConfig.layer_types`) keep only what
their window can still see: when `max_len` exceeds the window W by more than `RING_SLACK`, their
keys and values live in a ring of R = W + RING_SLACK slots per row (`k_local`, `v_local`),
linear slot s at ring slot s mod R, and `k`/`v` hold the global layers alone. A call's T new
entries overwrite the ring slots of slots s + T - R and older, which no query of the call or
later can see (a query at slot q sees q - W < s; R >= W + T - 1 is checked at trace time), and a
rollback (`with_lengths`) only moves `lengths`, as before. Uncommitted tree slots count against
the slack: a tree drafted into the cache over several calls must keep its nodes plus the next
call's block within RING_SLACK + 1 (the library's trees are far smaller). Below that size the
cache stays linear (every layer in `k`/`v`), which is always correct; a cache grown later
(`crossvocab._grow`) keeps the layout it was made with.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from vocabjax.models.config import LlamaLikeConfig

# Ring slots past the window that a sliding layer's ring keeps (module doc): the most tokens one
# call may add, plus uncommitted tree nodes.
RING_SLACK = 256


@functools.partial(jax.jit, static_argnums=(0, 1))
def _zeros(shape, dtype):
  # one compiled call per shape (eagerly: a dispatched broadcast per buffer, per generate call)
  return jnp.zeros(shape, dtype)


@struct.dataclass
class KVCache:
  """Per-layer keys and values in fixed buffers."""

  k: jax.Array  # [L, B, S, N, hd] keys, RoPE already applied (global layers only with a ring)
  v: jax.Array  # [L, B, S, N, hd] values
  lengths: jax.Array  # [B] int32: number of valid slots per row
  k_local: jax.Array | None = None  # [L_local, B, R, N, hd] sliding layers' ring (module doc)
  v_local: jax.Array | None = None

  @classmethod
  def init(cls, config: LlamaLikeConfig, batch_size: int, max_len: int,
           dtype=jnp.float32, ring_slack: int | None = None) -> "KVCache":
    """An empty cache of `max_len` slots per row; sliding layers in a ring of
    W + `ring_slack` (default `RING_SLACK`) slots when that is smaller (module doc)."""
    if max_len <= 0 or batch_size <= 0:
      raise ValueError(f"cache needs positive sizes, got {batch_size=} {max_len=}")
    dtype = jnp.dtype(dtype)
    slack = RING_SLACK if ring_slack is None else ring_slack
    tail = (config.num_kv_heads, config.head_dim)
    lengths = _zeros((batch_size,), jnp.dtype(jnp.int32))
    if config.has_sliding_layers and config.sliding_window + slack < max_len:
      n_local = sum(map(config.is_sliding, range(config.num_layers)))
      glob = (config.num_layers - n_local, batch_size, max_len, *tail)
      ring = (n_local, batch_size, config.sliding_window + slack, *tail)
      return cls(k=_zeros(glob, dtype), v=_zeros(glob, dtype), lengths=lengths,
                 k_local=_zeros(ring, dtype), v_local=_zeros(ring, dtype))
    shape = (config.num_layers, batch_size, max_len, *tail)
    return cls(k=_zeros(shape, dtype), v=_zeros(shape, dtype), lengths=lengths)

  @property
  def ring(self) -> int | None:
    """R, the sliding layers' ring slots, or None for a linear cache."""
    return None if self.k_local is None else self.k_local.shape[2]

  def buffers(self, config: LlamaLikeConfig, layer: int) -> tuple[str, int]:
    """Where decoder `layer` keeps its entries: ("local", index in k_local) for a sliding
    layer of a ring cache, else ("global", index in k)."""
    if self.k_local is None:
      return "global", layer
    sliding = config.is_sliding(layer)
    same = sum(config.is_sliding(i) == sliding for i in range(layer))
    return ("local" if sliding else "global"), same

  def kv_arrays(self) -> dict:
    """The K/V buffers by field name: k and v, and k_local and v_local when there is a ring."""
    names = ("k", "v") if self.k_local is None else ("k", "v", "k_local", "v_local")
    return {name: getattr(self, name) for name in names}

  def map_kv(self, fn, *others: "KVCache") -> "KVCache":
    """This cache with each K/V buffer x replaced by fn(x, ring, *the same buffer of each of
    `others`); `ring` is R for a sliding layers' ring buffer, None for the linear ones. The
    lengths are kept (`replace` them)."""
    R = self.ring
    return self.replace(**{
        name: fn(x, R if name.endswith("_local") else None, *(getattr(o, name) for o in others))
        for name, x in self.kv_arrays().items()})

  def rows(self, start: int, stop: int) -> "KVCache":
    """Rows start..stop-1 of every buffer."""
    return self.map_kv(lambda x, _: x[:, start:stop]).replace(
        lengths=self.lengths[start:stop])

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
    return sum(x.nbytes for x in self.kv_arrays().values())
