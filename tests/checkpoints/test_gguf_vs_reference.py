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


def test_gguf_tokenizers_are_cached_by_their_vocabulary(tmp_path, monkeypatch):
  """Two files of one name and size and time in two folders whose tokenizers differ (here in
  one character of the chat template) get their own tokenizers (the cache once keyed them by
  name, size and mtime); files of one tokenizer share one cached build, so rewriting a file
  does not grow the cache."""
  import copy
  import os

  from vocabjax.checkpoints.gguf_io import load_gguf_tokenizer

  monkeypatch.setenv("VOCABJAX_CACHE", str(tmp_path / "cache"))
  toks = [tiny_tokenizer(320)]
  toks.append(copy.deepcopy(toks[0]))
  i = toks[1].chat_template.index("assistant")
  toks[1].chat_template = toks[1].chat_template[:i] + "Assistant" + toks[1].chat_template[i + 9:]
  paths = []
  for i, tok in enumerate(toks):
    (tmp_path / str(i)).mkdir()
    paths.append(write_tiny_gguf(tiny_hf_model("qwen2", vocab_size=320), tmp_path / str(i)
                                 / "m.gguf", tokenizer=tok))
    os.utime(paths[-1], (1_000_000_000, 1_000_000_000))
  assert paths[0].stat().st_size == paths[1].stat().st_size
  for tok, path in zip(toks, paths):
    assert load_gguf_tokenizer(path).chat_template == tok.chat_template
  again = write_tiny_gguf(tiny_hf_model("qwen2", vocab_size=320, seed=3), tmp_path / "m2.gguf",
                          tokenizer=toks[0])
  # read back from the cache, the tokenizer splits text as the first build did (Qwen2Tokenizer
  # rebuilt from the saved files split runs of spaces its own way)
  text = "def add(a, b):\n    return a + b"
  assert load_gguf_tokenizer(again)(text)["input_ids"] == toks[0](text)["input_ids"]
  assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 2


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


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q5_K", "Q2_K", "Q3_K", "Q8_0", "Q4_0",
                                   "BF16", "IQ4_XS", "F16", "F32"])
def test_dequantize_is_gguf_s_bit_for_bit(qtype):
  """The loader's dequantization (256-row groups on a thread pool) gives exactly gguf's values,
  for the quantization types the registry's models use and others, from random block bytes
  (f16 scale fields kept finite), on row counts that leave a short last group."""
  from concurrent.futures import ThreadPoolExecutor

  import gguf
  from gguf.quants import dequantize as gguf_dequantize

  from vocabjax.checkpoints.gguf_io import DEQUANT_ROWS, dequantize

  t = gguf.GGMLQuantizationType[qtype]
  block, size = gguf.GGML_QUANT_SIZES[t]
  rng = np.random.RandomState(0)
  rows = DEQUANT_ROWS * 2 + 37
  data = rng.randint(0, 256, (rows, 3 * size), np.uint8)
  if qtype in ("F16", "BF16", "F32"):  # plain floats: finite random values
    vals = rng.randn(rows, 3 * block).astype(np.float32)
    data = {"F32": vals, "F16": vals.astype(np.float16),
            "BF16": (vals.view(np.uint32) >> 16).astype(np.uint16)}[qtype].view(np.uint8)
  else:  # every 2-byte f16 field finite: clear bit 14 (no exponent of all ones)
    data[:, 1::2] &= 0xBF
  ref = gguf_dequantize(data, t)
  with ThreadPoolExecutor(2) as pool:
    got = dequantize(data, t, pool)
  assert got.dtype == np.float32 and got.shape == ref.shape == (rows, 3 * block)
  np.testing.assert_array_equal(got, ref)
  np.testing.assert_array_equal(dequantize(data[:5], t), gguf_dequantize(data[:5], t))


def test_gguf_reader_reads_what_gguf_s_reader_reads(tmp_path):
  """The loader's reader (plain-array slicing) gives gguf.GGUFReader's fields (names, parts,
  contents: strings, string arrays, scalar arrays) and tensors (type, shape, offset, bytes)."""
  import gguf

  from vocabjax.checkpoints.gguf_io import open_gguf

  path = write_tiny_gguf(tiny_hf_model("qwen2"), tmp_path / "m.gguf", qtype="Q8_0",
                         tokenizer=tiny_tokenizer())
  ours, stock = open_gguf(path), gguf.GGUFReader(path)
  assert type(ours) is not gguf.GGUFReader  # the fast reader (this gguf's _get is known)
  assert list(ours.fields) == list(stock.fields)
  assert any(len(f.data) > 100 for f in stock.fields.values())  # a vocabulary array was read
  for name, f in stock.fields.items():
    g = ours.fields[name]
    assert g.types == f.types and g.data == f.data and g.offset == f.offset, name
    assert len(g.parts) == len(f.parts), name
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(g.parts, f.parts))
    assert g.contents() == f.contents(), name
  assert [t.name for t in ours.tensors] == [t.name for t in stock.tensors]
  for a, b in zip(ours.tensors, stock.tensors):
    assert (a.tensor_type, a.data_offset, a.n_bytes) == (b.tensor_type, b.data_offset, b.n_bytes)
    np.testing.assert_array_equal(a.shape, b.shape)
    np.testing.assert_array_equal(a.data, b.data)


def test_a_yarn_gguf_loads_to_the_hf_models_logits(tmp_path):
  """llama.cpp's YaRN keys (rope.scaling.type yarn, factor, original_context_length) give
  transformers' YaRN (llama.cpp's ramp is its `truncate` one); knobs without a transformers
  counterpart are refused by name."""
  import gguf

  model = tiny_hf_model("qwen2", seed=7, num_attention_heads=4, num_key_value_heads=2,
                        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                             original_max_position_embeddings=8))
  config, ours = _logits(write_tiny_gguf(model, tmp_path / "yarn.gguf", "F32"))
  assert (config.rope_type, config.rope_factor, config.rope_original_max_position) == (
      "yarn", 4.0, 8)
  with torch.no_grad():
    ref = model(torch.tensor(TOKENS)).logits.numpy()
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  plain = tiny_hf_model("qwen2", seed=7, num_attention_heads=4, num_key_value_heads=2)
  with torch.no_grad():
    assert np.abs(plain(torch.tensor(TOKENS)).logits.numpy() - ref).max() > 1e-3  # not a no-op

  r = gguf.GGUFReader(str(tmp_path / "yarn.gguf"))
  assert r.fields["qwen2.rope.scaling.type"].contents() == "yarn"
  bad = tmp_path / "bad.gguf"
  w = gguf.GGUFWriter(str(bad), "qwen2")
  for f in r.fields.values():
    if f.name.startswith("GGUF.") or f.name == "general.architecture":
      continue
    w.add_key_value(f.name, f.contents(), f.types[0] if len(f.types) == 1 else f.types[0],
                    sub_type=f.types[1] if len(f.types) > 1 else None)
  w.add_rope_scaling_yarn_log_mul(0.1)
  for t in r.tensors:
    w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(UnsupportedConfigError,
                     match=r"qwen2.rope.scaling.yarn_log_multiplier=0.1\d* \(YaRN with it not "
                           r"implemented\)"):
    load_gguf(bad)
