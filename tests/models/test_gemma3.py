"""Gemma 3 (text): its config, its sliding-window attention, its loaders and exact decoding.

Parity of the logits with transformers' Gemma3ForCausalLM (prompts longer than the window, the
chunked prefill) and a tree block past the window run in `test_llamalike_vs_reference.py` over
the `gemma3_sliding` tiny variant; this file checks what is Gemma's own.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from vocabjax.checkpoints.hf import load_hf
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf
from vocabjax.decoding import Decoder
from vocabjax.decoding.tree import TreeParams
from vocabjax.models import KVCache, LlamaLikeConfig, forward, init_params, lm_head

from tests.helpers.windows import (rings_on_a_mesh, sampling_keeps_the_targets_law,
                                  speculative_past_the_window)

_forward = jax.jit(forward, static_argnames=("config", "fresh"))

# random-weight pairs for decoding: window 4, one sliding and one global layer
GEMMA = LlamaLikeConfig(
    arch="gemma3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, tie_word_embeddings=False,
    hidden_act="gelu_tanh", norm_unit_offset=True, sandwich_norms=True, scale_embeddings=True,
    query_pre_attn_scalar=12.0, sliding_window=4,
    layer_types=("sliding_attention", "full_attention"), rope_theta=1e6, rope_local_theta=1e4)
GEMMA_SMALL = GEMMA.replace(vocab_size=8, hidden_size=16, intermediate_size=16, num_heads=2,
                            num_kv_heads=1, sliding_window=2)


def _logits(params, config, tokens, max_len=64):
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T), (B, T))
  hidden, cache = _forward(params, jnp.asarray(tokens), positions,
                           KVCache.init(config, B, max_len), config=config)
  return np.asarray(lm_head(params, hidden, config=config)), cache


def test_the_hf_config_maps_to_gemmas_switches(tiny_dirs):
  config, _, raw = load_hf(tiny_dirs["gemma3_sliding"])
  assert raw["model_type"] == "gemma3_text"
  assert config.arch == "gemma3" and config.norm_unit_offset and config.sandwich_norms
  assert config.scale_embeddings and config.hidden_act == "gelu_tanh" and config.qk_norm
  assert config.sliding_window == 8 and config.layer_types == ("sliding_attention",
                                                               "full_attention")
  assert (config.rope_theta, config.rope_type, config.rope_factor) == (1e6, "linear", 2.0)
  assert config.rope_local_theta == 1e4 and config.query_pre_attn_scalar == 24
  assert config.attn_divisor == pytest.approx(np.sqrt(24))
  # transformers' older spelling (rope_theta / rope_local_base_freq / sliding_window_pattern)
  old = {k: v for k, v in raw.items() if k not in ("rope_parameters", "layer_types")}
  old.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2,
             rope_scaling={"rope_type": "linear", "factor": 2.0})
  assert config_from_hf(old) == config


@pytest.mark.parametrize("change, message", [
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ({"hidden_activation": "gelu"}, "hidden_activation='gelu'"),
    ({"altup_num_inputs": 4}, "unknown field altup_num_inputs=4"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "rope_theta": 1e4,
                                                "factor": 4.0},
                          "full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     "sliding_attention rope_type='yarn'"),
    ({"model_type": "gemma3"}, "image-text model"),
])
def test_fields_it_does_not_implement_are_refused_by_name(tiny_dirs, change, message):
  raw = json.loads((tiny_dirs["gemma3_sliding"] / "config.json").read_text())
  raw.update(change)
  with pytest.raises(UnsupportedConfigError, match=message.replace("(", r"\(").replace(
      "[", r"\[")):
    config_from_hf(raw)


def test_bad_layer_types_are_refused():
  with pytest.raises(ValueError, match="layer_types has 1 entries for 2 layers"):
    GEMMA.replace(layer_types=("full_attention",))
  with pytest.raises(ValueError, match=r"unknown layer types \['chunked_attention'\]"):
    GEMMA.replace(layer_types=("chunked_attention", "full_attention"))
  with pytest.raises(ValueError, match="sliding layers need a positive sliding_window"):
    GEMMA.replace(sliding_window=None)


def test_the_window_changes_the_logits_past_it(tiny_dirs):
  """The mask is really applied: the same weights with every layer global agree with the
  windowed model on the first W positions and not after them."""
  config, params, _ = load_hf(tiny_dirs["gemma3_sliding"])
  tokens = np.random.RandomState(0).randint(0, config.vocab_size, (1, 20))
  windowed, _ = _logits(params, config, tokens)
  full, _ = _logits(params, config.replace(layer_types=None, sliding_window=None,
                                           rope_local_theta=None), tokens)
  W = config.sliding_window
  assert not np.allclose(windowed[0, W:], full[0, W:], atol=1e-3)
  # before W the sliding layer sees everything; only its RoPE base differs from the global's
  windowed_all_global_rope, _ = _logits(params, config.replace(rope_local_theta=None), tokens)
  np.testing.assert_allclose(windowed_all_global_rope[0, :W], full[0, :W], atol=1e-5)


def test_incremental_decode_past_the_window_matches_the_full_forward(tiny_dirs):
  """Prefill 5 tokens, then one token at a time to 20 (window 8): each step's logits equal
  the one-shot forward's, so the cached path masks by position as the block path does."""
  config, params, _ = load_hf(tiny_dirs["gemma3_sliding"])
  tokens = np.random.RandomState(1).randint(0, config.vocab_size, (1, 20))
  full, _ = _logits(params, config, tokens)
  cache = KVCache.init(config, 1, 32)
  _, cache = _forward(params, jnp.asarray(tokens[:, :5]), jnp.arange(5)[None], cache,
                      config=config, fresh=True)
  for t in range(5, 20):
    h, cache = _forward(params, jnp.asarray(tokens[:, t:t + 1]), jnp.array([[t]]), cache,
                        config=config)
    np.testing.assert_allclose(np.asarray(lm_head(params, h, config=config))[0, 0], full[0, t],
                               atol=1e-5)


