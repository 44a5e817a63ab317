"""EAGLE-3 head checkpoints in the layouts their authors and servers publish: a directory with
`config.json` and `model.safetensors` (SGLang's `LlamaForCausalLMEagle3`, vLLM, SpecForge's
export) or `pytorch_model.bin` (the EAGLE authors' `yuhuili/EAGLE3-*` heads; pickled, read with
`torch.load(weights_only=True)` only when allowed: `hub.allow_bin_default`).

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

As published (EAGLE's `eagle/model/cnets.py`, SGLang's `llama_eagle3.py`): the layer's tensors
may be named `layers.0.*` or `model.layers.0.*` instead of `midlayer.*`; the authors' configs
name no fused layers (their code always reads the outputs of target layers 1, L/2 - 1 and
L - 4: `models.eagle.default_feature_layers`); `d2t` may be absent when the head drafts over
the whole vocabulary; `embed_tokens.weight` (a copy of the target's embedding, which drafting
uses) is checked against the target's. A tensor this reader does not know (SpecForge's
`fc_norm.*`, an `fc.bias`: options of other heads that this forward does not implement) is
refused by name rather than ignored, and so is a config option that changes the forward away
from its default (SpecForge's `norm_output: false`, `norm_before_residual: true`, `fc_norm`,
`norm_before_fc`).

vLLM's `speculators` layout (`speculators_model_type: "eagle3"`, what its `Eagle3Converter` and
`save_pretrained` write): the layer's fields in `transformer_layer_config` (a Llama config;
completed by its own class, as `speculators` writes a diff), `draft_vocab_size`,
`target_hidden_size` (null: the head's width) and `eagle_aux_hidden_state_layer_ids` at the top
level, numbered as `output_hidden_states` indexes them (id j is the output of layer j - 1:
one higher than SGLang's numbering, which vocabjax uses, so read one lower; null: speculators'
default (2, L // 2, L - 3), i.e. the authors' layers); the layer's tensors as `layers.0.*`.
Its options this forward does not implement are refused by name: `norm_before_residual`,
`norm_before_fc`, `fc_norm` (extra norms) and `norm_output` (the normed output fed back).
A `speculators` P-EAGLE head (`"peagle"`: the same fields and `mask_token_id`) adds
`mask_hidden` [1, 1, F] and may carry its own trained `embed_tokens`, which it then embeds
with (`vocabjax.decoding.peagle`). Where a reduced head's file has `t2d`, d2t is checked
against it: a d2t of absolute target ids instead of offsets is refused by name.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, check_finite, check_trained_for
from vocabjax.checkpoints.hf import torch_state
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf, hf_rope_fields
from vocabjax.checkpoints.hub import allow_bin_default, bin_refusal
from vocabjax.io import atomic_directory
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import EagleConfig, default_feature_layers

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
          # only when it differs: the authors' code reads its presence as "the head has its own
          # embedding" (cnets.py), and vocabjax's heads embed with the target's
          **({"target_hidden_size": config.target_hidden_size}
             if config.target_hidden_size != c.hidden_size else {}),
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


def _read_config(directory: Path, target_layers: int | None = None
                 ) -> tuple[EagleConfig, dict]:
  """The head's config; `target_layers` (the target's layer count) gives the authors' fused
  layers where config.json names none (without it: placeholders, for sizes only)."""
  try:
    raw = json.loads((directory / "config.json").read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{directory} is not a readable EAGLE-3 head ({e})") from None
  if is_speculators(raw):
    raw = _from_speculators(raw, f"{directory}/config.json")
  else:
    _refuse_options(raw, f"{directory}/config.json")
    refuse_flattened_ids(raw, f"{directory}/config.json", "eagle_aux_hidden_state_layer_ids",
                         "eagle_config.eagle_aux_hidden_state_layer_ids")
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
  ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
  if not ids:  # the authors' heads: their code reads layers (1, L/2 - 1, L - 4) of the target
    ids = default_feature_layers(target_layers) if target_layers else (-1, -1, -1)
  try:
    return EagleConfig(layer=layer_cfg, target_hidden_size=raw.get("target_hidden_size") or D,
                       feature_layers=tuple(ids),
                       draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
                       mask_token_id=raw.get(PEAGLE_MASK)), raw
  except ValueError as e:
    raise CheckpointError(f"{directory}/config.json: {e}") from None


# SGLang / SpecForge / vLLM config options whose non-default value changes the forward, which
# vocabjax implements at their defaults only (SpecForge's `norm_output: false` drops the final
# norm before the LM head; `norm_before_residual` takes the normed feature as the residual;
# `fc_norm` norms each fused layer)
_OPTION_DEFAULTS = {"norm_output": True, "norm_before_residual": False, "fc_norm": False,
                    "norm_before_fc": False}


def _refuse_options(raw: dict, where: str) -> None:
  own = {**raw, **(raw.get("eagle_config") or {})}
  off = [f"{k}={json.dumps(own[k])}" for k, default in _OPTION_DEFAULTS.items()
         if k in own and own[k] is not None and bool(own[k]) != default]
  if off:
    raise CheckpointError(f"{where}: {', '.join(off)}: an option of the head's forward that "
                          f"vocabjax implements only at its default; refused rather than "
                          f"ignored")


PEAGLE_MASK = "peagle_mask_token_id"  # where `_from_speculators` hands P-EAGLE's mask id on
SPECULATORS_OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def refuse_flattened_ids(raw: dict, where: str, key: str, own: str) -> None:
  """A config that names target layers under speculators' key (`key`) at the top level but is
  not in speculators' layout (no speculators_model_type or transformer_layer_config: a config
  flattened by hand): the ids would be ignored for the defaults, and their numbering is
  unknown (speculators counts one higher), so it is refused naming both places."""
  if raw.get(key) is not None:
    raise CheckpointError(f"{where}: {key}={raw[key]!r} at the top level of a config that is "
                          f"not speculators' layout (no speculators_model_type / "
                          f"transformer_layer_config): write the layers as {own} (SGLang / "
                          f"z-lab numbering) or keep speculators' whole config (its numbering, "
                          f"one higher); refused rather than read with the default layers")


def is_speculators(raw: dict) -> bool:
  """A config.json in vLLM's `speculators` layout."""
  return "speculators_model_type" in raw or "transformer_layer_config" in raw


