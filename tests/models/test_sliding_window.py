"""Sliding-window attention outside Gemma: Mistral (every layer slides when its config sets a
window) and Qwen2 / Qwen3 with `use_sliding_window` (the layers from `max_window_layers` on).

Parity with transformers (logits over prompts longer than the window, greedy ids decoded past
it) runs in `test_llamalike_vs_reference.py` over the `mistral_sliding` and `qwen2_sliding`
tiny variants; Gemma 3's mixed layers in `test_gemma3.py`. This file checks how the configs
are read, that the window changes the logits, and exact speculative decoding when every
layer is a sliding one (a ring cache with no global layer at all).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.checkpoints.hf import load_hf
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf
from vocabjax.models import KVCache, LlamaLikeConfig, forward, init_params, lm_head

from tests.helpers.windows import (rings_on_a_mesh, sampling_keeps_the_targets_law,
                                  speculative_past_the_window)

_forward = jax.jit(forward, static_argnames=("config", "fresh"))

# random-weight pairs for decoding: two layers, both over a window of 4 (Mistral's layout)
MISTRAL = LlamaLikeConfig(
    arch="mistral", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e6, sliding_window=4,
    layer_types=("sliding_attention", "sliding_attention"))
MISTRAL_SMALL = MISTRAL.replace(vocab_size=8, hidden_size=16, intermediate_size=16,
                                num_heads=2, num_kv_heads=1, sliding_window=2)

_BASE = {"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 4,
         "num_attention_heads": 2}


def test_mistral_slides_every_layer_when_its_config_sets_a_window():
  c = config_from_hf({**_BASE, "model_type": "mistral", "sliding_window": 4096})
  assert c.arch == "mistral" and c.sliding_window == 4096
  assert c.layer_types == ("sliding_attention",) * 4
  # Mistral 7B v0.2 / v0.3 and NeMo: `sliding_window: null`, every layer full
  none = config_from_hf({**_BASE, "model_type": "mistral", "sliding_window": None})
  assert not none.has_sliding_layers and none.sliding_window is None


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_slides_only_with_use_sliding_window(model_type):
  qwen = {**_BASE, "model_type": model_type}
  # the shipped Qwen2.5 configs: a window and max_window_layers, but use_sliding_window false
  off = config_from_hf({**qwen, "use_sliding_window": False, "sliding_window": 32768,
                        "max_window_layers": 2})
  assert not off.has_sliding_layers and off.sliding_window is None
  # on, without layer_types (configs saved before transformers 5): from max_window_layers on
  on = config_from_hf({**qwen, "use_sliding_window": True, "sliding_window": 16,
                       "max_window_layers": 2})
  assert on.sliding_window == 16
  assert on.layer_types == ("full_attention",) * 2 + ("sliding_attention",) * 2
  # transformers 5 writes layer_types out: those are the layers, whatever max_window_layers says
  given = ("sliding_attention", "full_attention", "sliding_attention", "full_attention")
  c = config_from_hf({**qwen, "use_sliding_window": True, "sliding_window": 16,
                      "max_window_layers": 0, "layer_types": list(given)})
  assert c.layer_types == given


@pytest.mark.parametrize("change, message", [
    ({"sliding_window": 0}, r"sliding_window=0 \(a positive integer\)"),
    ({"sliding_window": "4096"}, r"sliding_window='4096' \(a positive integer\)"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention",
                      "full_attention"]}, r"layer_types \['chunked_attention'\]"),
    ({"layer_types": ["sliding_attention"]},
     r"layer_types has 1 entries for num_hidden_layers=4")])
def test_bad_sliding_fields_are_refused_by_name(change, message):
  cfg = {**_BASE, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16,
         "max_window_layers": 2, **change}
  with pytest.raises(UnsupportedConfigError, match=message):
    config_from_hf(cfg)


def test_llama_has_no_sliding_layers_and_says_so():
  with pytest.raises(UnsupportedConfigError, match=r"layer_types=\['sliding_attention'\] "
                                                   r"\(llama has only full_attention\)"):
    config_from_hf({**_BASE, "model_type": "llama", "layer_types": ["sliding_attention"] * 4})


def test_the_window_changes_the_logits_past_it(tiny_dirs):
  """The same weights with and without Mistral's window of 8: equal logits up to position 8
  (every key still inside the window), different after."""
  config, params, _ = load_hf(tiny_dirs["mistral_sliding"])
  assert config.sliding_window == 8
  full = config.replace(sliding_window=None, layer_types=None)
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, config.vocab_size, (1, 20)))
  pos = jnp.arange(20)[None]
  out = {}
  for name, c in (("window", config), ("full", full)):
    h, _ = _forward(params, tokens, pos, KVCache.init(c, 1, 32), config=c)
    out[name] = np.asarray(lm_head(params, h, config=c))[0]
  np.testing.assert_allclose(out["window"][:8], out["full"][:8], atol=1e-5)
  assert np.abs(out["window"][8:] - out["full"][8:]).max(axis=-1).min() > 1e-3


def test_a_cache_of_sliding_layers_alone_keeps_only_rings():
  """Mistral 7B v0.1 (window 4,096, 32 layers) at 16K slots: every layer in a ring of
  4,096 + RING_SLACK slots, no global buffer, a quarter of the linear cache's bytes."""
  from vocabjax.models.cache import RING_SLACK

  c = config_from_hf({"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
                      "intermediate_size": 14336, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "num_key_value_heads": 8,
                      "sliding_window": 4096, "max_position_embeddings": 32768})
  ring = jax.eval_shape(lambda: KVCache.init(c, 1, 16384, dtype=jnp.bfloat16))
  linear = jax.eval_shape(lambda: KVCache.init(c, 1, 16384, dtype=jnp.bfloat16,
                                               ring_slack=16384))
  assert ring.k.shape[0] == 0 and ring.k_local.shape[:3] == (32, 1, 4096 + RING_SLACK)
  assert linear.k_local is None and linear.k.shape[:3] == (32, 1, 16384)
  size = lambda cache: sum(x.size for x in jax.tree.leaves(cache))  # noqa: E731
  assert size(ring) < 0.3 * size(linear)