def test_greedy_ids_vs_transformers_generate(tiny_dirs):
  """Plain greedy decoding of 24 tokens after prompts shorter and longer than the window
  gives transformers' ids."""
  config, params, _ = load_hf(tiny_dirs["gemma3_sliding"])
  model = transformers.AutoModelForCausalLM.from_pretrained(
      tiny_dirs["gemma3_sliding"], dtype=torch.float32).eval()
  decoder = Decoder(params, config)
  rs = np.random.RandomState(3)
  for n in (3, 13):
    prompt = rs.randint(3, config.vocab_size, n).tolist()
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                         eos_token_id=None, pad_token_id=0)[0, n:].tolist()
    assert decoder.generate([prompt], max_new_tokens=24).tokens[0] == ref, n


@pytest.mark.parametrize("pattern", [None, [False, True]], ids=["fixed6", "per-layer"])
def test_gguf_loads_to_the_same_model(tmp_path, pattern):
  """A GGUF written as llama.cpp's converter writes Gemma 3 (norms stored as 1 + w, its
  tensor names) loads to the HF model's logits, over a prompt past the window. What GGUF
  metadata leaves out is llama.cpp's: query_pre_attn_scalar = head_dim, local RoPE base
  10,000, every 6th layer global (both layers slide), or the file's per-layer pattern."""
  from vocabjax.checkpoints.gguf_io import load_gguf
  from vocabjax.testing.tiny import tiny_hf_model, write_tiny_gguf

  types = ["sliding_attention"] * 2 if pattern is None else [
      "sliding_attention" if s else "full_attention" for s in pattern]
  model = tiny_hf_model("gemma3_text", num_attention_heads=4, num_key_value_heads=1,
                        head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
                        layer_types=types, tie_word_embeddings=True)
  path = write_tiny_gguf(model, tmp_path / "gemma.gguf", sliding_pattern=pattern)
  config, params, _ = load_gguf(path)
  assert config.arch == "gemma3" and config.layer_types == tuple(types)
  assert config.sliding_window == 6 and config.query_pre_attn_scalar == 16
  tokens = np.random.RandomState(4).randint(0, config.vocab_size, (1, 16))
  with torch.no_grad():
    ref = model(torch.tensor(tokens)).logits.numpy()
  ours, _ = _logits(params, config, tokens)
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def gemma_pair():
  """A Gemma-3-shaped target and a noisy copy as its drafter (untied heads: with a tied head
  the sqrt(D)-scaled embedding dominates a random model's residual, and it repeats its input
  token)."""
  target = init_params(jax.random.key(20), GEMMA, scale=0.3)
  noise = init_params(jax.random.key(21), GEMMA, scale=0.3)
  return target, jax.tree.map(lambda a, b: a + 0.1 * b, target, noise)


@pytest.mark.extended(params=["linear-chain", "linear-tree"])
@pytest.mark.parametrize("ring,kind", [
    (False, "chain"), (False, "tree"), (True, "chain"),
    pytest.param(True, "tree", marks=pytest.mark.full_opt)],  # users' XLA settings too
    ids=["linear-chain", "linear-tree", "ring-chain", "ring-tree"])