def speculators_layer_config(raw: dict, where: str, default_type: str) -> dict:
  """A `speculators` config's `transformer_layer_config` whole: speculators writes a diff
  (`to_diff_dict`), completed by its model type's own transformers config class."""
  # local: transformers' config registry, only for this layout
  from transformers import AutoConfig

  tlc = raw.get("transformer_layer_config")
  if not isinstance(tlc, dict):
    raise CheckpointError(f"{where}: transformer_layer_config={tlc!r} must be the drafter "
                          f"layers' config")
  try:
    rest = {k: v for k, v in tlc.items() if k != "model_type"}
    return AutoConfig.for_model(tlc.get("model_type", default_type), **rest).to_dict()
  except (ValueError, KeyError, TypeError) as e:
    raise CheckpointError(f"{where}: transformer_layer_config: {e}") from None


def speculators_layer_ids(raw: dict, key: str, where: str) -> tuple[int, ...]:
  """A `speculators` config's target layer ids (`key`), counted as `output_hidden_states`
  indexes them (j: layer j - 1's output), as vocabjax counts them (one lower); CheckpointError
  for anything but a list of ids >= 1 (0 is the embedding's output, which no drafter here
  reads)."""
  ids = raw.get(key)
  if (not isinstance(ids, list) or not ids
      or not all(isinstance(j, int) and not isinstance(j, bool) for j in ids)):
    raise CheckpointError(f"{where}: {key}={ids!r} must name the target layers read")
  if min(ids) < 1:
    raise CheckpointError(f"{where}: {key}={ids} names 0, the embedding's output "
                          f"(speculators counts as output_hidden_states does: j is layer "
                          f"j - 1's output); vocabjax reads layer outputs")
  return tuple(j - 1 for j in ids)


