"""`load_model(path, dtype="gguf")`: a GGUF file's quantized matrices stay as their blocks, the
model computes the f32 load's logits bit for bit, and what cannot be kept or loaded is said."""

import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.checkpoints.loader import load_model
from vocabjax.kernels.blocks import is_blocks
from vocabjax.models import KVCache, forward, lm_head
from vocabjax.models.llamalike import has_blocks
from vocabjax.testing.tiny import tiny_hf_model, write_tiny_gguf

TOKENS = np.random.RandomState(0).randint(0, 128, (1, 12))
WIDE = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4,
            num_key_value_heads=2)


def _logits(model):
  hidden, _ = forward(model.params, jnp.asarray(TOKENS), jnp.arange(12)[None],
                      KVCache.init(model.config, 1, 16), config=model.config)
  return np.asarray(lm_head(model.params, hidden, config=model.config))


@pytest.mark.parametrize("arch,qtype", [("qwen2", "Q4_K"), ("llama", "Q6_K"), ("llama", "Q5_0")])
def test_blocks_load_to_the_f32_logits(tmp_path, arch, qtype):
  """llama's q/k rows are permuted in the file: the loader unpermutes the rows of blocks."""
  path = write_tiny_gguf(tiny_hf_model(arch, seed=3, **WIDE), tmp_path / "m.gguf", qtype)
  blocks = load_model(path, dtype="gguf", load_tokenizer=False)
  dense = load_model(path, dtype="float32", load_tokenizer=False)
  assert blocks.dtype == "gguf" and has_blocks(blocks.params)
  wq = blocks.params["layers"][0]["wq"]
  assert is_blocks(wq) and wq.qtype == qtype and wq.shape == (256, 256)
  assert blocks.params["layers"][0]["attn_norm"].dtype == jnp.float32
  np.testing.assert_array_equal(_logits(blocks), _logits(dense))


def test_types_not_kept_are_dequantized_with_a_line(tmp_path):
  rng = np.random.default_rng(0)
  q2k = rng.integers(0, 256, (256, 84), dtype=np.uint8)  # one Q2_K block per row
  q2k[:, 80:84] = np.frombuffer(np.float16([0.001, 0.0005]).tobytes(), np.uint8)
  path = write_tiny_gguf(tiny_hf_model("qwen2", seed=3, **WIDE), tmp_path / "m.gguf", "Q8_0",
                         raw={"blk.0.attn_output.weight": (q2k, "Q2_K")})
  with pytest.warns(UserWarning, match=r"m.gguf: 1 Q2_K tensor\(s\) dequantized to float32 "
                                       r"\(kept as blocks: Q4_0, "):
    model = load_model(path, dtype="gguf", load_tokenizer=False)
  assert not is_blocks(model.params["layers"][0]["wo"])
  assert model.params["layers"][0]["wo"].dtype == jnp.float32
  assert is_blocks(model.params["layers"][1]["wo"])


def test_gguf_dtype_needs_a_gguf_file_and_one_device(tmp_path):
  model = tiny_hf_model("qwen2", seed=3)
  model.save_pretrained(tmp_path / "hf")
  with pytest.raises(ValueError, match=r"dtype='gguf' keeps a GGUF file's quantized blocks; "
                                       r".*hf is not a \.gguf file"):
    load_model(tmp_path / "hf", dtype="gguf", load_tokenizer=False)
  with pytest.raises(ValueError, match=r"unknown dtype='q4'; choose one of .*'gguf'"):
    load_model(tmp_path / "hf", dtype="q4", load_tokenizer=False)


def test_a_gguf_file_loads_its_own_blocks_by_default(tmp_path):
  """No dtype (None or 'auto') keeps a quantized GGUF file's blocks on one CPU device; f32 asks
  for its values dequantized, a mesh or another backend takes the backend default, and a
  float GGUF file loads as float32 (nothing to keep)."""
  from vocabjax.checkpoints.loader import GGUF, is_gguf_source, weights_default
  from vocabjax.sharding import make_mesh

  path = write_tiny_gguf(tiny_hf_model("qwen2", seed=3, **WIDE), tmp_path / "m.gguf", "Q8_0")
  for dtype in (None, "auto"):
    model = load_model(path, dtype=dtype, load_tokenizer=False)
    assert model.dtype == GGUF and has_blocks(model.params), dtype
  dense = load_model(path, dtype="f32", load_tokenizer=False)
  assert dense.dtype == jnp.float32 and not has_blocks(dense.params)
  np.testing.assert_array_equal(_logits(model), _logits(dense))
  import jax

  mesh = make_mesh(data=1, model=2, devices=jax.devices()[:2])
  on_mesh = load_model(path, load_tokenizer=False, mesh=mesh)
  assert not has_blocks(on_mesh.params) and on_mesh.dtype == jnp.float32
  assert weights_default(path, None, backend="tpu") == jnp.bfloat16
  assert weights_default(path, "float32") == jnp.float32
  assert is_gguf_source("qwen2.5-coder-0.5b-instruct") and not is_gguf_source(tmp_path)
  f32_file = write_tiny_gguf(tiny_hf_model("qwen2", seed=3, **WIDE), tmp_path / "f.gguf", "F32")
  plain = load_model(f32_file, load_tokenizer=False)
  assert plain.dtype == jnp.float32 and not has_blocks(plain.params)


@pytest.mark.parametrize("dtype", ["gguf", "float32"])
def test_a_loaded_model_keeps_no_view_of_its_file(tmp_path, dtype):
  """The file's mapping is released once the model is loaded: no parameter is a view of it (an
  F32 norm's array shared by XLA:CPU kept the whole file mapped, its pages resident)."""
  import gc

  path = write_tiny_gguf(tiny_hf_model("qwen2", seed=3, **WIDE), tmp_path / "m.gguf", "Q8_0")
  model = load_model(path, dtype=dtype, load_tokenizer=False)
  gc.collect()
  maps = [o for o in gc.get_objects()
          if isinstance(o, np.memmap) and str(getattr(o, "filename", "")) == str(path)]
  assert maps == [] and model.params["final_norm"].shape == (256,)


def test_a_tensor_s_pages_are_released_once_read(tmp_path, monkeypatch):
  """The loader drops each tensor's file pages from resident memory once it has read them
  (`gguf_io.release_pages`), every tensor's range once, and what it loaded is unchanged: a
  range read again after its release reads the file's bytes."""
  from vocabjax.checkpoints import gguf_io

  path = write_tiny_gguf(tiny_hf_model("qwen2", seed=3, **WIDE), tmp_path / "m.gguf", "Q4_K")
  released = []
  real = gguf_io.release_pages
  monkeypatch.setattr(gguf_io, "release_pages",
                      lambda reader, off, n: (released.append((off, n)), real(reader, off, n)))
  model = load_model(path, dtype="gguf", load_tokenizer=False)
  reader = gguf_io.open_gguf(path)
  want = {(int(t.data_offset), int(t.n_bytes)) for t in reader.tensors}
  assert sorted(released) == sorted(want)  # every tensor, once
  t = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
  before = np.array(t.data)
  real(reader, int(t.data_offset), int(t.n_bytes))
  np.testing.assert_array_equal(np.array(t.data), before)
  dense = load_model(path, dtype="float32", load_tokenizer=False)
  np.testing.assert_array_equal(_logits(model), _logits(dense))
