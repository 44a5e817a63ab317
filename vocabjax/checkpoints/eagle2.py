"""EAGLE-1/2 heads as their authors publish them (`yuhuili/EAGLE-*`, the heads FR-Spec and
VocabTrim measured): a Llama-style `config.json` and `pytorch_model.bin` (pickled: read with
`torch.load(weights_only=True)` only when allowed, `hub.allow_bin_default`) or
`model.safetensors`, read as EAGLE's `eagle/model/cnets.py` builds its `Model`:

  fc.weight                                   [D, 2D]   on [embedding; feature]
  fc.bias                                     [D]       when config.json's `bias` is not false
  layers.0.self_attn.{q,k,v,o}_proj.weight    (+ q/k/v biases with `qkv_bias`)
  layers.0.mlp.{gate,up,down}_proj.weight
  layers.0.post_attention_layernorm.weight    (layer 0 has no input_layernorm)
  embed_tokens.weight                         optional: the target's, checked against it

No final norm and no LM head: the target's LM head reads the layer's output
(`models.eagle`, kind "eagle2"). RoPE takes config.json's `rope_theta` (EAGLE-2's code on
GitHub; the PyPI release `eagle-llm` 1.2.1, EAGLE-1's code, always uses 10000).

`load_head` / `load_head_config` read either kind of head, telling them apart by config.json:
an EAGLE-3 head names its `draft_vocab_size` (or an `*Eagle3*` architecture)."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, check_finite
from vocabjax.checkpoints.eagle3 import (check_embedding, load_eagle3, load_eagle3_config,
                                         read_head_file)
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf
from vocabjax.io import atomic_directory
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import EagleConfig
from vocabjax.models.llamalike import FINAL_NORMED

LAYER = {"wq": "layers.0.self_attn.q_proj.weight", "wk": "layers.0.self_attn.k_proj.weight",
         "wv": "layers.0.self_attn.v_proj.weight", "wo": "layers.0.self_attn.o_proj.weight",
         "mlp_norm": "layers.0.post_attention_layernorm.weight",
         "w_gate": "layers.0.mlp.gate_proj.weight", "w_up": "layers.0.mlp.up_proj.weight",
         "w_down": "layers.0.mlp.down_proj.weight"}
BIASES = {"bq": "layers.0.self_attn.q_proj.bias", "bk": "layers.0.self_attn.k_proj.bias",
          "bv": "layers.0.self_attn.v_proj.bias"}
_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
           "num_key_value_heads", "rope_theta", "rope_scaling", "max_position_embeddings",
           "hidden_act")
_IGNORED = ("layers.0.self_attn.rotary_emb.inv_freq",)


def save_eagle2(params: dict, config: EagleConfig, directory, *, pickled: bool = False,
                embed=None) -> Path:
  """Write an EAGLE-1/2 head in its authors' layout (atomically): config.json as EAGLE's
  `EConfig` reads it and the weights under cnets.py's names, as `pytorch_model.bin` when
  `pickled` (the published heads' file) else `model.safetensors`; `embed` (the target's
  embedding) is written as `embed_tokens.weight`, as the authors' files carry it."""
  from safetensors.numpy import save_file

  c = config.layer
  tensors = {"fc.weight": params["input_fc"], **{LAYER[k]: params["layer"][k] for k in LAYER}}
  if "input_fc_bias" in params:
    tensors["fc.bias"] = params["input_fc_bias"]
  tensors.update({BIASES[k]: params["layer"][k] for k in BIASES if k in params["layer"]})
  if embed is not None:
    tensors["embed_tokens.weight"] = embed
  arrays = {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in tensors.items()}
  raw = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
         "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
         "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
         "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
         "max_position_embeddings": c.max_position_embeddings, "hidden_act": "silu",
         "vocab_size": c.vocab_size, "bias": "input_fc_bias" in params, "pad_token_id": 0,
         "qkv_bias": bool(c.attention_bias), "torch_dtype": "float32"}
  with atomic_directory(Path(directory)) as tmp:
    if pickled:
      import torch  # local: only the pickled layout needs it (an optional dependency)

      torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, tmp / "pytorch_model.bin")
    else:
      save_file(arrays, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(raw, indent=1))
  return Path(directory)