def _from_speculators(raw: dict, where: str) -> dict:
  """A `speculators` EAGLE-3 config as the SGLang-layout fields this reader reads (module doc);
  CheckpointError naming a field it cannot honour."""
  kind = raw.get("speculators_model_type")
  if kind not in ("eagle3", "peagle"):
    other = {"dflash": "a DFlash drafter (method dflash)",
             "dflash2": "a DFlash 2 drafter (method dflash)"}.get(kind, "another speculator")
    raise CheckpointError(f"{where}: speculators_model_type={kind!r}: {other}, not an "
                          f"EAGLE-3 or P-EAGLE head this reader reads")
  mask = raw.get("mask_token_id")
  if kind == "peagle" and (not isinstance(mask, int) or isinstance(mask, bool)):
    raise CheckpointError(f"{where}: mask_token_id={mask!r}: a P-EAGLE head needs the id of "
                          f"the token its parallel positions read")
  on = [k for k in SPECULATORS_OPTIONS if raw.get(k)]
  if on:
    raise CheckpointError(f"{where}: {', '.join(f'{k}=true' for k in on)}: an option of "
                          f"speculators' EAGLE-3 head that vocabjax's forward does not "
                          f"implement; refused rather than ignored")
  model_type = (raw.get("transformer_layer_config") or {}).get("model_type", "llama")
  if model_type != "llama":
    raise CheckpointError(f"{where}: transformer_layer_config.model_type={model_type!r}: "
                          f"vocabjax reads EAGLE-3 heads of Llama layers (a Qwen3 layer's "
                          f"q/k norms are not implemented)")
  full = speculators_layer_config(raw, where, "llama")
  ids = raw.get("eagle_aux_hidden_state_layer_ids")
  if ids is not None:
    ids = speculators_layer_ids(raw, "eagle_aux_hidden_state_layer_ids", where)
  out = {k: full[k] for k in _LAYER_FIELDS + ("head_dim", "rms_norm_eps") if k in full}
  if raw.get("draft_vocab_size") is not None:
    out["draft_vocab_size"] = raw["draft_vocab_size"]
  if raw.get("target_hidden_size") is not None:
    out["target_hidden_size"] = raw["target_hidden_size"]
  if ids is not None:
    out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids)}
  if kind == "peagle":
    out[PEAGLE_MASK] = mask
  return out


def load_eagle3_config(directory) -> EagleConfig:
  """The head's config alone (config.json; no weights read)."""
  return _read_config(Path(directory))[0]


def load_eagle3(directory, *, target_config: LlamaLikeConfig | None = None,
                target_params: dict | None = None, dtype=jnp.float32,
                lm_head: bool = True, allow_bin: bool | None = None
                ) -> tuple[EagleConfig, dict, dict]:
  """(config, params, the `vocabjax.target` record) of an EAGLE-3 head directory; with
  `target_config`, a head made for another target (hidden size, vocabulary, layer count) is a
  ValueError naming the mismatch; with `target_params` too, a head whose recorded target has
  another LM-head fingerprint (other weights of the same shapes) is one as well.

  `lm_head=False`: the head's LM-head rows are checked (present, their shape) but not read, and
  params has no "lm_head" (a head that drafts through the target's own head: a full-vocabulary
  head's file carries a copy of that head, 0.9 GB in f32 for a 151,936 x 1,536 one).
  `allow_bin`: read the authors' pickled `pytorch_model.bin` where there is no safetensors file
  (None: the environment's `VOCABJAX_ALLOW_BIN`)."""
  directory = Path(directory)
  config, raw = _read_config(directory, target_config.num_layers if target_config else None)
  if min(config.feature_layers) < 0:
    raise CheckpointError(f"{directory}/config.json names no fused target layers (eagle_config."
                          f"eagle_aux_hidden_state_layer_ids): the authors' default needs the "
                          f"target's layer count, pass target_config")
  target = raw.get("vocabjax", {}).get("target", {})
  if target_config is not None:
    config.check_target(target_config)
    if target_params is not None:
      check_trained_for(directory, target, target_params, target_config)
  tensors = read_head_file(directory, lambda f: _read_tensors(directory, config, f, lm_head),
                           "EAGLE-3 head", allow_bin)
  embed = tensors.pop("embed_tokens", None)
  if not config.parallel:
    check_embedding(directory, embed, target_params)
  params = {"layer": {k: jnp.asarray(tensors[n], dtype) for k, n in LAYER.items()},
            "final_norm": jnp.asarray(tensors[TOP["final_norm"]], dtype),
            "d2t": jnp.asarray(tensors["d2t"], jnp.int32)}
  if config.parallel:  # P-EAGLE trains its embedding: it embeds with its own where it has one
    params["mask_hidden"] = jnp.asarray(tensors["mask_hidden"], dtype)
    if embed is not None:
      if embed.shape != (config.layer.vocab_size, config.hidden_size):
        raise CheckpointError(f"{directory}: embed_tokens has shape {embed.shape}, expected "
                              f"({config.layer.vocab_size}, {config.hidden_size})")
      params["embed_tokens"] = jnp.asarray(embed, dtype)
  if lm_head:
    params["lm_head"] = jnp.asarray(tensors[TOP["lm_head"]], dtype)
  if config.has_fc:
    params["fc"] = jnp.asarray(tensors[TOP["fc"]], dtype)
  check_finite(params, str(directory))
  return config, params, target