def test_speculative_greedy_equals_plain_decoding_past_the_window(gemma_pair, kind, ring,
                                                                   monkeypatch):
  """Chain (gamma 3) and tree drafting with a Gemma drafter and target: the plain greedy ids,
  batched (and one row at a time with rings), for prompts shorter and longer than the window
  (4); with `ring`, every cache keeps its sliding layer in a ring of W + 9 slots (wrapped several
  times by 24 new tokens after a 17-token prompt), rejected drafts rolled back and accepted
  tree paths compacted in it."""
  from vocabjax.models import cache as cache_module

  if ring:
    monkeypatch.setattr(cache_module, "RING_SLACK", 9)
  # one row alone wraps its ring at its own pace (linear caches: test_speculative_*)
  speculative_past_the_window(gemma_pair, GEMMA, kind, seed=5, alone=ring)
  probe = KVCache.init(GEMMA, 1, 64)
  assert (probe.ring == 13) == ring  # the decoders' caches are what this test says


def test_ring_caches_on_a_mesh_decode_the_unsharded_ids(gemma_pair, monkeypatch):
  """On a (4, 2) mesh (rows over "data", the 2 KV heads over "model") the sliding layer's ring
  is sharded like the global layers' cache, and plain and chain decoding give the one-device
  greedy ids past the window (rings of W + 9 slots, wrapped by 24 new tokens), with a step
  that only all-reduces and all-gathers."""
  from jax.sharding import PartitionSpec as P

  from vocabjax.models import cache as cache_module

  monkeypatch.setattr(cache_module, "RING_SLACK", 9)
  cache = rings_on_a_mesh(gemma_pair, GEMMA, ["chain"], seed=5)
  assert cache.k_local.sharding.spec == cache.k.sharding.spec == P(None, "data", None, "model",
                                                                    None)


@pytest.mark.extended  # the ring cache's law in the core: test_sliding_window.py
def test_speculative_sampling_keeps_the_targets_law():
  """Chain drafting between two unrelated V = 8 Gemma models keeps the target's law past
  the window (`windows.sampling_keeps_the_targets_law`)."""
  sampling_keeps_the_targets_law(GEMMA_SMALL, seed=30)


def test_a_tokenizer_without_a_chat_template_gets_gemmas():
  """GGUF files of Gemma 3 base models carry no chat template: the loader gives the tokenizer
  Gemma 3's (user / model turns, a system message folded into the first user turn) and makes
  <end_of_turn> a stop token; a template the tokenizer has is kept."""
  from vocabjax.checkpoints.loader import GEMMA3_CHAT_TEMPLATE, gemma3_chat
  from vocabjax.testing.tiny import tiny_tokenizer

  tok = tiny_tokenizer(320)
  tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
  tok.chat_template = None
  assert gemma3_chat(tok) == (tok.convert_tokens_to_ids("<end_of_turn>"),)
  assert tok.chat_template == GEMMA3_CHAT_TEMPLATE
  text = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Hi "},
                                  {"role": "assistant", "content": "Hello"},
                                  {"role": "user", "content": "Bye"}],
                                 tokenize=False, add_generation_prompt=True)
  assert text == (f"{tok.bos_token}<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                  "<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>user\nBye"
                  "<end_of_turn>\n<start_of_turn>model\n")
  with pytest.raises(Exception, match="roles must alternate"):
    tok.apply_chat_template([{"role": "assistant", "content": "x"}], tokenize=False)
  tok.chat_template = "{{ messages[0]['content'] }}"
  gemma3_chat(tok)
  assert tok.chat_template == "{{ messages[0]['content'] }}"


def test_eagle_drafting_for_a_gemma_target_keeps_greedy_output(gemma_pair):
  """An EAGLE-3 head (a llama layer, `train.eagle_step.head_config`: none of Gemma's switches) on a
  Gemma target's fused layer features drafts trees whose output is plain greedy decoding's."""
  from vocabjax.decoding.eagle import EagleProposer
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.models.eagle import init_eagle
  from vocabjax.train.eagle_step import head_config

  target, _ = gemma_pair
  hc = head_config(GEMMA, (0, 1, 1), GEMMA.vocab_size, intermediate_size=24)
  assert hc.layer.arch == "llama" and hc.layer.layer_types is None
  assert not (hc.layer.sandwich_norms or hc.layer.norm_unit_offset or hc.layer.scale_embeddings)
  head = init_eagle(jax.random.key(22), hc, scale=0.3)
  head["d2t"] = jnp.zeros((GEMMA.vocab_size,), jnp.int32)
  head["lm_head"] = target["lm_head"] + 0.1 * head["lm_head"]
  prompts = [[5, 9, 1, 33, 2, 17, 40, 8, 3], [7]]
  ar = Decoder(target, GEMMA).generate(prompts, max_new_tokens=20)
  res = SpeculativeEngine(target, GEMMA,
                          EagleProposer(target, GEMMA, head, hc,
                                        tree=TreeParams(2, 3,
                                                        6))).generate(prompts, max_new_tokens=20)
  assert res.tokens == ar.tokens


