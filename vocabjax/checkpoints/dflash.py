"""DFlash drafter checkpoints in z-lab's layout (`z-lab/*-DFlash*`, what `dflash` 0.1.0's
`DFlashDraftModel.save_pretrained` writes): a directory with `config.json` (a Qwen3 config with
`num_target_layers` and the drafter's own fields, either in a `dflash_config` entry or at the
top level: `target_layer_ids`, `mask_token_id`, `block_size`, `input_embedding_scale`,
`output_multiplier`, `final_logit_softcapping`, `is_causal`) and `model.safetensors`:

  fc.weight                                    [D, Lf*Dt]
  hidden_norm.weight, norm.weight              [D]
  layers.{i}.input_layernorm.weight            [D]
  layers.{i}.self_attn.{q,k,v,o}_proj.weight   (biases where attention_bias)
  layers.{i}.self_attn.{q,k}_norm.weight       [head_dim]
  layers.{i}.post_attention_layernorm.weight   [D]
  layers.{i}.mlp.{gate,up,down}_proj.weight

DFlash 2 (`DFlash2DraftModel` in `architectures`; config fields `conv_kernel_size`,
`conv_group_size`, `selector_rank`, `selector_top_k`) adds, per layer and for each of
`attention_conv` and `mlp_conv`:

  layers.{i}.{attention,mlp}_conv.base_kernel              [2, K, D]
  layers.{i}.{attention,mlp}_conv.kernel_projection.weight [2 * K * D / group, D]

and its candidate selector (the codebooks with or without a `.weight` suffix: z-lab's published
files have none, `save_pretrained` of its module writes one):

  candidate_selector.{predecessor,successor}_codebook  [V, R]
  candidate_selector.hidden_projection.weight          [R, D]

The drafter has no embedding and no LM head of its own: it drafts with the target's. A tensor
this reader does not know is refused by name rather than ignored.

vLLM's `speculators` layout (`speculators_model_type` "dflash" or "dflash2", what its
`DFlashConverter` and `save_pretrained` write) holds the same tensors and a config of its own:
`transformer_layer_config` (the Qwen3 layers), `aux_hidden_state_layer_ids` (numbered as
`output_hidden_states` indexes them: id j is the output of layer j - 1, one higher than z-lab's
`target_layer_ids`, which this reader and vocabjax use), `block_size`, `mask_token_id`,
`target_hidden_size` (null: the drafter's width), `sliding_window_non_causal`,
`sample_from_anchor` (refused: the anchor drafting too is not DFlash's block), DFlash 2's fields
at the top level, and `draft_vocab_size`: below the target's V the drafter has an LM head of
its own (`lm_head.weight` [Vd, D]) over the target ids `d2t` names (offsets: target id = draft
id + d2t[draft id], checked against `t2d` [V] where the file has one). The verifier's own
tensors a `speculators` file may carry (`embed_tokens`, `verifier_lm_head`, `verifier_norm`,
and `lm_head` over the whole vocabulary) are the target's: not read.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, check_finite, config_int
from vocabjax.checkpoints.eagle3 import (
  check_d2t,
  is_speculators,
  read_head_file,
  refuse_flattened_ids,
  report_vocab_map,
  speculators_layer_config,
  speculators_layer_ids,
)
from vocabjax.checkpoints.hf_config import (
  UnsupportedConfigError,
  config_from_hf,
  hf_rope_fields,
)
from vocabjax.io import atomic_directory
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.dflash import DFlashConfig, default_target_layers

# config.json fields that belong to the drafter, not to its Qwen3 layers
DRAFT_FIELDS = ("target_layer_ids", "mask_token_id", "block_size", "input_embedding_scale",
                "output_multiplier", "final_logit_softcapping", "is_causal")
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_BOOKKEEPING = ("architectures", "auto_map", "dflash_config", "num_target_layers", "dtype",
                "torch_dtype", "transformers_version", "use_cache", "initializer_range",
                "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id",
                "use_sliding_window", "max_window_layers", "tie_word_embeddings", "_name_or_path",
                "model_type", "layer_types", "vocabjax")

LAYER = {"attn_norm": "input_layernorm.weight", "wq": "self_attn.q_proj.weight",
         "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
         "wo": "self_attn.o_proj.weight", "q_norm": "self_attn.q_norm.weight",
         "k_norm": "self_attn.k_norm.weight", "mlp_norm": "post_attention_layernorm.weight",
         "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
         "w_down": "mlp.down_proj.weight"}
BIASES = {"bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
          "bv": "self_attn.v_proj.bias", "bo": "self_attn.o_proj.bias"}
TOP = {"fc": "fc.weight", "hidden_norm": "hidden_norm.weight", "final_norm": "norm.weight"}
CONV = {"attn_conv": "attention_conv", "mlp_conv": "mlp_conv"}
SELECTOR = {"pred": "candidate_selector.predecessor_codebook",
            "succ": "candidate_selector.successor_codebook",
            "proj": "candidate_selector.hidden_projection.weight"}


def save_dflash(params: dict, config: DFlashConfig, directory, *, num_target_layers: int,
                extra: dict | None = None, verifier: str | None = None) -> Path:
  """Write a DFlash or DFlash 2 drafter in z-lab's layout (module doc), atomically: what
  `load_dflash` and `dflash`'s `DFlashDraftModel` / `DFlash2DraftModel.from_pretrained`
  read; one with a head of its own (`draft_vocab_size`) in `speculators`' layout
  (`save_dflash_speculators`), which z-lab's has no place for. `extra`: kept in config.json
  under "vocabjax" (a trainer's record of the export); `verifier`: the target's hub id or path,
  which speculators' layout names."""
  if config.draft_vocab_size is not None:
    return save_dflash_speculators(params, config, directory, verifier=verifier, extra=extra)
  c = config.layer
  arrays = _arrays(params, config)
  raw = {"architectures": ["DFlash2DraftModel" if config.dflash2 else "DFlashDraftModel"],
         "model_type": "qwen3",
         "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
         "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
         "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
         "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
         "attention_bias": c.attention_bias,
         "max_position_embeddings": c.max_position_embeddings, **hf_rope_fields(c),
         "num_target_layers": num_target_layers,
         "dflash_config": {"target_layer_ids": list(config.target_layer_ids),
                           "mask_token_id": config.mask_token_id,
                           "block_size": config.block_size}}
  if config.input_embedding_scale != 1.0:
    raw["dflash_config"]["input_embedding_scale"] = config.input_embedding_scale
  if config.output_multiplier != 1.0:
    raw["dflash_config"]["output_multiplier"] = config.output_multiplier
  if config.final_logit_softcapping is not None:
    raw["dflash_config"]["final_logit_softcapping"] = config.final_logit_softcapping
  if config.causal is not None:
    raw["dflash_config"]["is_causal"] = config.causal
  if config.dflash2:
    raw["dflash_config"].update({k: getattr(config, k) for k in DFLASH2_FIELDS})
  if c.layer_types is not None:
    raw.update(layer_types=list(c.layer_types), sliding_window=c.sliding_window)
  return _write(directory, arrays, raw, extra)


def _arrays(params: dict, config: DFlashConfig) -> dict:
  """The drafter's tensors by their names in both layouts (module doc), f32."""
  tensors = {TOP[k]: params[k] for k in TOP}
  for i, layer in enumerate(params["layers"]):
    names = dict(LAYER, **(BIASES if config.layer.attention_bias else {}))
    tensors.update({f"layers.{i}.{v}": layer[k] for k, v in names.items()})
    if config.dflash2:
      for ours, theirs in CONV.items():
        tensors[f"layers.{i}.{theirs}.base_kernel"] = layer[f"{ours}_base"]
        tensors[f"layers.{i}.{theirs}.kernel_projection.weight"] = layer[f"{ours}_proj"]
  if config.dflash2:
    tensors.update({v: params["selector"][k] for k, v in SELECTOR.items()})
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in tensors.items()}


