"""MLP weights stored [out, in] or [in, out] compute the same model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.models import CFG
from vocabjax.checkpoints.loader import Model
from vocabjax.models import KVCache, forward, init_params
from vocabjax.models.llamalike import mlp_layout, with_mlp_layout


def test_layouts_give_the_same_hidden_states():
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  io = with_mlp_layout(params, "in_out")
  assert mlp_layout(params) == "out_in" and mlp_layout(io) == "in_out"
  assert "w_down" not in io["layers"][0] and io["layers"][0]["w_down_t"].shape == (
      CFG.intermediate_size, CFG.hidden_size)
  tokens = jnp.asarray([[5, 9, 2, 7], [1, 1, 3, 60]])
  pos = jnp.broadcast_to(jnp.arange(4), (2, 4))
  cache = KVCache.init(CFG, 2, 16)
  a, _ = forward(params, tokens, pos, cache, config=CFG)
  b, _ = forward(io, tokens, pos, cache, config=CFG)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
  back = with_mlp_layout(io, "out_in")
  for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with pytest.raises(ValueError, match="unknown MLP layout layout='columns'"):
    with_mlp_layout(params, "columns")


def test_model_converts_a_layout_once():
  params = init_params(jax.random.key(0), CFG)
  m = Model(config=CFG, params=params, tokenizer=None, eos_token_ids=(), source="x",
            dtype=jnp.float32)
  assert m.in_layout("out_in") is params
  first = m.in_layout("in_out")
  assert m.in_layout("in_out") is first and mlp_layout(first) == "in_out"


def test_speculative_decoders_pick_block_layouts_on_cpu():
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.drafter import ChainProposer, TreeProposer
  from vocabjax.decoding.tree import TreeParams

  from vocabjax.kernels import cpu_matmul
  from vocabjax.lowering import cpu_kernel_default

  params = init_params(jax.random.key(0), CFG)
  assert jax.default_backend() == "cpu" and cpu_matmul.available()
  # the CPU kernel streams [out, in] weights for every block size: no transposed copy
  chain = SpeculativeEngine(params, CFG, ChainProposer(params, CFG, CFG, gamma=2))
  tree = SpeculativeEngine(params, CFG, TreeProposer(params, CFG, CFG, tree=TreeParams(2, 2, 3)))
  assert chain.target_params is params and chain.proposer_params is params
  assert tree.target_params is params and tree.proposer_params is params
  with cpu_kernel_default(False):  # XLA's GEMM: [in, out] for block programs
    chain = SpeculativeEngine(params, CFG, ChainProposer(params, CFG, CFG, gamma=2))
    tree = SpeculativeEngine(params, CFG, TreeProposer(params, CFG, CFG, tree=TreeParams(2, 2, 3)))
  assert mlp_layout(chain.target_params) == "in_out" and mlp_layout(
      chain.proposer_params) == "out_in"  # T=1 drafting
  assert mlp_layout(tree.target_params) == "in_out" and mlp_layout(
      tree.proposer_params) == "in_out"  # block drafting
  kept = SpeculativeEngine(params, CFG, ChainProposer(params, CFG, CFG, gamma=2), layout="out_in")
  assert kept.target_params is params and kept.proposer_params is params
