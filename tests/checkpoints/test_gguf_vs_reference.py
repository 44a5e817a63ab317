"""GGUF files written in the test with gguf.GGUFWriter load to the right logits."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.gguf_io import load_gguf, unpermute_qk
from vocabjax.checkpoints.hf_config import UnsupportedConfigError
from vocabjax.checkpoints.loader import load_model
from vocabjax.models import KVCache, forward, lm_head
from vocabjax.testing.tiny import (llama_cpp_permute, tiny_hf_model, tiny_tokenizer,
                                   write_tiny_gguf)

CASES = {  # name -> (model_type, overrides)
    "llama_gqa": ("llama", dict(num_attention_heads=8, num_key_value_heads=2)),
    "llama_mha_tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=4,
                                     tie_word_embeddings=True)),
    "qwen2": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen3": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
}
TOKENS = np.random.RandomState(0).randint(0, 128, (1, 12))


def _logits(path):
  config, params, _ = load_gguf(path)
  hidden, _ = forward(params, jnp.asarray(TOKENS), jnp.arange(12)[None],
                      KVCache.init(config, 1, 16), config=config)
  return config, np.asarray(lm_head(params, hidden, config=config))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
  model_type, overrides = CASES[request.param]
  model = tiny_hf_model(model_type, seed=7, **overrides)
  return request.param, model, tmp_path_factory.mktemp(request.param)


def test_f32_gguf_logits_vs_reference(case):
  name, model, d = case
  config, ours = _logits(write_tiny_gguf(model, d / "f32.gguf", "F32"))
  with torch.no_grad():
    ref = model(torch.tensor(TOKENS)).logits.numpy()
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  assert config.tie_word_embeddings == model.config.tie_word_embeddings


def test_q8_0_gguf_logits_vs_transformers_gguf_loader(case):
  """Quantized: the same dequantized weights as transformers' own GGUF loader."""
  name, model, d = case
  path = write_tiny_gguf(model, d / "q8.gguf", "Q8_0")
  _, ours = _logits(path)
  with torch.no_grad():
    exact = model(torch.tensor(TOKENS)).logits.numpy()
  assert 1e-5 < np.abs(ours - exact).max() < 0.05  # really quantized, still close
  if name == "qwen3":  # transformers' GGUF config mapping ignores key_length (head_dim)
    return
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(
      d, gguf_file="q8.gguf", dtype=torch.float32).eval()
  with torch.no_grad():
    ref = ref_model(torch.tensor(TOKENS)).logits.numpy()
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_torch_model_of_a_gguf_is_dense_and_ours(case):
  """load_torch_model unpacks a quantized GGUF into dense weights of the asked dtype
  (transformers >= 5.24 would otherwise keep its blocks packed for its GGUF kernels): f32
  logits equal vocabjax's dequantized ones, and bf16 weights are bf16 tensors."""
  from vocabjax.checkpoints.torch_model import load_torch_model

  name, model, d = case
  if name == "qwen3":  # transformers' GGUF config mapping ignores key_length (head_dim)
    return
  path = write_tiny_gguf(model, d / "q8.gguf", "Q8_0")
  _, ours = _logits(path)
  m32 = load_torch_model(str(path), "float32")
  assert not [n for n, mod in m32.named_modules() if "gguf" in type(mod).__name__.lower()]
  with torch.no_grad():
    np.testing.assert_allclose(m32(torch.tensor(TOKENS)).logits.numpy(), ours, atol=1e-4)
  m16 = load_torch_model(str(path), "bfloat16")
  linear = [mod for mod in m16.modules() if isinstance(mod, torch.nn.Linear)]
  assert linear and all(mod.weight.dtype == torch.bfloat16 for mod in linear)


def test_llama_permutation_is_undone():
  w = np.arange(8 * 4 * 3, dtype=np.float32).reshape(8 * 4, 3)
  for heads in (1, 2, 8):
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, heads), heads), w)
  assert not np.array_equal(llama_cpp_permute(w, 8), w)


def test_gguf_tokenizer_and_eos(tmp_path, monkeypatch):
  monkeypatch.setenv("VOCABJAX_CACHE", str(tmp_path / "cache"))
  tok = tiny_tokenizer(320)
  path = write_tiny_gguf(tiny_hf_model("qwen2", vocab_size=320), tmp_path / "t.gguf",
                         tokenizer=tok)
  model = load_model(path)
  text = "def add(a, b):\n    return a + b  # Hello world!"
  assert model.tokenizer(text)["input_ids"] == tok(text)["input_ids"]
  assert model.eos_token_ids == (tok.eos_token_id,)
  assert model.tokenizer.chat_template == tok.chat_template


def test_truncated_gguf_is_rejected(tmp_path):
  path = write_tiny_gguf(tiny_hf_model("qwen2"), tmp_path / "m.gguf")
  data = path.read_bytes()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[: len(data) - 1000])
  with pytest.raises(CheckpointError, match="truncated"):
    load_gguf(cut)
  garbage = tmp_path / "garbage.gguf"
  garbage.write_bytes(b"not a gguf file at all" * 10)
  with pytest.raises(CheckpointError, match="not a readable GGUF"):
    load_gguf(garbage)


def test_unknown_gguf_architecture(tmp_path):
  import gguf

  w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
  w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
  w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
  with pytest.raises(UnsupportedConfigError, match="'mamba'"):
    load_gguf(tmp_path / "x.gguf")


def test_gguf_missing_tensor_is_named(tmp_path):
  model = tiny_hf_model("qwen2")
  state = model.state_dict()
  del state["model.layers.1.mlp.up_proj.weight"]
  path = write_tiny_gguf(model, tmp_path / "m.gguf", state=state)
  with pytest.raises(CheckpointError, match=r"blk\.1\.ffn_up\.weight"):
    load_gguf(path)
  assert os.path.exists(path)
