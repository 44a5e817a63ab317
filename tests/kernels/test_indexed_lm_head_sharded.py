"""SpecVocab's indexed LM head on a mesh (`indexed_lm_head_sharded`): under shard_map over a
vocabulary-split LM head each device computes the candidates whose rows it owns and one sum
gives the exact logits. Checked against the one-device reference on the 8 virtual CPU devices
(XLA's gather in the shard_map on every mesh shape; the Pallas kernels in interpret mode on 4 of
them: interpret mode's simulated devices wait on one another, and 8 of them do not all run at
once on a 2-core host's thread pool), and compiled for TPU slices without a TPU (Mosaic's real
checks; each chip holds its quarter of the head)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vocabjax import sharding
from vocabjax.kernels.indexed_lm_head import (indexed_lm_head_reference,
                                              indexed_lm_head_sharded)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices: run via pytest "
                                "(tests/conftest.py sets XLA_FLAGS)")


def _inputs(B=4, K=48, D=128, V=1024, dtype=jnp.float32, seed=0):
  rs = np.random.RandomState(seed)
  idx = rs.randint(0, V, (B, K))
  idx[0, :4] = [0, V - 1, V // 2, V // 2 - 1]  # each shard's edges
  return (jnp.asarray(rs.randn(B, D), dtype), jnp.asarray(rs.randn(V, D), dtype),
          jnp.asarray(idx, jnp.int32))


@pytest.mark.parametrize("data,model", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_every_mesh_gives_the_one_device_logits(data, model):
  h, U, idx = _inputs()
  mesh = sharding.make_mesh(data=data, model=model)
  got = jax.jit(lambda a, b, c: indexed_lm_head_sharded(a, b, c, mesh=mesh, impl="reference"))(
      h, U, idx)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(indexed_lm_head_reference(h, U, idx)))
  # rows split over "data" where it divides B = 4 (placed as h), replicated otherwise
  assert got.sharding.spec == (P("data") if 1 < data <= 4 else P())


@pytest.mark.extended(params=["float32-1-4-tpu", "bfloat16-1-4-tpu", "bfloat16-2-2-tpu",
                               "float32-1-4-gpu", "bfloat16-1-4-gpu", "bfloat16-2-2-gpu"])
@pytest.mark.parametrize("impl", ["tpu", "gpu"])
@pytest.mark.parametrize("data,model", [(1, 4), (2, 2)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_pallas_kernels_under_shard_map_in_interpret_mode(impl, data, model, dtype):
  h, U, idx = _inputs(B=2, K=16, D=128, V=256, dtype=dtype)
  mesh = sharding.make_mesh(data=data, model=model, devices=jax.devices()[:data * model])
  got = indexed_lm_head_sharded(h, U, idx, mesh=mesh, impl=impl, interpret=True)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(got), np.asarray(indexed_lm_head_reference(h, U, idx)),
                             rtol=tol, atol=tol * 128 ** 0.5)


def test_a_vocabulary_that_does_not_split_is_refused():
  h, U, idx = _inputs(V=1001)
  with pytest.raises(ValueError, match=r"V=1001 does not split over the 8 devices"):
    indexed_lm_head_sharded(h, U, idx, mesh=sharding.make_mesh(data=1, model=8))
  with pytest.raises(ValueError, match="outside"):
    indexed_lm_head_sharded(h, U, idx.at[0, 0].set(5000),
                            mesh=sharding.make_mesh(data=1, model=8))


@pytest.mark.integration
@pytest.mark.parametrize("topology", ["v5e:2x2", "v6e:2x2", "v5p:2x2x1"])
def test_the_tpu_kernel_compiles_for_slices_with_the_head_split(topology):
  """SpecVocab's main setting (B = 10, k = 2048, the 0.5B drafter's d = 896, Qwen's 151,936
  rows, bf16) over every chip of the slice: each chip's arguments hold a quarter of the head."""
  from vocabjax.testing.tpu_aot import not_cached, tpu_devices

  devs = tpu_devices(topology)
  mesh = sharding.make_mesh(data=1, model=len(devs), devices=devs)
  B, K, D, V = 10, 2048, 896, 151936
  args = (jax.ShapeDtypeStruct((B, D), jnp.bfloat16, sharding=NamedSharding(mesh, P())),
          jax.ShapeDtypeStruct((V, D), jnp.bfloat16,
                               sharding=NamedSharding(mesh, P("model", None))),
          jax.ShapeDtypeStruct((B, K), jnp.int32, sharding=NamedSharding(mesh, P())))
  fn = jax.jit(lambda h, U, i: indexed_lm_head_sharded(h, U, i, mesh=mesh, impl="tpu"))
  with jax.default_device(devs[0]), not_cached():
    lowered = fn.trace(*args).lower()
    compiled = lowered.compile()
  assert "tpu_custom_call" in lowered.as_text()  # the Mosaic kernel, not XLA's gather
  per_chip = compiled.memory_analysis().argument_size_in_bytes
  quarter = V // len(devs) * D * 2
  assert quarter <= per_chip < quarter + 256 * 1024, (per_chip, quarter)  # + h, idx
