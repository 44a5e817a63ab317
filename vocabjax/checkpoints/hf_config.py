"""Hugging Face `config.json` -> LlamaLikeConfig, failing loudly on anything that changes the math."""

from __future__ import annotations

import math
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
    # what transformers writes for a model read from a GGUF file (`from_pretrained(gguf_file=)`
    # then `save_pretrained`)
    "_model_name_or_path", "unk_token_id",
}
_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                "gemma3_text": "gemma3"}
# gemma3_text fields handled below (or bookkeeping: `_sliding_window_pattern` is what
# `layer_types` spells out, `final/attn_logit_softcapping` and `use_bidirectional_attention`
# are refused unless off).
_GEMMA3 = {"hidden_activation", "query_pre_attn_scalar", "rope_local_base_freq",
           "sliding_window_pattern", "_sliding_window_pattern", "final_logit_softcapping",
           "attn_logit_softcapping", "use_bidirectional_attention", "cache_implementation"}


class UnsupportedConfigError(ValueError):
  """A config field or value this decoder family does not implement."""


class InvalidConfigError(ValueError):
  """A config field that is missing or not a valid value (a size of 0, 64.5 or "2")."""


_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads")  # required positive integers
_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings"
                   )  # positive integers when given (null: the default; sliding_window has its
#                       own check, with the layers it applies to)


def check_sizes(cfg: Mapping[str, Any]) -> None:
  """Every size field a positive integer (bool, float and string values refused), and the
  norm epsilon a positive number: InvalidConfigError naming the field and its value, before a
  shape is computed from it (before: a ZeroDivisionError for 0 heads, a TypeError for a layer
  count written as a string, KeyError 'num_hidden_layers' for a missing one, and 64.5 taken)."""
  missing = [k for k in _SIZES if k not in cfg]
  if missing:
    raise InvalidConfigError(f"config.json lacks {missing}: a decoder's sizes")
  for k in (*_SIZES, *(k for k in _OPTIONAL_SIZES if cfg.get(k) is not None)):
    v = cfg[k]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise InvalidConfigError(f"config.json: {k}={v!r} must be a positive integer")
  eps = cfg.get("rms_norm_eps", 1e-6)
  if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
    raise InvalidConfigError(f"config.json: rms_norm_eps={eps!r} must be a number in (0, 1)")


def _checker(cfg: Mapping[str, Any], known: set):
  """(problems, check): the list of what a config has that the math does not handle, starting
  with its fields outside `known`, and `check(cond, message)`, which adds message unless cond."""
  problems = [f"unknown field {k}={cfg[k]!r}" for k in sorted(k for k in cfg if k not in known)]

  def check(cond: bool, message: str):
    if not cond:
      problems.append(message)

  return problems, check


def config_from_hf(cfg: Mapping[str, Any]) -> LlamaLikeConfig:
  """Convert a Hugging Face config dict; raise UnsupportedConfigError listing what is not handled."""
  model_type = cfg.get("model_type")
  if model_type == "gemma3":
    raise UnsupportedConfigError(
        "model_type='gemma3' is Gemma 3's image-text model (Gemma3ForConditionalGeneration, "
        "4B and up): only its text decoder is implemented; load a gemma3_text checkpoint "
        "(Gemma-3-270M, 1B) or one converted to Gemma3ForCausalLM")
  if model_type not in _MODEL_TYPES:
    raise UnsupportedConfigError(
        f"unknown architecture model_type={model_type!r}; supported: {sorted(_MODEL_TYPES)}")
  check_sizes(cfg)
  if model_type == "gemma3_text":
    return _gemma3_config(cfg)
  problems, check = _checker(cfg, _KNOWN)
  check(cfg.get("hidden_act", "silu") == "silu", f"hidden_act={cfg.get('hidden_act')!r} (only silu)")
  check(not cfg.get("mlp_bias", False), f"mlp_bias={cfg.get('mlp_bias')!r} (not implemented)")
  window, layer_types = _sliding_layers(model_type, cfg, check)

  rope = dict(cfg.get("rope_parameters") or {})
  scaling = dict(cfg.get("rope_scaling") or {})
  if "type" in scaling:  # transformers 4's spelling
    scaling.setdefault("rope_type", scaling.pop("type"))
  # transformers 5 writes `rope_parameters`; a `rope_scaling` added beside it (as model cards
  # say to add one) is read alone by transformers, with the top-level rope_theta or the
  # default 10,000: refused when the two disagree rather than read either way
  clash = sorted(k for k in scaling if rope and (k not in rope or rope[k] != scaling[k]))
  check(not clash, f"rope_parameters={cfg.get('rope_parameters')} and rope_scaling="
                   f"{cfg.get('rope_scaling')} disagree on {clash} (transformers then reads "
                   f"rope_scaling alone, with the top-level rope_theta or its default): keep "
                   f"one of them")
  rope.update(scaling)
  theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
  rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
  known_rope = {"rope_theta", "rope_type", "type", "factor", "low_freq_factor",
                "high_freq_factor", "original_max_position_embeddings"}
  if rope_type == "yarn":
    known_rope |= _YARN
  check(rope_type in ("default", "linear", "llama3", "yarn"),
        f"rope_type={rope_type!r} (supported: default, linear, llama3, yarn)")
  extra_rope = sorted(k for k in rope if k not in known_rope and rope[k] is not None)
  check(not extra_rope, f"rope parameters {extra_rope} (not implemented)")
  yarn = _yarn(rope, cfg, check) if rope_type == "yarn" else {}
  if problems:
    raise UnsupportedConfigError(f"{model_type} config has fields that change the math and are "
                                 f"not supported: {'; '.join(problems)}")

  H = cfg["num_attention_heads"]
  head_dim = cfg.get("head_dim") or cfg["hidden_size"] // H
  factor = yarn.pop("rope_factor", float(rope.get("factor", 1.0) or 1.0))
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
      rope_factor=factor,
      rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
      rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
      rope_original_max_position=int(rope.get("original_max_position_embeddings", 8192)),
      **yarn,
      attention_bias=bias,
      qk_norm=model_type == "qwen3",
      tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
      max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
      sliding_window=window,
      layer_types=layer_types,
  )


