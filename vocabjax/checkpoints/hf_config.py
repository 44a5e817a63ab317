"""Hugging Face `config.json` -> LlamaLikeConfig, failing loudly on anything that changes the math."""

from __future__ import annotations

from typing import Any, Mapping

from vocabjax.models.config import LlamaLikeConfig

# Fields handled below, or that never change the forward math (bookkeeping, generation defaults).
_KNOWN = {
    "_name_or_path", "architectures", "auto_map", "bos_token_id", "chunk_size_feed_forward",
    "dtype", "torch_dtype", "eos_token_id", "id2label", "label2id", "initializer_range",
    "is_encoder_decoder", "model_type", "output_attentions", "output_hidden_states",
    "pad_token_id", "problem_type", "return_dict", "transformers_version", "use_cache",
    "attention_dropout", "pretraining_tp", "max_window_layers", "tokenizer_class",
    "tie_word_embeddings", "max_position_embeddings", "rope_theta", "rope_scaling",
    "rope_parameters", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "hidden_act",
    "attention_bias", "mlp_bias", "use_sliding_window", "sliding_window", "layer_types",
    "bos_token", "eos_token", "residual_dropout", "embd_pdrop", "resid_pdrop", "use_return_dict",
    "task_specific_params", "finetuning_task", "tf_legacy_loss", "torchscript",
    "use_bfloat16", "prefix", "sep_token_id", "decoder_start_token_id", "cross_attention_hidden_size",
    "add_cross_attention", "tie_encoder_decoder", "is_decoder", "pruned_heads",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "num_labels", "_attn_implementation_autoset", "tokenizer_file",
}
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


class UnsupportedConfigError(ValueError):
  """A config field or value this decoder family does not implement."""


def config_from_hf(cfg: Mapping[str, Any]) -> LlamaLikeConfig:
  """Convert a Hugging Face config dict; raise UnsupportedConfigError listing what is not handled."""
  model_type = cfg.get("model_type")
  if model_type not in _MODEL_TYPES:
    raise UnsupportedConfigError(
        f"unknown architecture model_type={model_type!r}; supported: {sorted(_MODEL_TYPES)}")
  unknown = sorted(k for k in cfg if k not in _KNOWN)
  problems = [f"unknown field {k}={cfg[k]!r}" for k in unknown]

  def check(cond: bool, message: str):
    if not cond:
      problems.append(message)

  check(cfg.get("hidden_act", "silu") == "silu", f"hidden_act={cfg.get('hidden_act')!r} (only silu)")
  check(not cfg.get("mlp_bias", False), f"mlp_bias={cfg.get('mlp_bias')!r} (not implemented)")
  check(not cfg.get("use_sliding_window", False),
        f"use_sliding_window={cfg.get('use_sliding_window')!r} with "
        f"sliding_window={cfg.get('sliding_window')!r} (not implemented)")
  layer_types = cfg.get("layer_types") or []
  check(all(t == "full_attention" for t in layer_types),
        f"layer_types={sorted(set(layer_types))} (only full_attention)")

  rope = dict(cfg.get("rope_parameters") or {})
  if cfg.get("rope_scaling"):
    rope.update(cfg["rope_scaling"])
  theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
  rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
  known_rope = {"rope_theta", "rope_type", "type", "factor", "low_freq_factor",
                "high_freq_factor", "original_max_position_embeddings"}
  check(rope_type in ("default", "linear", "llama3"),
        f"rope_type={rope_type!r} (supported: default, linear, llama3)")
  extra_rope = sorted(k for k in rope if k not in known_rope and rope[k] is not None)
  check(not extra_rope, f"rope parameters {extra_rope} (not implemented)")
  if problems:
    raise UnsupportedConfigError(f"{model_type} config has fields that change the math and are "
                                 f"not supported: {'; '.join(problems)}")

  H = cfg["num_attention_heads"]
  head_dim = cfg.get("head_dim") or cfg["hidden_size"] // H
  # Qwen2 always has q/k/v bias; Llama and Qwen3 say so in `attention_bias`.
  bias = True if model_type == "qwen2" else bool(cfg.get("attention_bias", False))
  return LlamaLikeConfig(
      arch=_MODEL_TYPES[model_type],
      vocab_size=cfg["vocab_size"],
      hidden_size=cfg["hidden_size"],
      intermediate_size=cfg["intermediate_size"],
      num_layers=cfg["num_hidden_layers"],
      num_heads=H,
      num_kv_heads=cfg.get("num_key_value_heads") or H,
      head_dim=head_dim,
      rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
      rope_theta=float(theta),
      rope_type=rope_type,
      rope_factor=float(rope.get("factor", 1.0)),
      rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
      rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
      rope_original_max_position=int(rope.get("original_max_position_embeddings", 8192)),
      attention_bias=bias,
      qk_norm=model_type == "qwen3",
      tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
      max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
  )
