"""Weight-only int4 of any checkpoint (`load_model(dtype="int4")`: every matrix quantized into
Q4_0 blocks by `gguf`'s own quantizer): the blocks are gguf's bytes, their values within a group's
step of the weights, the model decodes on the blocks path with every method's greedy
output equal to plain decoding of the same int4 model, and bad input is refused in one line."""

import gguf
import jax
import numpy as np
import pytest

from tests.helpers.models import greedy_decoders
from vocabjax.checkpoints.loader import dtype_name, load_model, parse_dtype
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.kernels.blocks import BlockError, is_blocks, quantize
from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.models.llamalike import (LAYER_MATRICES, compute_dtype, has_blocks,
                                       quantize_blocks, quantize_int8)
from vocabjax.testing.tiny import save_tiny_variant

# widths of whole Q4_0 groups (32 values)
QCFG = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=64, intermediate_size=96,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                       attention_bias=True)


def _deq(w):
  return gguf.quants.dequantize(np.asarray(w.data), gguf.GGMLQuantizationType[w.qtype])


def test_quantized_blocks_are_ggufs_own():
  params = init_params(jax.random.key(0), QCFG, scale=0.3)
  q = quantize_blocks(params)
  assert has_blocks(q) and compute_dtype(q) == np.float32
  for name in ("embed", "lm_head"):
    w = np.asarray(params[name], np.float32)
    assert is_blocks(q[name]) and q[name].qtype == "Q4_0"
    want = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    np.testing.assert_array_equal(np.asarray(q[name].data), want)
  for layer, ql in zip(params["layers"], q["layers"]):
    for name in LAYER_MATRICES:
      w = np.asarray(layer[name], np.float32)
      deq = _deq(ql[name])
      assert deq.shape == w.shape
      # Q4_0: d = (the group's value of largest magnitude) / -8, codes round(w / d) + 8 cut at
      # 15: within half a step, a whole one at the clipped end (d rounded to float16)
      d = np.abs(w.reshape(w.shape[0], -1, 32)).max(-1, keepdims=True) / 8
      err = np.abs(deq - w).reshape(w.shape[0], -1, 32)
      assert (err <= d * 1.001 + 1e-7).all(), name
      assert np.median(err / d) < 0.35, name  # rounding: about a quarter step
      assert not np.array_equal(deq, w), name  # quantized, not copied
    np.testing.assert_array_equal(ql["attn_norm"], layer["attn_norm"])  # norms as they were


def test_int4_model_decodes_exactly_on_its_blocks():
  """Every method on an int4 target and drafter: plain decoding's tokens on the same model."""
  target = init_params(jax.random.key(0), QCFG, scale=0.3)
  noise = init_params(jax.random.key(1), QCFG, scale=0.3)
  draft = jax.tree.map(lambda a, b: a + 0.3 * b, target, noise)
  target, draft = quantize_blocks(target), quantize_blocks(draft)
  rs = np.random.RandomState(3)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 40)] + [[5, 9, 2, 5, 9, 2, 5]]
  decoders = greedy_decoders(target, draft, QCFG)
  ar = decoders.pop("ar").generate(prompts, max_new_tokens=16)
  for name, dec in decoders.items():
    res = dec.generate(prompts, max_new_tokens=16)
    assert res.tokens == ar.tokens, name
    if name != "pld":
      assert res.stats.tau > 1, name


def test_load_model_int4(tmp_path, monkeypatch):
  """The CPU's int4: Q4_0 blocks, norms f32 (the backend's name set to cpu, so that the test
  asks the same on a GPU machine; an accelerator's int4 is tests/kernels/test_grouped_int4.py's)."""
  from vocabjax.checkpoints import loader

  path = save_tiny_variant("llama_mha", tmp_path / "m")
  f32 = load_model(path, dtype="float32", load_tokenizer=False, progress=False)
  monkeypatch.setattr(loader, "jax", type("Jax", (), {"default_backend": staticmethod(
      lambda: "cpu")}))
  m = load_model(path, dtype="int4", load_tokenizer=False, progress=False)
  assert parse_dtype("int4") == "int4" and dtype_name(m.dtype) == "int4"
  assert is_blocks(m.params["layers"][0]["w_up"]) and is_blocks(m.params["embed"])
  assert m.params["layers"][0]["attn_norm"].dtype == np.float32
  np.testing.assert_array_equal(np.asarray(m.params["lm_head"].data), gguf.quants.quantize(
      np.asarray(f32.params["lm_head"]), gguf.GGMLQuantizationType.Q4_0))
  prompts = [[5, 9, 2, 5, 9, 2], [7]]
  out = Decoder(m.params, m.config).generate(prompts, max_new_tokens=8).tokens
  assert [len(r) for r in out] == [8, 8]
  with pytest.raises(ValueError, match=r"unknown dtype='int3'; choose one of .*'int4'"):
    parse_dtype("int3")


def test_bad_input_is_refused_in_one_line():
  narrow = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48,
                           num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8)
  params = init_params(jax.random.key(0), narrow, scale=0.3)
  # a group that does not divide the row: the matrix and its shape named
  with pytest.raises(BlockError, match=r"layers\.0\.w_down: a Q4_0 group of 32 values does "
                                       r"not divide its rows \(shape \(32, 48\)\)"):
    quantize_blocks(params)
  with pytest.raises(BlockError, match="cannot quantize into 'Q4_K': gguf quantizes Q4_0"):
    quantize(np.zeros((4, 256), np.float32), "Q4_K")
  with pytest.raises(BlockError, match="cannot quantize into 'Q3_X'"):
    quantize(np.zeros((4, 32), np.float32), "Q3_X")
  wide = init_params(jax.random.key(0), QCFG, scale=0.3)
  with pytest.raises(ValueError, match="GGUF blocks already"):
    quantize_blocks(quantize_blocks(wide))
  with pytest.raises(ValueError, match="cannot quantize int8 weights again"):
    quantize_blocks(quantize_int8(wide))