def hf_rope_fields(config: LlamaLikeConfig) -> dict:
  """`config`'s RoPE as a Hugging Face config.json spells it (`rope_theta`, and `rope_scaling`
  unless plain), what `config_from_hf` reads back to the same fields. GGUF's baked frequency
  factors (`rope_freq_factors`) have no config.json spelling and are left out."""
  c = config
  out: dict[str, Any] = {"rope_theta": c.rope_theta}
  if c.rope_type == "linear":
    out["rope_scaling"] = {"rope_type": "linear", "factor": c.rope_factor}
  elif c.rope_type == "llama3":
    out["rope_scaling"] = {"rope_type": "llama3", "factor": c.rope_factor,
                           "low_freq_factor": c.rope_low_freq_factor,
                           "high_freq_factor": c.rope_high_freq_factor,
                           "original_max_position_embeddings": c.rope_original_max_position}
  elif c.rope_type == "yarn":
    out["rope_scaling"] = {"rope_type": "yarn", "factor": c.rope_factor,
                           "original_max_position_embeddings": c.rope_original_max_position,
                           "beta_fast": c.rope_beta_fast, "beta_slow": c.rope_beta_slow,
                           "truncate": c.rope_truncate,
                           "attention_factor": c.rope_attention_factor}
  return out


# YaRN's parameters besides factor and original_max_position_embeddings (transformers'
# `_compute_yarn_parameters` reads these; `truncate` from transformers 4.55 on)
_YARN = {"beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"}


def yarn_mscale(factor: float, m: float = 1.0) -> float:
  """YaRN's scale of cos and sin for a context `factor` (the paper's 0.1 m ln(factor) + 1; 1
  when the factor does not stretch), as transformers and llama.cpp compute it."""
  return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _yarn(rope: Mapping[str, Any], cfg: Mapping[str, Any], check) -> dict:
  """LlamaLikeConfig's yarn fields from a `rope_scaling` / `rope_parameters` dict, as
  transformers computes them: a missing factor is max_position_embeddings over the original
  context; the attention factor, unless given, 0.1 ln(factor) + 1 (DeepSeek's mscale and
  mscale_all_dim: the ratio of two such terms); beta_fast / beta_slow default to 32 / 1."""
  original = rope.get("original_max_position_embeddings")
  check(original is not None, "rope_type='yarn' without original_max_position_embeddings")
  if original is None:
    return {}
  factor = rope.get("factor")
  if factor is None:
    factor = cfg.get("max_position_embeddings", 4096) / original

  attention = rope.get("attention_factor")
  if attention is None:
    m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
    attention = (yarn_mscale(factor, m) / yarn_mscale(factor, m_all) if m and m_all else
                 yarn_mscale(factor))
  return dict(rope_factor=float(factor), rope_attention_factor=float(attention),
              rope_beta_fast=float(rope.get("beta_fast") or 32),
              rope_beta_slow=float(rope.get("beta_slow") or 1),
              rope_truncate=bool(rope.get("truncate", True)))