@pytest.fixture(scope="module")
def mistral_pair():
  """A Mistral-shaped target (both layers over a window of 4) and a noisy copy as its
  drafter."""
  target = init_params(jax.random.key(40), MISTRAL, scale=0.3)
  noise = init_params(jax.random.key(41), MISTRAL, scale=0.3)
  return target, jax.tree.map(lambda a, b: a + 0.1 * b, target, noise)


@pytest.mark.extended(params=["ring-chain"])
@pytest.mark.parametrize("ring,kind", [(False, "chain"), (True, "chain"), (True, "tree")],
                         ids=["linear-chain", "ring-chain", "ring-tree"])
def test_speculative_greedy_equals_plain_decoding_past_the_window(mistral_pair, kind, ring,
                                                                   monkeypatch):
  """Chain (gamma 3) and tree drafting where every layer slides: the plain greedy ids,
  batched and one row alone, for prompts shorter and longer than the window (4); with `ring`,
  every cache is rings alone (W + 9 slots, wrapped several times by 24 new tokens after a
  17-token prompt) and an empty global buffer."""
  from vocabjax.models import cache as cache_module

  if ring:
    monkeypatch.setattr(cache_module, "RING_SLACK", 9)
  speculative_past_the_window(mistral_pair, MISTRAL, kind, seed=6, alone=True)
  probe = KVCache.init(MISTRAL, 1, 64)
  assert (probe.ring == 13) == ring and (probe.k.shape[0] == 0) == ring


@pytest.mark.extended
def test_rings_alone_on_a_mesh_decode_the_unsharded_ids(mistral_pair, monkeypatch):
  """On a (4, 2) mesh a cache of rings alone is sharded as the others (its empty global
  buffer replicated, as XLA hands an empty array back), and plain, chain and tree decoding give
  the one-device greedy ids past the window, with steps that only all-reduce and all-gather."""
  from jax.sharding import PartitionSpec as P

  from vocabjax.models import cache as cache_module

  monkeypatch.setattr(cache_module, "RING_SLACK", 9)
  cache = rings_on_a_mesh(mistral_pair, MISTRAL, ["chain", "tree"], seed=6)
  assert cache.k.shape[0] == 0 and cache.k.sharding.spec == P()
  assert cache.k_local.sharding.spec == P(None, "data", None, "model", None)


def test_speculative_sampling_keeps_the_targets_law():
  """Chain drafting between two unrelated V = 8 Mistral-shaped models keeps the target's law past
  the window (`windows.sampling_keeps_the_targets_law`)."""
  sampling_keeps_the_targets_law(MISTRAL_SMALL, seed=42)
