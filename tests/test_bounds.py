"""Bounds from the machine before the work: a draft length or tree larger than a verification
block can be, or than the model's context; a KV cache larger than the free memory; a full
Medusa tree over many heads; a GGUF header whose counts claim more than the file holds. Each a
one-line error naming the values, before anything is compiled or allocated (before: gamma=100000
asked XLA for 642 GB, 50 Medusa heads built a 2^50-path tree, a 140-byte GGUF allocated until
memory ran out)."""

import struct

import pytest

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.gguf_io import check_header_counts, open_gguf


def _gguf(path, kvs=b"", n_kv=0, n_tensors=0):
  path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs)
  return path


def test_a_gguf_array_claiming_more_than_the_file_holds_is_refused(tmp_path):
  key = b"tokenizer.ggml.tokens"
  arr = struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + struct.pack("<IQ", 5, 1 << 40)
  p = _gguf(tmp_path / "huge.gguf", arr, n_kv=1)
  assert p.stat().st_size < 200
  with pytest.raises(CheckpointError, match=r"tokenizer.ggml.tokens: an array claiming "
                     r"1,099,511,627,776 elements needs"):
    open_gguf(p)
  arr = struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + struct.pack("<IQ", 8, 1 << 33)
  with pytest.raises(CheckpointError, match="an array claiming 8,589,934,592 elements"):
    check_header_counts(_gguf(tmp_path / "strings.gguf", arr, n_kv=1))
  s = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", 1 << 50)
  with pytest.raises(CheckpointError, match=r"-byte string\) needs"):
    check_header_counts(_gguf(tmp_path / "string.gguf", s, n_kv=1))
  with pytest.raises(CheckpointError, match="2,000,000,000 metadata entries"):
    check_header_counts(_gguf(tmp_path / "many.gguf", n_kv=2_000_000_000))


def test_a_real_gguf_passes_the_header_walk(tmp_path):
  from vocabjax.testing.tiny import tiny_hf_model, tiny_tokenizer, write_tiny_gguf

  tok = tiny_tokenizer(320)
  p = write_tiny_gguf(tiny_hf_model("llama", vocab_size=len(tok)), tmp_path / "m.gguf",
                      tokenizer=tok)
  check_header_counts(p)
  assert len(open_gguf(p).tensors) > 0


def test_a_full_medusa_tree_over_many_heads_is_refused_before_it_is_built():
  from vocabjax.decoding.medusa import medusa_choices_for
  from vocabjax.models.medusa import MedusaError

  with pytest.raises(MedusaError, match=r"top_k=2 ranks over 50 heads has "
                     r"2,251,799,813,685,246 nodes"):
    medusa_choices_for(50, 2)
  assert len(medusa_choices_for(3, 2)) == 14


def test_a_draft_longer_than_a_block_or_the_context_is_refused(tiny_chat_dir):
  from vocabjax.errors import ConfigError
  from vocabjax.generate import main, parse_args

  base = ["--target", str(tiny_chat_dir), "--draft", str(tiny_chat_dir), "--prompt", "hi",
          "--max-new-tokens", "4", "--quiet", "--method", "chain"]
  with pytest.raises(ConfigError, match=r"1 <= gamma <= 4096 .*got gamma=100000"):
    parse_args(base + ["--set", "gamma=100000"])
  with pytest.raises(ValueError, match=r"one chain step writes 1002 cache slots .*whole "
                     r"context of 256 positions"):
    main(parse_args(base + ["--set", "gamma=1000"]))
  from vocabjax.decoding.tree import TreeParams

  with pytest.raises(ValueError, match="at most 4096 nodes"):
    TreeParams(top_k=8, depth=100, total_tokens=5000)


def test_a_kv_cache_larger_than_the_free_memory_is_refused(tiny_chat_dir, monkeypatch):
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.drafter import ChainProposer
  from vocabjax.decoding import Decoder, engine

  m = load_model(tiny_chat_dir, dtype="float32")
  monkeypatch.setattr(engine, "available_memory_bytes", lambda: 1 << 10)
  dec = SpeculativeEngine(m.params, m.config, ChainProposer(m.params, m.config, m.config, gamma=3))
  with pytest.raises(ValueError, match=r"KV cache for 1 row\(s\) x .* slots needs at least "
                     r"0\.0 GiB; 0\.0 GiB are free"):
    dec.generate([[5, 6, 7]], max_new_tokens=8)
  with pytest.raises(ValueError, match=r"ar: the target's KV cache for 1 row"):  # one path
    Decoder(m.params, m.config).generate([[5, 6, 7]], max_new_tokens=8)