def _sliding_layers(model_type: str, cfg: Mapping[str, Any], check):
  """(sliding_window, layer_types) of a llama / mistral / qwen2 / qwen3 config, as transformers
  reads them: Mistral slides every layer over `sliding_window` when it is set (null: none);
  Qwen2 and Qwen3 only with `use_sliding_window`, on the layers `layer_types` names (configs
  without it: layers from `max_window_layers` on, transformers' rule); Llama has no sliding
  layers, so a config that asks for them is refused. (None, None) when every layer is full."""
  L = cfg["num_hidden_layers"]
  W = cfg.get("sliding_window")
  types = cfg.get("layer_types")
  if model_type == "mistral":
    window, types = W, ["sliding_attention"] * L if W is not None else None
  elif model_type in ("qwen2", "qwen3"):
    window = W if cfg.get("use_sliding_window", False) else None
    if window is None:
      types = None
    elif not types:
      start = cfg.get("max_window_layers", 28)
      types = ["sliding_attention" if i >= start else "full_attention" for i in range(L)]
  else:
    check(not cfg.get("use_sliding_window", False),
          f"use_sliding_window={cfg.get('use_sliding_window')!r} with "
          f"sliding_window={W!r} ({model_type} has no sliding-window layers)")
    check(all(t == "full_attention" for t in types or []),
          f"layer_types={sorted(set(types or []))} ({model_type} has only full_attention)")
    return None, None
  if types is None:
    return None, None
  bad = sorted(set(types) - {"full_attention", "sliding_attention"})
  positive = isinstance(window, int) and window > 0
  check(not bad, f"layer_types {bad} (supported: full_attention, sliding_attention)")
  check(len(types) == L, f"layer_types has {len(types)} entries for num_hidden_layers={L}")
  check(positive, f"sliding_window={window!r} (a positive integer)")
  if bad or len(types) != L or not positive or "sliding_attention" not in types:
    return None, None
  return int(window), tuple(types)


def _gemma3_config(cfg: Mapping[str, Any]) -> LlamaLikeConfig:
  """transformers' Gemma3TextConfig (model_type gemma3_text, either the per-layer-type
  `rope_parameters` of transformers 5 or the older `rope_theta` / `rope_local_base_freq` /
  `rope_scaling`) -> LlamaLikeConfig with Gemma's switches on."""
  problems, check = _checker(cfg, _KNOWN | _GEMMA3)
  act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
  check(act in ("gelu_pytorch_tanh", "gelu_tanh"),
        f"hidden_activation={act!r} (only gelu_pytorch_tanh)")
  for field in ("final_logit_softcapping", "attn_logit_softcapping"):
    check(cfg.get(field) is None, f"{field}={cfg.get(field)!r} (soft-capping not implemented)")
  check(not cfg.get("use_bidirectional_attention", False),
        f"use_bidirectional_attention={cfg.get('use_bidirectional_attention')!r} (only causal)")
  check(not cfg.get("attention_bias", False),
        f"attention_bias={cfg.get('attention_bias')!r} (not implemented for gemma3)")
  check(not cfg.get("mlp_bias", False), f"mlp_bias={cfg.get('mlp_bias')!r} (not implemented)")

  L = cfg["num_hidden_layers"]
  layer_types = cfg.get("layer_types")
  if not layer_types:  # older configs: every `sliding_window_pattern`-th layer is global
    pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6))
    layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                   for i in range(L)]
  bad_types = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
  check(not bad_types, f"layer_types {bad_types} (supported: full_attention, "
                       f"sliding_attention)")

  # RoPE: global layers (full_attention) and local layers (sliding_attention)
  per_type = cfg.get("rope_parameters") or {}
  if per_type and "full_attention" in per_type:
    full = dict(per_type.get("full_attention") or {})
    local = dict(per_type.get("sliding_attention") or {})
  else:
    full = dict(per_type)
    full.setdefault("rope_theta", cfg.get("rope_theta", 1_000_000.0))
    if cfg.get("rope_scaling"):
      full.update(cfg["rope_scaling"])
    local = {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq", 10_000.0)}
  full_type = full.get("rope_type", full.get("type", "default")) or "default"
  local_type = local.get("rope_type", local.get("type", "default")) or "default"
  check(full_type in ("default", "linear"),
        f"full_attention rope_type={full_type!r} (supported: default, linear)")
  check(local_type == "default", f"sliding_attention rope_type={local_type!r} (only default)")
  for name, rope in (("full_attention", full), ("sliding_attention", local)):
    extra = sorted(k for k in rope if k not in ("rope_theta", "rope_type", "type", "factor")
                   and rope[k] is not None)
    check(not extra, f"{name} rope parameters {extra} (not implemented)")
  if problems:
    raise UnsupportedConfigError(f"gemma3_text config has fields that change the math and are "
                                 f"not supported: {'; '.join(problems)}")

  H = cfg["num_attention_heads"]
  head_dim = cfg.get("head_dim") or cfg["hidden_size"] // H
  return LlamaLikeConfig(
      arch="gemma3",
      vocab_size=cfg["vocab_size"],
      hidden_size=cfg["hidden_size"],
      intermediate_size=cfg["intermediate_size"],
      num_layers=L,
      num_heads=H,
      num_kv_heads=cfg.get("num_key_value_heads") or H,
      head_dim=head_dim,
      rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
      rope_theta=float(full.get("rope_theta", 1_000_000.0)),
      rope_type=full_type,
      rope_factor=float(full.get("factor", 1.0) or 1.0),
      qk_norm=True,
      tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
      max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
      hidden_act="gelu_tanh",
      norm_unit_offset=True,
      sandwich_norms=True,
      scale_embeddings=True,
      query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or head_dim),
      sliding_window=int(cfg["sliding_window"]) if "sliding_attention" in layer_types else None,
      layer_types=tuple(layer_types),
      rope_local_theta=float(local.get("rope_theta", 10_000.0)),
  )
