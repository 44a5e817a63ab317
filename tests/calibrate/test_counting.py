"""Sharded token counting equals numpy's bincount on 1 and 8 devices, uneven shards, padding."""

import jax
import numpy as np
import pytest

from vocabjax.calibrate import TokenCounter, count_tokens, token_mesh


@pytest.mark.parametrize("n_devices", [1, 8])
@pytest.mark.parametrize("n_tokens,chunk", [(0, 16), (1, 16), (7, 16), (129, 16),
                                            (1000, 64), (5003, 1 << 10)])
def test_counts_equal_bincount(n_devices, n_tokens, chunk):
  assert jax.device_count() >= n_devices
  V = 97
  ids = np.random.RandomState(n_tokens).randint(0, V, n_tokens)
  ids[:min(3, n_tokens)] = V - 1  # the last id sits next to the padding sentinel (V)
  got = count_tokens(ids, V, mesh=token_mesh(jax.devices()[:n_devices]), chunk=chunk)
  assert got.dtype == np.int64
  np.testing.assert_array_equal(got, np.bincount(ids, minlength=V))


def test_accumulates_over_calls_of_uneven_sizes():
  V = 50
  rs = np.random.RandomState(0)
  parts = [rs.randint(0, V, n) for n in (3, 0, 333, 17, 1)]
  c = TokenCounter(V, mesh=token_mesh(), chunk=8)  # 8 devices x 8 = 64 tokens per block
  for p in parts:
    c.add(p)
  np.testing.assert_array_equal(c.counts, np.bincount(np.concatenate(parts), minlength=V))
  assert c.total == 354


def test_ids_outside_the_vocabulary_are_an_error():
  with pytest.raises(ValueError, match="token id 10 is outside the vocabulary"):
    count_tokens([1, 10, 2], 10)
  with pytest.raises(ValueError, match="token id -1"):
    count_tokens([-1], 10)