def _write(directory, arrays: dict, raw: dict, extra: dict | None) -> Path:
  from safetensors.numpy import save_file

  if extra is not None:
    raw["vocabjax"] = extra
  directory = Path(directory)
  with atomic_directory(directory) as tmp:
    save_file(arrays, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(raw, indent=1))
  return directory


def save_dflash_speculators(params: dict, config: DFlashConfig, directory, *,
                            verifier: str | None = None, extra: dict | None = None) -> Path:
  """Write a DFlash drafter in `speculators`' layout (module doc), atomically: its tensors,
  and for a head of its own `lm_head.weight` [Vd, D], `d2t` [Vd] (int64 offsets) and `t2d` [V]
  (bool); config.json as speculators 0.9.0's `save_pretrained` writes it (layer ids one
  higher, `transformer_layer_config`, `speculators_config` naming `verifier`, the target's
  hub id or path, where given). What `load_dflash` and speculators' `DFlashDraftModel` read."""
  if config.dflash2:
    raise ValueError("save_dflash_speculators writes DFlash drafters; a DFlash 2 drafter is "
                     "written in z-lab's layout (save_dflash)")
  for name, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                        ("final_logit_softcapping", None)):
    if getattr(config, name) != default:
      raise ValueError(f"{name}={getattr(config, name)}: speculators' DFlash config has no "
                       f"such field; write it with save_dflash")
  c, V = config.layer, config.layer.vocab_size
  if c.layer_types is not None and "sliding_attention" in c.layer_types:
    raise ValueError(f"layer_types={list(c.layer_types)}: speculators' sliding layers differ "
                     f"from z-lab's (the reader refuses them); write it with save_dflash")
  arrays = _arrays(params, config)
  Vd = config.draft_vocab_size or V
  if config.draft_vocab_size is not None:
    d2t = np.asarray(params["d2t"], np.int64)
    ids = check_d2t("save_dflash_speculators", d2t, None, V)
    t2d = np.zeros(V, bool)
    t2d[ids] = True
    arrays.update({"lm_head.weight": np.ascontiguousarray(np.asarray(params["lm_head"],
                                                                     np.float32)),
                   "d2t": d2t, "t2d": t2d})
  layer = {"model_type": "qwen3", "vocab_size": V, "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
           "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
           "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
           "attention_bias": c.attention_bias, "tie_word_embeddings": False,
           "max_position_embeddings": c.max_position_embeddings, **hf_rope_fields(c)}
  if c.layer_types is not None:
    layer["layer_types"] = list(c.layer_types)
  method = {"proposal_type": "greedy", "speculative_tokens": config.gamma,
            "verifier_accept_k": 1, "accept_tolerance": 0.0}
  raw = {"architectures": ["DFlashDraftModel"],
         "auto_map": {"": "config.DFlashSpeculatorConfig"},
         "speculators_model_type": "dflash", "speculators_version": "0.9.0",
         "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                                "proposal_methods": [method],
                                "verifier": {"architectures": [], "name_or_path": verifier}},
         "aux_hidden_state_layer_ids": [i + 1 for i in config.target_layer_ids],
         "block_size": config.block_size, "draft_vocab_size": Vd,
         "mask_token_id": config.mask_token_id, "sample_from_anchor": False,
         "sliding_window_non_causal": config.causal is False,
         "target_hidden_size": config.target_hidden_size, "tie_word_embeddings": False,
         "transformer_layer_config": layer, "dtype": "float32"}
  return _write(directory, arrays, raw, extra)