def _raw_config(directory: Path) -> dict:
  try:
    return json.loads((directory / "config.json").read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{directory} is not a readable EAGLE head ({e})") from None


def head_kind(directory) -> str:
  """"eagle3" or "eagle2" (EAGLE-1/2) for an EAGLE head directory (its config.json)."""
  raw = _raw_config(Path(directory))
  arch = " ".join(raw.get("architectures") or [])
  return "eagle3" if "draft_vocab_size" in raw or "Eagle3" in arch else "eagle2"


def load_eagle2_config(directory) -> EagleConfig:
  directory = Path(directory)
  raw = _raw_config(directory)
  if int(raw.get("num_hidden_layers", 1)) != 1:
    raise CheckpointError(f"{directory}/config.json: num_hidden_layers="
                          f"{raw.get('num_hidden_layers')}; vocabjax reads EAGLE-1/2 heads of "
                          f"one layer (the published heads')")
  try:
    D, H = raw["hidden_size"], raw["num_attention_heads"]
    layer = config_from_hf({
        "model_type": "llama", "num_hidden_layers": 1, "head_dim": D // H,
        "rms_norm_eps": raw.get("rms_norm_eps", 1e-6),
        "attention_bias": bool(raw.get("qkv_bias", False)),
        **{k: raw[k] for k in _FIELDS if k in raw and raw[k] is not None}})
  except KeyError as e:
    raise CheckpointError(f"{directory}/config.json lacks {e}") from None
  except UnsupportedConfigError as e:
    raise CheckpointError(f"{directory}/config.json: {e}") from None
  return EagleConfig(layer=layer, target_hidden_size=D, feature_layers=(FINAL_NORMED,),
                     draft_vocab_size=layer.vocab_size, kind="eagle2")


def load_eagle2(directory, *, target_config: LlamaLikeConfig | None = None,
                target_params: dict | None = None, dtype=jnp.float32,
                allow_bin: bool | None = None) -> tuple[EagleConfig, dict, dict]:
  """(config, params, {}) of an EAGLE-1/2 head; a head for another target (width, vocabulary)
  or with an embedding that is not the target's is refused by name."""
  directory = Path(directory)
  config = load_eagle2_config(directory)
  raw = _raw_config(directory)
  if target_config is not None:
    config.check_target(target_config)
  tensors = read_head_file(directory, lambda f: _read(directory, config, raw, f), "EAGLE head",
                           allow_bin)
  check_embedding(directory, tensors.pop("embed_tokens", None), target_params)
  params = {"layer": {k: jnp.asarray(tensors[k], dtype) for k in (*LAYER, *BIASES)
                      if k in tensors},
            "input_fc": jnp.asarray(tensors["fc"], dtype),
            "d2t": jnp.zeros((config.draft_vocab_size,), jnp.int32)}
  if "fc_bias" in tensors:
    params["input_fc_bias"] = jnp.asarray(tensors["fc_bias"], dtype)
  check_finite(params, str(directory))
  return config, params, {}


def _read(directory: Path, config: EagleConfig, raw: dict, f) -> dict:
  c, D = config.layer, config.hidden_size
  want = {"fc": ("fc.weight", (D, 2 * D)),
          "wq": (LAYER["wq"], (c.q_dim, D)), "wk": (LAYER["wk"], (c.kv_dim, D)),
          "wv": (LAYER["wv"], (c.kv_dim, D)), "wo": (LAYER["wo"], (D, c.q_dim)),
          "mlp_norm": (LAYER["mlp_norm"], (D,)),
          "w_gate": (LAYER["w_gate"], (c.intermediate_size, D)),
          "w_up": (LAYER["w_up"], (c.intermediate_size, D)),
          "w_down": (LAYER["w_down"], (D, c.intermediate_size))}
  if raw.get("bias", True) is not False:  # EAGLE's Model: nn.Linear(2D, D, bias=config.bias)
    want["fc_bias"] = ("fc.bias", (D,))
  if c.attention_bias:
    want.update({k: (n, (c.q_dim if k == "bq" else c.kv_dim,)) for k, n in BIASES.items()})
  names = f.keys()
  for key, (name, shape) in want.items():
    if name not in names:
      why = " (config.json's bias is not false)" if key == "fc_bias" else ""
      raise CheckpointError(f"{directory}: tensor {name} is missing{why}")
    if f.shape(name) != shape:
      raise CheckpointError(f"{directory}: tensor {name} has shape {f.shape(name)}, expected "
                            f"{shape}")
  embed = "embed_tokens.weight" if "embed_tokens.weight" in names else None
  unknown = sorted(names - {n for n, _ in want.values()} - set(_IGNORED) - {embed})
  if unknown:
    hint = (" (config.json says bias: false)" if "fc.bias" in unknown else
            " (EAGLE's layer 0 has no input norm)" if any("input_layernorm" in u for u in unknown)
            else "")
    raise CheckpointError(f"{directory}: tensor(s) {unknown[:8]} are not part of the EAGLE-1/2 "
                          f"head this reader implements{hint}")
  out = {key: f.get(name) for key, (name, _) in want.items()}
  if embed:
    out["embed_tokens"] = np.asarray(f.get(embed), np.float32)
  return out


def load_head_config(directory) -> EagleConfig:
  """Either kind of EAGLE head's config (no weights read)."""
  if head_kind(directory) == "eagle2":
    return load_eagle2_config(directory)
  return load_eagle3_config(directory)


def load_head(directory, *, target_config=None, target_params=None, dtype=jnp.float32,
              lm_head: bool = True, allow_bin: bool | None = None
              ) -> tuple[EagleConfig, dict, dict]:
  """Either kind of EAGLE head: `load_eagle3` or `load_eagle2` (which has no LM head of its
  own: `lm_head` does not apply). `allow_bin`: read a pickled `pytorch_model.bin` (the
  authors' format) where there is no safetensors file (None: `VOCABJAX_ALLOW_BIN`).
  `dtype` must be a float dtype (a quantized target's storage dtype is not the head's:
  `methods.eagle.head_dtype`)."""
  if not jnp.issubdtype(jnp.dtype(dtype), jnp.floating):
    raise ValueError(f"an EAGLE head's weights load as floats, got dtype={jnp.dtype(dtype).name} "
                     f"(a quantized target's stored dtype? pass the dtype it computes in)")
  if head_kind(directory) == "eagle2":
    return load_eagle2(directory, target_config=target_config, target_params=target_params,
                       dtype=dtype, allow_bin=allow_bin)
  return load_eagle3(directory, target_config=target_config, target_params=target_params,
                     dtype=dtype, lm_head=lm_head, allow_bin=allow_bin)
