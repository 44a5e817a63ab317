"""`take_rows`: the rows `jnp.take` gives, and on the CPU a bf16 / f16 table is never widened
whole inside a loop (XLA:CPU's f32 gather hoisted the table's convert out of a drafter's loop:
the whole table written in f32 on every call of a step)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.kernels.gather import take_rows
from vocabjax.testing.hlo import materialized

V, D = 640, 48


def _loop(take):
  def f(table, idx):
    def body(i, acc):
      return acc + take(table, (idx + i) % V).astype(jnp.float32).sum(0)
    return jax.lax.fori_loop(0, 4, body, jnp.zeros((D,), jnp.float32))
  return jax.jit(f)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "int8"])
def test_rows_are_jnp_takes_and_a_loop_never_widens_the_table(dtype):
  rs = np.random.RandomState(0)
  table = jnp.asarray(rs.randn(V, D) * 10, dtype)
  idx = jnp.asarray([3, 0, V - 1, 17], jnp.int32)
  for mode in (None, "clip", "fill"):
    np.testing.assert_array_equal(np.asarray(take_rows(table, idx, mode=mode)),
                                  np.asarray(jnp.take(table, idx, axis=0, mode=mode)))
  bad = jnp.asarray([V + 2, -V - 1], jnp.int32)  # out of range: NaN for floats, as jnp.take
  np.testing.assert_array_equal(  # (numpy compares a bf16 NaN with itself only widened)
      np.asarray(take_rows(table, bad, mode="fill"), np.float32),
      np.asarray(jnp.take(table, bad, axis=0, mode="fill"), np.float32))
  ours, plain = (_loop(f).lower(table, idx).compile()
                 for f in (take_rows, lambda t, i: jnp.take(t, i, axis=0)))
  np.testing.assert_array_equal(np.asarray(ours(table, idx)), np.asarray(plain(table, idx)))
  assert not materialized(ours.as_text(), (V, D))
  if dtype == "bfloat16":  # what the barrier prevents: jnp.take's loop widens the whole table
    assert materialized(plain.as_text(), (V, D), "f32")


def test_the_indexed_heads_xla_path_in_a_loop_reads_rows_only():
  """SpecVocab's head on the CPU (XLA's gather + dot, `indexed_lm_head_reference`) inside a
  drafting loop over a bf16 head: the K rows are gathered, the [V, D] head is never widened."""
  from vocabjax.kernels.indexed_lm_head import indexed_lm_head

  U = jnp.asarray(np.random.RandomState(1).randn(V, D), jnp.bfloat16)
  h = jnp.ones((2, D), jnp.float32)

  def f(U, h):
    def body(i, acc):
      idx = (jnp.arange(16)[None, :] * 7 + i + jnp.arange(2)[:, None]) % V
      return acc + indexed_lm_head(h, U, idx, impl="reference").sum()
    return jax.lax.fori_loop(0, 3, body, jnp.float32(0))

  txt = jax.jit(f).lower(U, h).compile().as_text()
  assert not materialized(txt, (V, D))


def test_materialized_can_name_the_dtype():
  """XLA:GPU's merged q / k / v weights of a tiny test model (a recorded H200 run) have the
  tiny table's shape in bf16: the widened-table checks name f32 and do not take them for it."""
  hlo = """ENTRY %main.73 (p0: bf16[32,32], p1: bf16[16,32], p2: bf16[16,32]) -> f32[64,32] {
  %p0 = bf16[32,32]{1,0} parameter(0)
  %wrapped_concatenate = bf16[64,32]{1,0} fusion(%p0, %p1, %p2), kind=kLoop, calls=%wc
  ROOT %convert.1 = f32[64,32]{1,0} convert(%wrapped_concatenate)
}"""
  assert [i for _, i, _ in materialized(hlo, (64, 32))] == ["wrapped_concatenate", "convert.1"]
  assert materialized(hlo, (64, 32), "bf16") == [("main.73", "wrapped_concatenate", "fusion")]
  assert materialized(hlo, (64, 32), "f32") == [("main.73", "convert.1", "convert")]
  assert not materialized(hlo, (64, 32), "s8")


@pytest.mark.parametrize("mode", [None, "clip"])
def test_int8_rows_from_whole_tiles_are_jnp_takes(mode):
  """An int8 table's rows off the CPU come from whole 32-row tiles (`_take_from_tiles`; XLA:TPU
  would copy the whole table into another tiling for single rows): the same rows as
  `jnp.take`, negative and out-of-range indices included."""
  from vocabjax.kernels.gather import INT8_TILE_ROWS, _take_from_tiles

  table = jnp.asarray(np.random.default_rng(0).integers(-127, 128, (3 * INT8_TILE_ROWS, 16)),
                      jnp.int8)
  idx = jnp.asarray([[0, 31, 32, 95, 94, 67], [5, -1, 96, 64, -96, -97]])
  got = _take_from_tiles(table, idx, mode)
  assert got.dtype == jnp.int8 and got.shape == (2, 6, 16)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.take(table, idx, axis=0,
                                                                     mode=mode)))