def draft_value(raw: dict, name: str, default=None):
  """A drafter field as the reference reads it: `dflash_config` first, then the top level."""
  own = raw.get("dflash_config") or {}
  return own.get(name, raw.get(name, default))


def dflash_config_from_raw(raw: dict, where: str = "config.json") -> DFlashConfig:
  """The DFlashConfig of a config.json dict (z-lab's or `speculators`' layout, module doc);
  CheckpointError naming the field and value."""
  if is_speculators(raw):
    return _from_speculators(raw, where)
  refuse_flattened_ids(raw, where, "aux_hidden_state_layer_ids", "target_layer_ids")
  archs = raw.get("architectures") or []
  dflash2 = {}
  if any("DFlash2" in str(a) for a in archs) or any(draft_value(raw, k) is not None
                                                    for k in DFLASH2_FIELDS):
    for k in DFLASH2_FIELDS:
      v = draft_value(raw, k)
      if not isinstance(v, int) or isinstance(v, bool):
        raise CheckpointError(f"{where}: a DFlash 2 drafter (architectures={archs}) with "
                              f"{k}={v!r}: DFlash 2 needs {', '.join(DFLASH2_FIELDS)} as "
                              f"integers")
      dflash2[k] = v
  layer_raw = {k: v for k, v in raw.items()
               if k not in _BOOKKEEPING and k not in DRAFT_FIELDS and k not in DFLASH2_FIELDS}
  layer_raw["model_type"] = "qwen3"
  try:
    layer = config_from_hf(layer_raw)
  except (UnsupportedConfigError, ValueError) as e:
    raise CheckpointError(f"{where}: {e}") from None
  if raw.get("layer_types"):
    layer = _with_layer_types(layer, raw, where)
  ids = draft_value(raw, "target_layer_ids")
  if ids is None:
    n = raw.get("num_target_layers")
    if not isinstance(n, int) or n < 1:
      raise CheckpointError(f"{where}: names no target_layer_ids and num_target_layers={n!r}: "
                            f"the target layers the drafter reads cannot be known")
    ids = default_target_layers(n, layer.num_layers)
  if (not isinstance(ids, (list, tuple)) or not ids
      or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
    raise CheckpointError(f"{where}: target_layer_ids={ids!r} must be a list of layer indices")
  mask = draft_value(raw, "mask_token_id")
  if not isinstance(mask, int) or isinstance(mask, bool):
    raise CheckpointError(f"{where}: mask_token_id={mask!r}: a DFlash drafter needs the id of "
                          f"the token its undrafted block positions embed")
  cap = draft_value(raw, "final_logit_softcapping")
  causal = draft_value(raw, "is_causal")
  try:
    return DFlashConfig(
        layer=layer, target_hidden_size=int(raw.get("target_hidden_size") or layer.hidden_size),
        target_layer_ids=tuple(ids), block_size=int(draft_value(raw, "block_size", 16)),
        mask_token_id=mask,
        input_embedding_scale=float(draft_value(raw, "input_embedding_scale", 1.0)),
        output_multiplier=float(draft_value(raw, "output_multiplier", 1.0)),
        final_logit_softcapping=None if cap is None else float(cap),
        causal=None if causal is None else bool(causal), **dflash2)
  except ValueError as e:
    raise CheckpointError(f"{where}: {e}") from None


def _from_speculators(raw: dict, where: str) -> DFlashConfig:
  kind = raw.get("speculators_model_type")
  if kind not in ("dflash", "dflash2"):
    raise CheckpointError(f"{where}: speculators_model_type={kind!r}: this reader reads "
                          f"speculators' DFlash drafters ('dflash', 'dflash2')")
  full = speculators_layer_config(raw, where, "qwen3")
  if raw.get("sample_from_anchor"):
    raise CheckpointError(f"{where}: sample_from_anchor=true: the drafter drafts at the anchor "
                          f"too (block_size drafts per pass); vocabjax implements DFlash's "
                          f"block, whose anchor is the last committed token")
  layer_raw = {k: v for k, v in full.items() if k not in _BOOKKEEPING}
  layer_raw["model_type"] = "qwen3"
  try:
    layer = config_from_hf(layer_raw)
  except (UnsupportedConfigError, ValueError) as e:
    raise CheckpointError(f"{where}: transformer_layer_config: {e}") from None
  if full.get("layer_types") and "sliding_attention" in full["layer_types"]:
    raise CheckpointError(f"{where}: layer_types={full['layer_types']}: speculators' sliding "
                          f"layers mask the context from the block's anchor, not per query "
                          f"as z-lab's; not implemented")
  if full.get("layer_types"):
    layer = _with_layer_types(layer, full, where)
  ids = speculators_layer_ids(raw, "aux_hidden_state_layer_ids", where)
  V = layer.vocab_size
  dv = config_int(raw, "draft_vocab_size", where, minimum=1)
  if dv > V:
    raise CheckpointError(f"{where}: draft_vocab_size={dv} exceeds the vocabulary of "
                          f"V={V} tokens")
  mask = raw.get("mask_token_id")
  if not isinstance(mask, int) or isinstance(mask, bool):
    raise CheckpointError(f"{where}: mask_token_id={mask!r}: a DFlash drafter needs the id of "
                          f"the token its undrafted block positions embed")
  extra = {}
  if kind == "dflash2":
    extra = {k: config_int(raw, k, where, minimum=1) for k in DFLASH2_FIELDS}
  non_causal = raw.get("sliding_window_non_causal", kind == "dflash2")
  try:
    return DFlashConfig(
        layer=layer, target_hidden_size=int(raw.get("target_hidden_size") or layer.hidden_size),
        target_layer_ids=ids,
        block_size=config_int(raw, "block_size", where, minimum=2), mask_token_id=mask,
        causal=False if non_causal else None, draft_vocab_size=dv if dv < V else None, **extra)
  except ValueError as e:
    raise CheckpointError(f"{where}: {e}") from None


def _with_layer_types(layer: LlamaLikeConfig, raw: dict, where: str) -> LlamaLikeConfig:
  types = tuple(raw["layer_types"])
  if len(types) != layer.num_layers or set(types) - {"full_attention", "sliding_attention"}:
    raise CheckpointError(f"{where}: layer_types={list(types)} must name full_attention or "
                          f"sliding_attention for each of its {layer.num_layers} layers")
  window = raw.get("sliding_window")
  if "sliding_attention" in types and not (isinstance(window, int) and window > 0):
    raise CheckpointError(f"{where}: sliding layers need a positive sliding_window, got "
                          f"{window!r}")
  return layer.replace(layer_types=types, sliding_window=window if "sliding_attention" in types
                       else None)


def load_dflash_config(directory) -> DFlashConfig:
  directory = Path(directory)
  try:
    raw = json.loads((directory / "config.json").read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{directory} is not a readable DFlash drafter ({e})") from None
  return dflash_config_from_raw(raw, f"{directory}/config.json")


def load_dflash(directory, *, target_config: LlamaLikeConfig | None = None,
                dtype=jnp.float32, allow_bin: bool | None = None) -> tuple[DFlashConfig, dict]:
  """(config, params) of a DFlash drafter directory; with `target_config`, a drafter made for
  another target (hidden size, vocabulary, layer ids out of range) is a ValueError naming the
  mismatch. `allow_bin`: read a pickled `pytorch_model.bin` where there is no safetensors file
  (None: `VOCABJAX_ALLOW_BIN`)."""
  directory = Path(directory)
  config = load_dflash_config(directory)
  if target_config is not None:
    config.check_target(target_config)
  params = read_head_file(directory, lambda f: _read(directory, config, f), "DFlash drafter",
                          allow_bin)
  params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
  if "d2t" in params:  # ids stay integers
    params["d2t"] = jnp.asarray(np.asarray(params["d2t"]), jnp.int32)
  check_finite(params, str(directory))
  return config, params


def _own_head(directory: Path, config: DFlashConfig, get, names, prefix: str) -> dict:
  """A speculators drafter's own head [Vd, D] and d2t [Vd] (offsets), checked against the
  vocabulary and against t2d [V] where the file has one: a d2t of absolute target ids is
  named as such."""
  Vd, V, D = config.draft_vocab_size, config.layer.vocab_size, config.layer.hidden_size
  rows = get("lm_head.weight", (Vd, D))
  d2t = get("d2t", (Vd,))
  t2d = get("t2d", (V,)) if prefix + "t2d" in names else None
  report_vocab_map(directory, check_d2t(directory, d2t, t2d, V), V)  # (float d2t refused)
  return {"lm_head": rows, "d2t": np.asarray(d2t, np.int64)}


def _read(directory: Path, config: DFlashConfig, f) -> dict:
  c, D = config.layer, config.layer.hidden_size
  names = f.keys()
  prefix = "model." if not any(n.startswith("layers.") for n in names) and any(
      n.startswith("model.layers.") for n in names) else ""
  shapes = {"attn_norm": (D,), "wq": (c.q_dim, D), "wk": (c.kv_dim, D), "wv": (c.kv_dim, D),
            "wo": (D, c.q_dim), "q_norm": (c.head_dim,), "k_norm": (c.head_dim,),
            "mlp_norm": (D,), "w_gate": (c.intermediate_size, D),
            "w_up": (c.intermediate_size, D), "w_down": (D, c.intermediate_size),
            "bq": (c.q_dim,), "bk": (c.kv_dim,), "bv": (c.kv_dim,), "bo": (D,)}
  top = {"fc": (D, config.fused_width), "hidden_norm": (D,), "final_norm": (D,)}
  used = set()

  def get(name, shape):
    full = prefix + name
    if full not in names:
      raise CheckpointError(f"{directory}: tensor {full} is missing")
    got = f.shape(full)
    if got != shape:
      raise CheckpointError(f"{directory}: tensor {full} has shape {got}, expected {shape}")
    used.add(full)
    return np.asarray(f.get(full))

  layers = []
  for i in range(c.num_layers):
    own = dict(LAYER, **(BIASES if c.attention_bias else {}))
    layers.append({k: get(f"layers.{i}.{v}", shapes[k]) for k, v in own.items()})
  out = {"layers": layers, **{k: get(TOP[k], s) for k, s in top.items()}}
  if config.dflash2:
    K, G, R = config.conv_kernel_size, config.conv_groups, config.selector_rank
    for i, layer in enumerate(layers):
      for ours, theirs in CONV.items():
        layer[f"{ours}_base"] = get(f"layers.{i}.{theirs}.base_kernel", (2, K, D))
        layer[f"{ours}_proj"] = get(f"layers.{i}.{theirs}.kernel_projection.weight",
                                    (2 * K * G, D))
    shapes = {"pred": (c.vocab_size, R), "succ": (c.vocab_size, R), "proj": (R, D)}
    out["selector"] = {k: get(v + ".weight" if k != "proj" and prefix + v + ".weight" in names
                              else v, shapes[k]) for k, v in SELECTOR.items()}
  if config.draft_vocab_size is not None:
    out.update(_own_head(directory, config, get, names, prefix))
  # the verifier's own tensors a speculators file may carry: the target's, not read
  verifier = {prefix + n for n in ("embed_tokens.weight", "verifier_lm_head.weight",
                                   "verifier_norm.weight")}
  if config.draft_vocab_size is None:
    verifier |= {prefix + n for n in ("lm_head.weight", "d2t", "t2d")}
  ignored = {n for n in names if n.endswith("rotary_emb.inv_freq")} | (verifier & set(names))
  unknown = sorted(names - used - ignored)
  if unknown:
    kind = "DFlash 2" if config.dflash2 else "DFlash"
    raise CheckpointError(f"{directory}: tensor(s) {unknown[:8]} are not part of the {kind} "
                          f"drafter its config.json describes (a DFlash 2 drafter's with a "
                          f"DFlash config, an embedding or LM head of its own, another "
                          f"architecture's modules); refused rather than ignored")
  return out

