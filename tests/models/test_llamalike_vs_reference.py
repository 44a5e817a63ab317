"""The JAX decoder against transformers' PyTorch models built in the test (no downloads)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from vocabjax.checkpoints.hf import load_hf
from vocabjax.decoding import Decoder
from vocabjax.models import KVCache, forward, lm_head
from vocabjax.testing.tiny import TINY_VARIANTS

# one compiled program per shape: run op by op, each forward compiled ~80 small programs
_forward = jax.jit(forward, static_argnames=("config", "fresh"))

VARIANTS = sorted(TINY_VARIANTS)


def _torch_model(directory):
  return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def _jax_logits(params, config, tokens, max_len=64):
  B, T = tokens.shape
  cache = KVCache.init(config, B, max_len)
  positions = jnp.broadcast_to(jnp.arange(T), (B, T))
  hidden, cache = _forward(params, jnp.asarray(tokens), positions, cache, config=config)
  return np.asarray(lm_head(params, hidden, config=config)), cache


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_vs_reference(tiny_dirs, variant):
  config, params, _ = load_hf(tiny_dirs[variant])
  tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, 24))
  with torch.no_grad():
    ref = _torch_model(tiny_dirs[variant])(torch.tensor(tokens)).logits.numpy()
  ours, _ = _jax_logits(params, config, tokens)
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_variants_cover_the_family(tiny_dirs):
  configs = [load_hf(tiny_dirs[v])[0] for v in VARIANTS]
  assert {c.arch for c in configs} == {"llama", "mistral", "qwen2", "qwen3", "gemma3"}
  assert any(c.has_sliding_layers and not all(map(c.is_sliding, range(c.num_layers)))
             for c in configs)  # Gemma 3, Qwen2 with use_sliding_window: sliding and global
  assert any(all(map(c.is_sliding, range(c.num_layers))) for c in configs)  # Mistral: all
  assert any(c.num_kv_heads == c.num_heads for c in configs)  # MHA
  assert any(1 < c.num_kv_heads < c.num_heads for c in configs)  # GQA
  assert any(c.num_kv_heads == 1 for c in configs)  # MQA
  assert any(c.tie_word_embeddings for c in configs) and any(not c.tie_word_embeddings
                                                             for c in configs)
  assert any(c.attention_bias for c in configs) and any(c.qk_norm for c in configs)
  assert {c.rope_type for c in configs} >= {"default", "linear", "llama3", "yarn"}
  assert any(c.rope_scale() != 1.0 for c in configs)  # yarn's cos/sin factor
  assert any(c.head_dim * c.num_heads != c.hidden_size for c in configs)  # decoupled head_dim


@pytest.mark.parametrize("variant", ["llama_gqa_llama3rope", "qwen2_bias", "qwen3_qknorm",
                                     "mistral_sliding"])
def test_incremental_decode_matches_full_forward(tiny_dirs, variant):
  """Prefill 10 tokens, then one token at a time: logits equal the one-shot forward."""
  config, params, _ = load_hf(tiny_dirs[variant])
  tokens = np.random.RandomState(1).randint(0, config.vocab_size, (1, 16))
  full, _ = _jax_logits(params, config, tokens)
  cache = KVCache.init(config, 1, 32)
  _, cache = _forward(params, jnp.asarray(tokens[:, :10]), jnp.arange(10)[None], cache,
                     config=config)
  for t in range(10, 16):
    h, cache = _forward(params, jnp.asarray(tokens[:, t:t + 1]), jnp.array([[t]]), cache,
                       config=config)
    np.testing.assert_allclose(np.asarray(lm_head(params, h, config=config))[0, 0], full[0, t],
                               atol=1e-4)
  assert int(cache.lengths[0]) == 16


# Gemma: after a 12-token prefix, past its window of 8 (the window is kept by position)
@pytest.mark.parametrize("variant, P, atol", [("qwen2_bias", 6, 1e-4),
                                              ("gemma3_sliding", 12, 1e-5)])
def test_explicit_mask_matches_separate_sequences(tiny_dirs, variant, P, atol):
  """Two branches packed into one block with a block-diagonal mask = two separate forwards.

  This is the mechanism tree verification relies on: explicit mask + explicit positions.
  """
  config, params, _ = load_hf(tiny_dirs[variant])
  rs = np.random.RandomState(2)
  prefix, a, b = (rs.randint(0, config.vocab_size, n) for n in (P, 3, 2))
  ref_a, _ = _jax_logits(params, config, np.concatenate([prefix, a])[None])
  ref_b, _ = _jax_logits(params, config, np.concatenate([prefix, b])[None])
  cache = KVCache.init(config, 1, 32)
  _, cache = _forward(params, jnp.asarray(prefix[None]), jnp.arange(P)[None], cache, config=config)
  block = np.zeros((5, 5), bool)
  block[:3, :3] = np.tril(np.ones((3, 3), bool))
  block[3:, 3:] = np.tril(np.ones((2, 2), bool))
  positions = jnp.asarray([[P, P + 1, P + 2, P, P + 1]])
  h, _ = _forward(params, jnp.asarray(np.concatenate([a, b])[None]), positions, cache,
                 jnp.asarray(block[None]), config=config)
  logits = np.asarray(lm_head(params, h, config=config))[0]
  np.testing.assert_allclose(logits[:3], ref_a[0, P:], atol=atol)
  np.testing.assert_allclose(logits[3:], ref_b[0, P:], atol=atol)


@pytest.mark.extended(params=["llama_mha", "qwen2_sliding", "qwen2_yarn", "mistral_sliding"])
@pytest.mark.parametrize("variant", ["llama_mha", "qwen2_bias_tied", "qwen3_qknorm",
                                     "mistral_sliding", "qwen2_sliding", "qwen2_yarn"])
def test_greedy_ids_vs_transformers_generate(tiny_dirs, variant):
  """24 new tokens after prompts of 1, 7 and 19 tokens: the sliding variants (window 8) decode
  past their window, transformers with its sliding-window cache layers; YaRN past its original
  context of 16."""
  config, params, _ = load_hf(tiny_dirs[variant])
  model = _torch_model(tiny_dirs[variant])
  decoder = Decoder(params, config)
  rs = np.random.RandomState(3)
  for n in (1, 7, 19):
    prompt = rs.randint(3, config.vocab_size, n).tolist()
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                         eos_token_id=None, pad_token_id=0)[0, n:].tolist()
    ours = decoder.generate([prompt], max_new_tokens=24).tokens[0]
    assert ours == ref, (n, ours, ref)


def test_batch_with_different_lengths_matches_batch_of_one(tiny_dirs):
  config, params, _ = load_hf(tiny_dirs["llama_gqa_llama3rope"])
  decoder = Decoder(params, config)
  rs = np.random.RandomState(4)
  prompts = [rs.randint(3, config.vocab_size, n).tolist() for n in (3, 21, 9, 14)]
  batched = decoder.generate(prompts, max_new_tokens=16)
  for p, row in zip(prompts, batched.tokens):
    assert decoder.generate([p], max_new_tokens=16).tokens[0] == row
  # and the batched prefill logits equal each row's own forward
  T = max(len(p) for p in prompts)
  padded = np.zeros((4, T), np.int64)
  for i, p in enumerate(prompts):
    padded[i, :len(p)] = p
  logits, _ = _jax_logits(params, config, padded)
  for i, p in enumerate(prompts):
    alone, _ = _jax_logits(params, config, np.asarray([p]))
    np.testing.assert_allclose(logits[i, :len(p)], alone[0], atol=1e-4)


def test_bf16_params_run_and_agree_roughly(tiny_dirs):
  config, params, _ = load_hf(tiny_dirs["qwen2_bias"], dtype=jnp.bfloat16)
  assert params["embed"].dtype == jnp.bfloat16
  config32, params32, _ = load_hf(tiny_dirs["qwen2_bias"])
  tokens = np.random.RandomState(5).randint(0, config.vocab_size, (1, 12))
  lo, _ = _jax_logits(params, config, tokens)
  hi, _ = _jax_logits(params32, config32, tokens)
  assert np.abs(lo - hi).max() < 0.05


@pytest.mark.parametrize("variant", ["qwen2_bias", "llama_mqa_tied"])
def test_layer_features_vs_reference_hidden_states(tiny_dirs, variant):
  """forward_features (what an EAGLE-3 head fuses): the output of decoder layer i equals
  transformers' hidden_states[i + 1] (whose last entry is already final-normed); the final
  hidden state is forward's."""
  from vocabjax.models.llamalike import forward_features, rms_norm

  config, params, _ = load_hf(tiny_dirs[variant])
  tokens = np.random.RandomState(2).randint(0, config.vocab_size, (2, 12))
  with torch.no_grad():
    ref = _torch_model(tiny_dirs[variant])(torch.tensor(tokens), output_hidden_states=True)
  pos = jnp.broadcast_to(jnp.arange(12), (2, 12))
  hidden, _, feats = forward_features(params, jnp.asarray(tokens), pos,
                                      KVCache.init(config, 2, 16), config=config, layers=(1, 0))
  D = config.hidden_size
  assert feats.shape == (2, 12, 2 * D)
  np.testing.assert_allclose(np.asarray(feats[..., D:]), ref.hidden_states[1].numpy(), atol=1e-4)
  last = rms_norm(feats[..., :D], params["final_norm"], config.rms_norm_eps)
  np.testing.assert_allclose(np.asarray(last), ref.hidden_states[2].numpy(), atol=1e-4)
  np.testing.assert_allclose(np.asarray(last), np.asarray(hidden), atol=1e-6)
  plain, _ = forward(params, jnp.asarray(tokens), pos, KVCache.init(config, 2, 16), config=config)
  np.testing.assert_array_equal(np.asarray(hidden), np.asarray(plain))
  with pytest.raises(ValueError, match=r"layers=\(2,\) must name decoder layers in \[0, 2\)"):
    forward_features(params, jnp.asarray(tokens), pos, KVCache.init(config, 2, 16),
                     config=config, layers=(2,))


