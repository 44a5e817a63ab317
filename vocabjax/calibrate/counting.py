"""Token counting sharded over every device: each device bincounts its shard, one `psum`.

Letters: V vocabulary, W devices (all of them, every process's under `jax.distributed`), C
a chunk: tokens per device per call.

`TokenCounter.add(ids)` takes this process's token ids (any length), pads them to whole
[n_local, C] blocks with the sentinel V (an extra bin, dropped), and runs one compiled program
per block: `shard_map` over a 1-D "tokens" mesh of all devices, a local bincount on each device
(int32: a block holds at most W*C < 2^31 tokens) and a `psum`, so every device ends with the
global counts of that block. The host accumulates them in int64. Multi-host: every process calls
`add` with its own tokens; the processes first agree on the number of blocks (the largest
process's), and the shorter ones feed sentinel-only blocks, so the collectives line up.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = "tokens"


def token_mesh(devices=None) -> Mesh:
  """A 1-D mesh over `devices` (default: every device of every process)."""
  return Mesh(np.asarray(jax.devices() if devices is None else devices), (AXIS,))


@functools.lru_cache(maxsize=None)
def _count_fn(mesh: Mesh, vocab_size: int):
  def local(ids):  # [C] on one device -> [V + 1] counts of the whole block after psum
    counts = jnp.zeros((vocab_size + 1,), jnp.int32).at[ids].add(1, mode="drop")
    return jax.lax.psum(counts, AXIS)

  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(AXIS), out_specs=P()))


class TokenCounter:
  """Accumulates int64 counts [V] of token ids over any number of `add` calls."""

  def __init__(self, vocab_size: int, *, mesh: Mesh | None = None, chunk: int = 1 << 18):
    if vocab_size < 1:
      raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    self.V, self.chunk = int(vocab_size), int(chunk)
    self.mesh = mesh or token_mesh()
    self.counts = np.zeros(self.V, np.int64)
    self._fn = _count_fn(self.mesh, self.V)
    self._sharding = NamedSharding(self.mesh, P(AXIS))
    self._local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]

  @property
  def total(self) -> int:
    return int(self.counts.sum())

  def add(self, ids) -> None:
    """Count this process's `ids` (ints in [0, V)); out-of-range ids are an error."""
    ids = np.asarray(ids, np.int64).ravel()
    if ids.size and (ids.min() < 0 or ids.max() >= self.V):
      bad = ids[(ids < 0) | (ids >= self.V)][0]
      raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.V}): counts made "
                       f"with another tokenizer?")
    per_block = len(self._local) * self.chunk
    blocks = -(-ids.size // per_block)
    if jax.process_count() > 1:  # every process must run the same number of collectives
      from jax.experimental import multihost_utils
      blocks = int(np.max(multihost_utils.process_allgather(np.asarray(blocks))))
    padded = np.full(blocks * per_block, self.V, np.int32)
    padded[:ids.size] = ids
    for b in range(blocks):
      block = padded[b * per_block:(b + 1) * per_block]
      arr = jax.make_array_from_process_local_data(self._sharding, block)
      self.counts += np.asarray(self._fn(arr))[:self.V].astype(np.int64)


def count_tokens(ids, vocab_size: int, *, mesh: Mesh | None = None,
                 chunk: int = 1 << 18) -> np.ndarray:
  """int64 counts [V] of `ids` (one call of `TokenCounter`)."""
  c = TokenCounter(vocab_size, mesh=mesh, chunk=chunk)
  c.add(ids)
  return c.counts
