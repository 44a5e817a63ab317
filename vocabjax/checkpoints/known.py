"""Model configs by name, without weights (layer: checkpoints).

A model is named by
  - a key of `KNOWN` (Hugging Face `config.json` values of the registry's models and of larger
    targets of the same families, written out here so that a machine without network, such as
    a lent GPU, can build them),
  - a path to a `config.json` or to a Hugging Face directory that holds one,
  - a `.gguf` file or a registry name whose file is already cached (its metadata is read; the
    weights are not loaded).

Used by the engine benchmark (`vocabjax.bench.shapes` re-exports it) and by
`python -m vocabjax.eval --report-only` (a summary's parameter counts without the weights).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vocabjax.checkpoints.hf_config import config_from_hf
from vocabjax.models.config import LlamaLikeConfig

_QWEN25 = dict(model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
               max_position_embeddings=32768)
_LLAMA31 = dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5, rope_theta=500000.0,
                max_position_embeddings=131072,
                rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=8192))
_GEMMA3 = dict(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh",
               rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
               head_dim=256, query_pre_attn_scalar=256, sliding_window_pattern=6,
               tie_word_embeddings=True, final_logit_softcapping=None,
               attn_logit_softcapping=None)
_QWEN25_05B = dict(_QWEN25, vocab_size=151936, hidden_size=896, intermediate_size=4864,
                   num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                   tie_word_embeddings=True)

KNOWN: dict[str, dict] = {
    # the registry's pair (same values as their GGUF metadata)
    "qwen2.5-coder-1.5b-instruct": dict(_QWEN25, vocab_size=151936, hidden_size=1536,
                                        intermediate_size=8960, num_hidden_layers=28,
                                        num_attention_heads=12, num_key_value_heads=2,
                                        tie_word_embeddings=True),
    "qwen2.5-coder-0.5b-instruct": _QWEN25_05B,
    "smollm2-135m-instruct": dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5,
                                  rope_theta=100000.0, vocab_size=49152, hidden_size=576,
                                  intermediate_size=1536, num_hidden_layers=30,
                                  num_attention_heads=9, num_key_value_heads=3,
                                  tie_word_embeddings=True, max_position_embeddings=8192),
    # 7-8B targets of the seed papers' size class, and drafters of their families
    "qwen2.5-7b-instruct": dict(_QWEN25, vocab_size=152064, hidden_size=3584,
                                intermediate_size=18944, num_hidden_layers=28,
                                num_attention_heads=28, num_key_value_heads=4,
                                tie_word_embeddings=False),
    "qwen2.5-0.5b-instruct": _QWEN25_05B,  # the Coder 0.5B's architecture
    # Meta-Llama-3-8B-Instruct (FR-Spec's target): Llama 3.1's shapes, no RoPE scaling, 8K
    "llama-3-8b-instruct": dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5,
                                rope_theta=500000.0, max_position_embeddings=8192,
                                vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, tie_word_embeddings=False),
    "llama-3.1-8b-instruct": dict(_LLAMA31, vocab_size=128256, hidden_size=4096,
                                  intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8,
                                  tie_word_embeddings=False),
    "llama-3.2-1b-instruct": dict(_LLAMA31, vocab_size=128256, hidden_size=2048,
                                  intermediate_size=8192, num_hidden_layers=16,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                  tie_word_embeddings=True,
                                  rope_scaling=dict(rope_type="llama3", factor=32.0,
                                                    low_freq_factor=1.0, high_freq_factor=4.0,
                                                    original_max_position_embeddings=8192)),
    # Qwen3 (its model cards' configs: q/k RMSNorm, head_dim 128 apart from D / H)
    "qwen3-8b": dict(model_type="qwen3", hidden_act="silu", rms_norm_eps=1e-6,
                     rope_theta=1000000.0, vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                     max_position_embeddings=40960),
    "qwen3-0.6b": dict(model_type="qwen3", hidden_act="silu", rms_norm_eps=1e-6,
                       rope_theta=1000000.0, vocab_size=151936, hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       max_position_embeddings=40960),
    # Mistral NeMo 12B (Mistral-Nemo-Instruct-2407): the 131,072-token Tekken vocabulary,
    # head_dim 128 apart from D / H, no sliding window
    "mistral-nemo-12b-instruct": dict(model_type="mistral", hidden_act="silu",
                                      rms_norm_eps=1e-5, rope_theta=1000000.0,
                                      vocab_size=131072, hidden_size=5120,
                                      intermediate_size=14336, num_hidden_layers=40,
                                      num_attention_heads=32, num_key_value_heads=8,
                                      head_dim=128, sliding_window=None,
                                      tie_word_embeddings=False,
                                      max_position_embeddings=1024000),
    # Gemma 3 (text decoders; transformers' Gemma3TextConfig values, `layer_types` from the
    # 5-local-1-global pattern). The 4B's vocabulary has 64 image-token rows past the 262,144
    # that the 270M and 1B share: drafting it with those needs the rows padded (`bench tpu
    # --pad-draft-vocab`).
    "gemma-3-270m": dict(_GEMMA3, vocab_size=262144, hidden_size=640, intermediate_size=2048,
                         num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                         sliding_window=512, max_position_embeddings=32768),
    "gemma-3-1b": dict(_GEMMA3, vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                       num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                       sliding_window=512, max_position_embeddings=32768),
    "gemma-3-4b": dict(_GEMMA3, vocab_size=262208, hidden_size=2560, intermediate_size=10240,
                       num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4,
                       sliding_window=1024, max_position_embeddings=131072,
                       rope_scaling=dict(rope_type="linear", factor=8.0)),
}


class ShapeError(ValueError):
  """A model the benchmark cannot find a config for."""


def resolve_config(spec: str | os.PathLike) -> tuple[str, LlamaLikeConfig]:
  """(a short name, the config) of a `KNOWN` key, a config.json / HF directory, or a cached
  .gguf / registry model (module doc)."""
  spec = str(spec)
  if spec in KNOWN:
    return spec, config_from_hf(KNOWN[spec])
  path = Path(spec)
  if path.is_dir() and (path / "config.json").is_file():
    path = path / "config.json"
  if path.suffix == ".json" and path.is_file():
    try:
      raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
      raise ShapeError(f"{path}: not a readable config.json ({e})") from None
    name = path.parent.name if path.name == "config.json" else path.stem
    return name, config_from_hf(raw)
  from vocabjax.checkpoints import zoo  # local: registry lookups only when asked for one

  if path.suffix == ".gguf" and path.is_file():
    return path.stem, _gguf_config(path)
  if spec in zoo.REGISTRY:
    entry = zoo.REGISTRY[spec]
    if zoo.is_verified(entry):
      return spec, _gguf_config(zoo.cache_dir() / entry.filename)
    raise ShapeError(f"registry model {spec!r} is not cached here and has no entry in "
                     f"vocabjax.checkpoints.known.KNOWN: `python -m vocabjax.zoo fetch {spec}` or pass "
                     f"a config.json")
  raise ShapeError(f"no config for model {spec!r}: name one of {sorted(KNOWN)}, a config.json "
                   f"(or a directory holding one), a .gguf file or a cached registry model")


def _gguf_config(path: Path) -> LlamaLikeConfig:
  from vocabjax.checkpoints import gguf_io  # local: gguf's import only for .gguf specs

  reader = gguf_io.open_gguf(path)
  names = {t.name for t in reader.tensors}
  emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
  if emb is None:
    raise ShapeError(f"{path}: tensor token_embd.weight missing")
  return gguf_io.config_from_gguf(gguf_io.metadata(reader), names, int(emb.shape[-1]))
