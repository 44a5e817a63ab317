"""EAGLE-3 head checkpoints in the layout SGLang (`LlamaForCausalLMEagle3`) and vLLM load:
a directory with `config.json` and `model.safetensors`.

Tensors (PyTorch [out, in] layout):
  fc.weight                                  [D, F*Dt]   (absent when F*Dt == D)
  midlayer.input_layernorm.weight            [D]         norm of the token embedding
  midlayer.hidden_norm.weight                [D]         norm of the fused feature
  midlayer.self_attn.{q,k,v}_proj.weight     [Q|KV, 2D]
  midlayer.self_attn.o_proj.weight           [D, Q]
  midlayer.post_attention_layernorm.weight   [D]
  midlayer.mlp.{gate,up,down}_proj.weight
  norm.weight                                [D]
  lm_head.weight                             [Vd, D]
  d2t                                        [Vd] int64  target id = draft id + d2t[draft id]
  t2d                                        [V] bool    target id is in the head's vocabulary
config.json: a Llama config with num_hidden_layers 1, `draft_vocab_size`, `target_hidden_size`
and `eagle_config.eagle_aux_hidden_state_layer_ids` (the fused target layers), plus a
`vocabjax` entry naming the target the head was trained for.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, check_trained_for
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf, hf_rope_fields
from vocabjax.io import atomic_directory
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import EagleConfig

LAYER = {"attn_norm": "midlayer.input_layernorm.weight",
         "hidden_norm": "midlayer.hidden_norm.weight",
         "wq": "midlayer.self_attn.q_proj.weight", "wk": "midlayer.self_attn.k_proj.weight",
         "wv": "midlayer.self_attn.v_proj.weight", "wo": "midlayer.self_attn.o_proj.weight",
         "mlp_norm": "midlayer.post_attention_layernorm.weight",
         "w_gate": "midlayer.mlp.gate_proj.weight", "w_up": "midlayer.mlp.up_proj.weight",
         "w_down": "midlayer.mlp.down_proj.weight"}
TOP = {"fc": "fc.weight", "final_norm": "norm.weight", "lm_head": "lm_head.weight"}


# config.json fields of the head's layer that its LlamaLikeConfig is read from (the rest are
# EAGLE-3's own or bookkeeping)
_LAYER_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                 "num_key_value_heads", "rope_theta", "rope_scaling", "rope_parameters",
                 "max_position_embeddings", "hidden_act", "attention_bias", "mlp_bias")


def _hf_config(config: EagleConfig, target: dict | None, extra: dict | None) -> dict:
  c = config.layer
  return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
          "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
          "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
          "head_dim": c.head_dim, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
          **hf_rope_fields(c), "max_position_embeddings": c.max_position_embeddings,
          "hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": c.vocab_size,
          "draft_vocab_size": config.draft_vocab_size,
          "target_hidden_size": config.target_hidden_size,
          "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(config.feature_layers),
                           "use_aux_hidden_state": True},
          "vocabjax": {"target": target or {}, **(extra or {}), **(
              {"rope_freq_factors": list(c.rope_freq_factors)} if c.rope_freq_factors else {})}}


def head_target_ids(d2t) -> np.ndarray:
  """The target id of each head-vocabulary id: EAGLE-3's `d2t` stores their differences."""
  d2t = np.asarray(d2t, np.int64)
  return np.arange(len(d2t)) + d2t


def save_eagle3(params: dict, config: EagleConfig, directory, *, target: dict | None = None,
                extra: dict | None = None) -> Path:
  """Write the head (atomically: a temporary directory renamed into place). `target`: the
  identity of the target it was trained for; `extra`: more provenance for config.json's
  `vocabjax` entry (the training job and step)."""
  from safetensors.numpy import save_file

  directory = Path(directory)
  tensors = {TOP[k]: params[k] for k in TOP if k in params}
  tensors.update({LAYER[k]: v for k, v in params["layer"].items()})
  arrays = {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in tensors.items()}
  d2t = np.asarray(params["d2t"], np.int64)
  target_ids = head_target_ids(d2t)
  t2d = np.zeros(config.layer.vocab_size, bool)
  t2d[target_ids] = True
  arrays.update(d2t=d2t, t2d=t2d)
  with atomic_directory(directory) as tmp:
    save_file(arrays, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(_hf_config(config, target, extra), indent=1))
  return directory


