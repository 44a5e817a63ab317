"""Weights straight onto a mesh (`load_model(..., mesh=...)`): each tensor is read and placed with
its sharding before the next is read (the host holds one tensor at a time), every leaf ends where
the decoders run it (`sharding.param_shardings`), the values and decoded tokens are the
one-device load's, and the deviceless TPU steps of an 8B pair on a v5e:2x2 slice take weights
laid out exactly so."""

import jax
import numpy as np
import pytest

from vocabjax import sharding
from vocabjax.checkpoints.loader import load_model

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices: run via pytest "
                                "(tests/conftest.py sets XLA_FLAGS)")


@pytest.mark.parametrize("data,model", [(1, 8), (2, 4)])
def test_a_mesh_load_places_every_tensor_where_the_decoders_run_it(tiny_chat_dir, data, model):
  from vocabjax.decoding import Decoder
  from vocabjax.sampling import SamplingParams

  mesh = sharding.make_mesh(data=data, model=model)
  m = load_model(tiny_chat_dir, dtype="float32", mesh=mesh)
  ref = load_model(tiny_chat_dir, dtype="float32")
  want = sharding.param_shardings(m.config, mesh)
  got = jax.tree.map(lambda x: x.sharding, m.params)
  assert jax.tree.leaves(jax.tree.map(lambda a, b: a == b, got, want)) and all(
      jax.tree.leaves(jax.tree.map(lambda a, b: a == b, got, want))), (got, want)
  assert any(s.spec != jax.sharding.PartitionSpec() and any(s.spec)
             for s in jax.tree.leaves(want))  # really split, not all replicated
  for a, b in zip(jax.tree.leaves(m.params), jax.tree.leaves(ref.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # the decoder's own placement moves nothing: every shard stays in the buffer it was read to
  placed = sharding.shard_params(m.params, m.config, mesh)
  for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(m.params)):
    assert [s.data.unsafe_buffer_pointer() for s in a.addressable_shards] == [
        s.data.unsafe_buffer_pointer() for s in b.addressable_shards]
  ids = m.tokenizer("def add(a, b):")["input_ids"]
  greedy = SamplingParams(temperature=0.0)
  out = Decoder(m.params, m.config, mesh=mesh).generate([ids] * data, max_new_tokens=8,
                                                       sampling=greedy)
  one = Decoder(ref.params, ref.config).generate([ids], max_new_tokens=8, sampling=greedy)
  assert out.tokens[0] == one.tokens[0]


def test_tensors_are_placed_one_at_a_time(tiny_chat_dir, monkeypatch):
  """Reading tensor k+1 starts only after tensor k is on the mesh with its sharding: the
  host never holds more than one tensor (and its cast copy)."""
  from vocabjax.checkpoints import convert

  mesh = sharding.make_mesh(data=1, model=8)
  events = []
  real_put = jax.device_put

  def put(x, where=None, **kw):
    events.append(("put", getattr(x, "shape", None), where))
    return real_put(x, where, **kw)

  real_assemble = convert.assemble_params

  def assemble(config, lookup, available, **kw):
    def logged(name):
      events.append(("read", name))
      return lookup(name)

    return real_assemble(config, logged, available, **kw)

  monkeypatch.setattr(convert.jax, "device_put", put)
  monkeypatch.setattr("vocabjax.checkpoints.hf.assemble_params", assemble)
  m = load_model(tiny_chat_dir, dtype="float32", mesh=mesh)
  kinds = [e[0] for e in events]
  n = len(jax.tree.leaves(m.params))
  assert kinds[:2 * n] == ["read", "put"] * n  # strictly alternating
  puts = [e for e in events if e[0] == "put"][:n]
  assert all(isinstance(w, jax.sharding.NamedSharding) and w.mesh == mesh for _, _, w in puts)


def test_int8_onto_a_mesh_splits_rows_and_scales_as_their_matrices(tiny_chat_dir):
  from jax.sharding import PartitionSpec as P

  from vocabjax.decoding import Decoder
  from vocabjax.sampling import SamplingParams

  mesh = sharding.make_mesh(data=1, model=8)
  m = load_model(tiny_chat_dir, dtype="int8", mesh=mesh)
  ref = load_model(tiny_chat_dir, dtype="int8")
  layer = m.params["layers"][0]
  assert layer["w_up"].dtype == np.int8
  assert m.config.intermediate_size % 8 == 0  # a column-parallel matrix: its scales split too
  assert layer["w_up"].sharding.spec == P("model", None)
  assert layer["w_up_scale"].sharding.spec == P("model")
  assert layer["w_down_scale"].sharding.spec == P()  # row-parallel: scales of whole outputs
  for a, b in zip(jax.tree.leaves(m.params), jax.tree.leaves(ref.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ids = m.tokenizer("def add(a, b):")["input_ids"]
  greedy = SamplingParams(temperature=0.0)
  out = Decoder(m.params, m.config, mesh=mesh).generate([ids], max_new_tokens=8, sampling=greedy)
  one = Decoder(ref.params, ref.config).generate([ids], max_new_tokens=8, sampling=greedy)
  assert out.tokens == one.tokens


def test_the_tpu_slice_steps_take_weights_as_the_loader_lays_them():
  """The 8B pair's deviceless chain step on a v5e:2x2 slice: the target's and the drafter's
  params reach the step with exactly the shardings `load_model(..., mesh=)` gives them."""
  from vocabjax.bench import tpu
  from vocabjax.bench import stand_ins
  from vocabjax.bench.shapes import PAIRS, resolve_config

  tname, dname = PAIRS["llama-3.1-8b"]
  setup = stand_ins.Setup(resolve_config(tname)[1], resolve_config(dname)[1])
  mesh = tpu.tpu_mesh("v5e:2x2")
  dec = tpu.build_decoder("chain_g3", setup, mesh=mesh)
  for params, config in ((dec.target_params, setup.target), (dec.proposer_params, setup.draft)):
    want = sharding.param_shardings(config, mesh)
    got = jax.tree.map(lambda x: x.sharding, {k: params[k] for k in want})
    pairs = list(zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    assert pairs and all(a == b for a, b in pairs), [(a, b) for a, b in pairs if a != b][:3]