def read_head_file(directory: Path, read, what: str, allow_bin: bool | None = None) -> dict:
  """`read(f)` over a head directory's weights, `f` a `_Safetensors` of model.safetensors or,
  where only the authors' pytorch_model.bin is there and pickles are allowed, a `_State` of it;
  an unreadable file is a CheckpointError naming `what`."""
  from safetensors import SafetensorError, safe_open

  try:
    if (directory / "model.safetensors").exists() or not (directory / "pytorch_model.bin"
                                                          ).exists():
      with safe_open(str(directory / "model.safetensors"), framework="numpy") as f:
        return read(_Safetensors(f))
    if not allow_bin_default(allow_bin):
      raise CheckpointError(bin_refusal(str(directory), ["pytorch_model.bin"]))
    return read(_State(torch_state(directory / "pytorch_model.bin")))
  except (OSError, SafetensorError) as e:
    raise CheckpointError(f"{directory} is not a readable {what} ({e})") from None


def check_embedding(directory: Path, embed, target_params: dict | None) -> None:
  """A head file's copy of the token embedding must be the target's (drafting embeds with the
  target's): a CheckpointError otherwise."""
  if embed is None or target_params is None:
    return
  own = np.asarray(target_params["embed"], np.float32)
  if embed.shape != own.shape or not np.allclose(embed, own, rtol=1e-2, atol=1e-3):
    raise CheckpointError(f"{directory}: the head carries its own token embedding "
                          f"(embed_tokens.weight), not the target's; vocabjax drafts with the "
                          f"target's embedding (a head trained for another target?)")


class _Safetensors:
  """An open safetensors file: names, shapes from the header, tensors on demand."""

  def __init__(self, f):
    self.f = f

  def keys(self):
    return set(self.f.keys())

  def shape(self, name):
    return tuple(self.f.get_slice(name).get_shape())

  def get(self, name):
    return self.f.get_tensor(name)


class _State:
  """A loaded state dict (a pickled file read with weights_only) behind the same interface."""

  def __init__(self, state: dict):
    self.state = state

  def keys(self):
    return set(self.state)

  def shape(self, name):
    return tuple(self.state[name].shape)

  def get(self, name):
    return self.state[name]


# what the published layouts call the layer's tensors (EAGLE's midlayer, SGLang's layers.0)
_LAYER_PREFIXES = ("midlayer.", "layers.0.", "model.layers.0.")
# tensors read elsewhere or not at all: t2d (the inverse of d2t), the rotary cache of older exports
_IGNORED = ("t2d", "midlayer.self_attn.rotary_emb.inv_freq",
            "layers.0.self_attn.rotary_emb.inv_freq")