@pytest.mark.extended(params=["llama_mha", "llama_mqa_tied", "qwen2_bias_tied", "qwen2_sliding",
    "qwen2_yarn"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_fresh_prefill_attention_matches_the_cache_path(tiny_dirs, variant, monkeypatch):
  """`forward(fresh=True)` (a prefill's chunked causal attention over the block alone) gives the
  hidden states and cache entries of attending over every cache slot, and transformers' logits,
  across several chunks (a partial last one) and rows of a batch."""
  from vocabjax.models import llamalike

  monkeypatch.setattr(llamalike, "PREFILL_CHUNK", 16)  # 40 tokens: chunks of 16, 16, 8
  fwd = jax.jit(forward, static_argnames=("config", "fresh"))  # traced after the patch
  config, params, _ = load_hf(tiny_dirs[variant])
  tokens = np.random.RandomState(1).randint(0, config.vocab_size, (2, 40))
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T), (B, T))
  runs = {}
  for fresh in (False, True):
    hidden, cache = fwd(params, jnp.asarray(tokens), positions, KVCache.init(config, B, 64),
                        config=config, fresh=fresh)
    runs[fresh] = (np.asarray(hidden), np.asarray(cache.k), np.asarray(cache.v),
                   np.asarray(lm_head(params, hidden, config=config)))
  for a, b in zip(runs[False], runs[True]):
    np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-5)
  with torch.no_grad():
    ref = _torch_model(tiny_dirs[variant])(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(runs[True][3], ref, atol=1e-4, rtol=0)


def test_fresh_prefill_refuses_a_mask(tiny_dirs):
  config, params, _ = load_hf(tiny_dirs[VARIANTS[0]])
  tokens = jnp.zeros((1, 4), jnp.int32)
  with pytest.raises(ValueError, match="fresh"):
    _forward(params, tokens, jnp.arange(4)[None], KVCache.init(config, 1, 8),
             jnp.ones((1, 4, 4), bool), config=config, fresh=True)