def _ring_logits(params, config, tokens, *, slack, prefill):
  """Logits of `tokens` decoded one at a time after a `prefill`-token fresh prefill, into a
  cache whose sliding layers keep a ring of W + slack slots."""
  cache = KVCache.init(config, 1, 64, ring_slack=slack)
  out = []
  h, cache = _forward(params, jnp.asarray(tokens[:, :prefill]), jnp.arange(prefill)[None],
                      cache, config=config, fresh=True, valid_lengths=jnp.array([prefill]))
  out.append(np.asarray(lm_head(params, h, config=config))[0])
  for t in range(prefill, tokens.shape[1]):
    h, cache = _forward(params, jnp.asarray(tokens[:, t:t + 1]), jnp.array([[t]]), cache,
                        config=config)
    out.append(np.asarray(lm_head(params, h, config=config))[0])
  return np.concatenate(out), cache


@pytest.mark.parametrize("prefill", [5, 20], ids=["short-prefill", "prefill-past-the-ring"])
def test_the_sliding_layers_ring_gives_the_full_caches_logits(tiny_dirs, prefill):
  """Window 8, ring of 8 + 3 slots: 40 tokens (the ring wrapped three times; a 20-token
  prefill writes only its last 11 entries) give the one-shot forward's logits, and the global
  layer keeps every slot."""
  config, params, _ = load_hf(tiny_dirs["gemma3_sliding"])
  tokens = np.random.RandomState(6).randint(0, config.vocab_size, (1, 40))
  full, _ = _logits(params, config, tokens)
  ours, cache = _ring_logits(params, config, tokens, slack=3, prefill=prefill)
  np.testing.assert_allclose(ours, full[0], atol=1e-5)
  assert cache.ring == 11 and cache.k_local.shape[:3] == (1, 1, 11)
  assert cache.k.shape[:3] == (1, 1, 64)  # one global layer, all 64 slots


def test_a_rolled_back_block_in_the_ring_leaves_no_trace(tiny_dirs):
  """Verification's pattern in a ring of W + 4: a 4-token block written and rolled back to
  one accepted token (`with_lengths`), then the next block: its logits are those of the
  sequence without the rejected tokens, also once the ring has wrapped."""
  config, params, _ = load_hf(tiny_dirs["gemma3_sliding"])
  rs = np.random.RandomState(7)
  seq = rs.randint(0, config.vocab_size, 30)
  cache = KVCache.init(config, 1, 64, ring_slack=4)
  _, cache = _forward(params, jnp.asarray(seq[None, :6]), jnp.arange(6)[None], cache,
                      config=config, fresh=True, valid_lengths=jnp.array([6]))
  ref, _ = _logits(params, config, seq[None])  # causal: position p's logits see seq[:p + 1]
  L = 6
  while L + 5 <= len(seq):
    junk = rs.randint(0, config.vocab_size, 3)
    block = np.concatenate([seq[L:L + 1], junk])  # the first token is kept, the rest rejected
    _, cache = _forward(params, jnp.asarray(block[None]), jnp.arange(L, L + 4)[None], cache,
                        config=config)
    cache = cache.with_lengths(jnp.array([L + 1]))
    L += 1
    nxt = seq[L:L + 4]
    h, probe = _forward(params, jnp.asarray(nxt[None]), jnp.arange(L, L + 4)[None], cache,
                        config=config)
    np.testing.assert_allclose(np.asarray(lm_head(params, h, config=config))[0],
                               ref[0, L:L + 4], atol=1e-5)
  assert L > 2 * cache.ring  # wrapped twice


def test_the_ring_bounds_gemma_3_270m_s_cache():
  """Gemma-3-270M's shapes at 32K slots: 15 of its 18 layers slide (window 512) and keep
  512 + RING_SLACK slots; a block too long for the ring is refused by name."""
  from vocabjax.bench.shapes import resolve_config
  from vocabjax.models.cache import RING_SLACK

  _, c = resolve_config("gemma-3-270m")
  ring = jax.eval_shape(lambda: KVCache.init(c, 1, 32768))
  linear = jax.eval_shape(lambda: KVCache.init(c, 1, 32768, ring_slack=32768))
  assert ring.k.shape[0] == 3 and ring.k_local.shape[:3] == (15, 1, 512 + RING_SLACK)
  assert linear.k_local is None and linear.k.shape[0] == 18
  size = lambda cache: sum(np.prod(a.shape) for a in jax.tree.leaves(cache))  # noqa: E731
  assert size(ring) < 0.2 * size(linear)
  small = GEMMA.replace(num_layers=2)
  params = init_params(jax.random.key(0), small)
  cache = KVCache.init(small, 1, 64, ring_slack=2)
  with pytest.raises(ValueError, match=r"T=4 tokens needs 7 ring slots .* W=4; the cache's ring "
                                       r"has 6"):
    _forward(params, jnp.zeros((1, 4), jnp.int32), jnp.arange(4)[None], cache, config=small)