def _aliases(name: str) -> tuple[str, ...]:
  """The names `name` (this module's) goes by in the published layouts."""
  if name.startswith("midlayer."):
    rest = name[len("midlayer."):]
    return tuple(p + rest for p in _LAYER_PREFIXES)
  return (name, "model." + name) if name != "d2t" else (name,)


def report_vocab_map(where, target: np.ndarray, vocab_size: int) -> None:
  """One stderr line on loading a head of its own: how many target ids it drafts, which."""
  ids = target.tolist()
  shown = ", ".join(map(str, ids[:4])) + (f", ..., {ids[-1]}" if len(ids) > 4 else "")
  print(f"[vocabjax] {where}: a head over {len(ids):,} of the target's {vocab_size:,} ids "
        f"({len(ids) / vocab_size:.1%}; target ids {shown})", file=sys.stderr)


def check_d2t(where, d2t: np.ndarray, t2d: np.ndarray | None, vocab_size: int) -> np.ndarray:
  """The target ids a reduced head's `d2t` (offsets: target id = draft id + d2t[draft id])
  names, checked: inside the vocabulary, ascending, and (where the file has `t2d` [V], the
  target ids' mask) the ids t2d marks. A d2t of absolute target ids, as an exporter that
  confuses the two writes, is named as such where t2d shows it, and without t2d where it is
  `arange(Vd)` (the absolute map of the first Vd ids, whose offsets are all 0: as offsets it
  would draft only even ids); a float d2t, a t2d that is not a [V] mask, and the first bad
  draft id are named."""
  raw = np.asarray(d2t)
  if not np.issubdtype(raw.dtype, np.integer):
    raise CheckpointError(f"{where}: d2t holds {raw.dtype} values; it must hold integer offsets "
                          f"(target id = draft id + d2t[draft id])")
  if t2d is not None and np.shape(t2d) != (vocab_size,):
    raise CheckpointError(f"{where}: t2d has shape {tuple(np.shape(t2d))}; it must be the "
                          f"target vocabulary's mask of shape ({vocab_size},)")
  d2t = raw.astype(np.int64)
  Vd = d2t.size
  target = head_target_ids(d2t)
  marked = None if t2d is None else np.flatnonzero(np.asarray(t2d).astype(bool))
  # without t2d, arange(Vd) reads as absolute ids (with t2d, t2d says which it is)
  absolute_identity = marked is None and Vd > 1 and np.array_equal(d2t, np.arange(Vd))
  if (target.min() >= 0 and target.max() < vocab_size and np.all(np.diff(target) > 0)
      and (marked is None or np.array_equal(marked, target)) and not absolute_identity):
    return target
  if absolute_identity:
    raise CheckpointError(f"{where}: d2t is arange({Vd}): the target ids themselves, not their "
                          f"offsets (target id = draft id + d2t[draft id]; a head over the "
                          f"first {Vd} ids has a d2t of zeros); as offsets it would draft "
                          f"target ids 0, 2, 4, ... (first bad: draft id 1 -> target id 2)")
  absolute = bool(np.all(np.diff(d2t) > 0)) and (marked is None or np.array_equal(marked, d2t))
  hint = ("; d2t holds the target ids themselves, not their offsets (target id = draft id + "
          "d2t[draft id])" if absolute else "")
  what = f"{Vd} ascending ids of [0, {vocab_size})" + (" matching t2d" if marked is not None
                                                       else "")
  bad = ((target < 0) | (target >= vocab_size)
         | np.concatenate([[False], np.diff(target) <= 0]))
  if marked is not None:
    n = min(len(marked), Vd)
    bad[:n] |= target[:n] != marked[:n]
    if len(marked) < Vd:  # t2d marks fewer ids than the head drafts
      bad[n:] = True
  first = int(np.argmax(bad)) if bad.any() else Vd - 1
  raise CheckpointError(f"{where}: d2t maps its {Vd} draft ids to target ids "
                        f"{target[:4].tolist()}..., not {what}{hint} (first bad: draft id "
                        f"{first} -> target id {int(target[first])})")