def _read_config(directory: Path) -> tuple[EagleConfig, dict]:
  try:
    raw = json.loads((directory / "config.json").read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{directory} is not a readable EAGLE-3 head ({e})") from None
  # the layer as a one-layer Llama config (its RoPE scaling included: EAGLE-3's heads for
  # Llama 3.1 targets carry the target's llama3 `rope_scaling`)
  try:
    D = raw["hidden_size"]
    layer_cfg = config_from_hf({
        "model_type": "llama", "num_hidden_layers": 1, "head_dim": raw.get("head_dim") or (
            D // raw["num_attention_heads"]), "rms_norm_eps": raw.get("rms_norm_eps", 1e-6),
        **{k: raw[k] for k in _LAYER_FIELDS if k in raw}})
  except KeyError as e:
    raise CheckpointError(f"{directory}/config.json lacks {e}") from None
  except UnsupportedConfigError as e:
    raise CheckpointError(f"{directory}/config.json: {e}") from None
  factors = raw.get("vocabjax", {}).get("rope_freq_factors")
  if factors:
    layer_cfg = layer_cfg.replace(rope_freq_factors=tuple(float(f) for f in factors))
  ids = raw.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
  if not ids:
    raise CheckpointError(f"{directory}/config.json names no fused target layers "
                          f"(eagle_config.eagle_aux_hidden_state_layer_ids)")
  return EagleConfig(layer=layer_cfg, target_hidden_size=raw.get("target_hidden_size", D),
                     feature_layers=tuple(ids),
                     draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"]), raw


def load_eagle3_config(directory) -> EagleConfig:
  """The head's config alone (config.json; no weights read)."""
  return _read_config(Path(directory))[0]


def load_eagle3(directory, *, target_config: LlamaLikeConfig | None = None,
                target_params: dict | None = None, dtype=jnp.float32,
                lm_head: bool = True) -> tuple[EagleConfig, dict, dict]:
  """(config, params, the `vocabjax.target` record) of an EAGLE-3 head directory; with
  `target_config`, a head made for another target (hidden size, vocabulary, layer count) is a
  ValueError naming the mismatch; with `target_params` too, a head whose recorded target has
  another LM-head fingerprint (other weights of the same shapes) is one as well.

  `lm_head=False`: the head's LM-head rows are checked (present, their shape) but not read, and
  params has no "lm_head" (a head that drafts through the target's own head: a full-vocabulary
  head's file carries a copy of that head, 0.9 GB in f32 for a 151,936 x 1,536 one)."""
  from safetensors import SafetensorError, safe_open

  directory = Path(directory)
  config, raw = _read_config(directory)
  target = raw.get("vocabjax", {}).get("target", {})
  if target_config is not None:
    config.check_target(target_config)
    if target_params is not None:
      check_trained_for(directory, target, target_params, target_config)
  try:
    with safe_open(str(directory / "model.safetensors"), framework="numpy") as f:
      tensors = _read_tensors(directory, config, f, lm_head)
  except (OSError, SafetensorError) as e:
    raise CheckpointError(f"{directory} is not a readable EAGLE-3 head ({e})") from None
  params = {"layer": {k: jnp.asarray(tensors[n], dtype) for k, n in LAYER.items()},
            "final_norm": jnp.asarray(tensors[TOP["final_norm"]], dtype),
            "d2t": jnp.asarray(tensors["d2t"], jnp.int32)}
  if lm_head:
    params["lm_head"] = jnp.asarray(tensors[TOP["lm_head"]], dtype)
  if config.has_fc:
    params["fc"] = jnp.asarray(tensors[TOP["fc"]], dtype)
  return config, params, target


def _read_tensors(directory: Path, config: EagleConfig, f, lm_head: bool) -> dict:
  """The head's tensors as numpy arrays from the open safetensors file `f`, each checked
  against the config's shape first (from the header; the LM head's rows are read only with
  `lm_head`); d2t checked against the target vocabulary."""
  c, Vd, D = config.layer, config.draft_vocab_size, config.hidden_size
  want = {LAYER["attn_norm"]: (D,), LAYER["hidden_norm"]: (D,),
          LAYER["wq"]: (c.q_dim, 2 * D), LAYER["wk"]: (c.kv_dim, 2 * D),
          LAYER["wv"]: (c.kv_dim, 2 * D), LAYER["wo"]: (D, c.q_dim), LAYER["mlp_norm"]: (D,),
          LAYER["w_gate"]: (c.intermediate_size, D), LAYER["w_up"]: (c.intermediate_size, D),
          LAYER["w_down"]: (D, c.intermediate_size), TOP["final_norm"]: (D,),
          TOP["lm_head"]: (Vd, D), "d2t": (Vd,)}
  if config.has_fc:
    want[TOP["fc"]] = (D, config.fused_width)
  names = set(f.keys())
  for name, shape in want.items():
    if name not in names:
      raise CheckpointError(f"{directory}: tensor {name} is missing")
    got = tuple(f.get_slice(name).get_shape())
    if got != shape:
      raise CheckpointError(f"{directory}: tensor {name} has shape {got}, expected {shape}")
  out = {name: f.get_tensor(name) for name in want if lm_head or name != TOP["lm_head"]}
  d2t = out["d2t"].astype(np.int64)
  target_ids = head_target_ids(d2t)
  if target_ids.min() < 0 or target_ids.max() >= c.vocab_size:
    raise CheckpointError(f"{directory}: d2t maps outside the target vocabulary "
                          f"[0, {c.vocab_size})")
  out["d2t"] = d2t
  return out
