"""On 8 virtual CPU devices the sharded model gives the unsharded logits and tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from vocabjax import sharding
from vocabjax.checkpoints.hf import load_hf
from vocabjax.decoding import Decoder
from vocabjax.models import KVCache, LlamaLikeConfig, forward, init_params, lm_head

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices: run via pytest "
                                "(tests/conftest.py sets XLA_FLAGS)")


def _logits(params, config, tokens, cache):
  B, T = tokens.shape
  h, cache = forward(params, tokens, jnp.broadcast_to(jnp.arange(T), (B, T)), cache,
                     config=config)
  return lm_head(params, h, config=config), cache


@pytest.mark.parametrize("data,model", [(1, 8), (2, 4), (8, 1)])
def test_sharded_logits_equal_unsharded(data, model):
  config = LlamaLikeConfig(arch="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_layers=2, num_heads=8, num_kv_heads=4, head_dim=8,
                           attention_bias=True)
  params = init_params(jax.random.key(0), config)
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 256, (8, 10)))
  ref, _ = jax.jit(_logits, static_argnums=1)(params, config, tokens, KVCache.init(config, 8, 16))
  mesh = sharding.make_mesh(data=data, model=model)
  sp = sharding.shard_params(params, config, mesh)
  sc = sharding.shard_cache(KVCache.init(config, 8, 16), config, mesh)
  out, cache = jax.jit(_logits, static_argnums=1)(sp, config, sharding.shard_batch(tokens, mesh),
                                                  sc)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)
  if model > 1:  # really tensor-parallel: heads (by whole KV-head groups), MLP, vocabulary
    heads = P("model", None) if config.num_kv_heads % model == 0 else P(None, None)
    assert sp["layers"][0]["wq"].sharding.spec == heads
    assert sp["layers"][0]["w_down"].sharding.spec == P(None, "model")
    assert sp["lm_head"].sharding.spec == P("model", None)
    assert len(sp["lm_head"].addressable_shards) == 8
    assert sp["lm_head"].addressable_shards[0].data.shape == (256 // model, 64)
  if data > 1:
    assert cache.k.sharding.spec[1] == "data"


def test_indivisible_dims_fall_back_to_replication():
  config = LlamaLikeConfig(arch="qwen2", vocab_size=250, hidden_size=64, intermediate_size=128,
                           num_layers=1, num_heads=8, num_kv_heads=2, head_dim=8)
  specs = sharding.param_specs(config, sharding.make_mesh(data=2, model=4))
  assert specs["lm_head"] == P(None, None)  # 250 rows do not split 4 ways
  # attention splits by whole KV-head groups: 2 KV heads do not split 4 ways (their 16 rows
  # would, but a split inside a head reshards at every reshape and RoPE rotation), so all of
  # attention is replicated while the MLP splits
  for leaf in ("wq", "wk", "wv", "wo"):
    assert specs["layers"][0][leaf] == P(None, None), leaf
  assert specs["layers"][0]["w_up"] == P("model", None)
  even = sharding.param_specs(config, sharding.make_mesh(data=4, model=2))
  assert even["layers"][0]["wq"] == P("model", None) and even["layers"][0]["wk"] == P("model",
                                                                                     None)
  assert even["layers"][0]["wo"] == P(None, "model")
  cs = sharding.cache_specs(config, 3, sharding.make_mesh(data=2, model=4))
  assert cs.k == P(None, None, None, None, None)  # 3 rows, 2 KV heads: replicated
  with pytest.raises(ValueError, match="does not match 8 devices"):
    sharding.make_mesh(data=3, model=2)


def test_sharded_decoder_generates_the_same_tokens(tiny_dirs):
  config, params, _ = load_hf(tiny_dirs["llama_gqa_llama3rope"])
  prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [3], [40, 41]]
  ref = Decoder(params, config).generate(prompts, max_new_tokens=10)
  mesh = sharding.make_mesh(data=2, model=4)
  out = Decoder(params, config, mesh=mesh).generate(prompts, max_new_tokens=10)
  assert out.tokens == ref.tokens