def _read_tensors(directory: Path, config: EagleConfig, f, lm_head: bool) -> dict:
  """The head's tensors as numpy arrays from `f` (`_Safetensors` or `_State`), each checked
  against the config's shape first (from the header; the LM head's rows are read only with
  `lm_head`); d2t checked against the target vocabulary (absent: the whole vocabulary, only
  where the head's is the target's); a tensor of another layout refused by name."""
  c, Vd, D = config.layer, config.draft_vocab_size, config.hidden_size
  want = {LAYER["attn_norm"]: (D,), LAYER["hidden_norm"]: (D,),
          LAYER["wq"]: (c.q_dim, 2 * D), LAYER["wk"]: (c.kv_dim, 2 * D),
          LAYER["wv"]: (c.kv_dim, 2 * D), LAYER["wo"]: (D, c.q_dim), LAYER["mlp_norm"]: (D,),
          LAYER["w_gate"]: (c.intermediate_size, D), LAYER["w_up"]: (c.intermediate_size, D),
          LAYER["w_down"]: (D, c.intermediate_size), TOP["final_norm"]: (D,),
          TOP["lm_head"]: (Vd, D), "d2t": (Vd,)}
  if config.has_fc:
    want[TOP["fc"]] = (D, config.fused_width)
  names = f.keys()
  found = {}
  for name, shape in want.items():
    present = [a for a in _aliases(name) if a in names]
    if not present:
      if name == "d2t" and Vd == c.vocab_size:
        continue  # the whole vocabulary, in order
      raise CheckpointError(f"{directory}: tensor {name} is missing"
                            + (f" (nor {', '.join(_aliases(name)[1:])})" if len(
                                _aliases(name)) > 1 else ""))
    got = f.shape(present[0])
    if got != shape:
      raise CheckpointError(f"{directory}: tensor {present[0]} has shape {got}, expected {shape}")
    found[name] = present[0]
  embed = next((a for a in ("embed_tokens.weight", "model.embed_tokens.weight") if a in names),
               None)
  mask = None
  if config.parallel:  # P-EAGLE's feature of the parallel positions: [1, 1, F] or [F]
    mask = next((a for a in ("mask_hidden", "model.mask_hidden") if a in names), None)
    if mask is None:
      raise CheckpointError(f"{directory}: tensor mask_hidden is missing (a P-EAGLE head's "
                            f"feature of its parallel positions)")
    if int(np.prod(f.shape(mask))) != config.fused_width:
      raise CheckpointError(f"{directory}: tensor {mask} has shape {f.shape(mask)}, expected "
                            f"{config.fused_width} values")
  unknown = sorted(names - set(found.values()) - set(_IGNORED) - {embed, mask})
  if unknown:
    raise CheckpointError(f"{directory}: tensor(s) {unknown[:8]} are not part of the EAGLE-3 "
                          f"head this reader implements (another head's options, e.g. "
                          f"SpecForge's fc_norm or an fc bias); refused rather than ignored")
  out = {name: f.get(src) for name, src in found.items() if lm_head or name != TOP["lm_head"]}
  d2t = out["d2t"] if "d2t" in out else np.zeros(Vd, np.int64)  # its dtype checked below
  t2d = None
  if "t2d" in names and Vd < c.vocab_size:
    if f.shape("t2d") != (c.vocab_size,):
      raise CheckpointError(f"{directory}: tensor t2d has shape {f.shape('t2d')}, expected "
                            f"({c.vocab_size},)")
    t2d = f.get("t2d")
  ids = check_d2t(directory, d2t, t2d, c.vocab_size)
  if Vd < c.vocab_size:  # a head of its own over part of the vocabulary
    report_vocab_map(directory, ids, c.vocab_size)
  out["d2t"] = np.asarray(d2t, np.int64)
  if config.parallel:
    out["mask_hidden"] = np.asarray(f.get(mask), np.float32).reshape(-1)
  if embed is not None:
    out["embed_tokens"] = np.asarray(f.get(embed), np.float32)
  return out
