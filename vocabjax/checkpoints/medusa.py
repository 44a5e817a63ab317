"""Medusa heads in the layout of Medusa's repository: a directory with `config.json`
(`medusa_num_heads`, `medusa_num_layers`, `base_model_name_or_path`) and the heads' state dict
(`medusa_lm_head.safetensors`, or Medusa's own `medusa_lm_head.pt`, read with
`torch.load(weights_only=True)` only when pickles are allowed: `hub.allow_bin_default`).

Tensors of head i (PyTorch [out, in] layout; Lm = medusa_num_layers):
  {i}.{j}.linear.weight   [D, D]   j = 0 .. Lm-1 (one shared module: the same tensor each j)
  {i}.{j}.linear.bias     [D]
  {i}.{Lm}.weight         [V, D]   the head's projection (absent with a shared LM head)
config.json also carries a `vocabjax` entry: the target's identity (its LM-head fingerprint)
and whether the heads share the target's LM head.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import (CheckpointError, check_finite, check_trained_for,
                                          config_int)
from vocabjax.checkpoints.hf import torch_state
from vocabjax.checkpoints.hub import allow_bin_default, bin_refusal
from vocabjax.io import atomic_directory
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.medusa import MedusaConfig

WEIGHTS = "medusa_lm_head.safetensors"
TORCH_WEIGHTS = "medusa_lm_head.pt"


def medusa_state_dict(params: dict, config: MedusaConfig) -> dict[str, np.ndarray]:
  """The heads as Medusa's `medusa_head.state_dict()` names them (float32 numpy)."""
  out = {}
  L = config.num_layers
  for i, head in enumerate(params["heads"]):
    for j in range(L):
      out[f"{i}.{j}.linear.weight"] = np.asarray(head["w"], np.float32)
      out[f"{i}.{j}.linear.bias"] = np.asarray(head["b"], np.float32)
    if not config.shared_lm_head:
      out[f"{i}.{L}.weight"] = np.asarray(head["lm_head"], np.float32)
  return out


def save_medusa(params: dict, config: MedusaConfig, directory, *, target: dict | None = None,
                extra: dict | None = None) -> Path:
  """Write the heads atomically. `target`: the identity of the target they were trained for
  (`source`, `fingerprint`); `extra`: more provenance (the training job and step)."""
  from safetensors.numpy import save_file

  directory = Path(directory)
  arrays = {k: np.ascontiguousarray(v) for k, v in medusa_state_dict(params, config).items()}
  raw = {"medusa_num_heads": config.num_heads, "medusa_num_layers": config.num_layers,
         "base_model_name_or_path": (target or {}).get("source", ""),
         "hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
         "vocabjax": {"target": target or {}, "shared_lm_head": config.shared_lm_head,
                      **(extra or {})}}
  with atomic_directory(directory) as tmp:
    save_file(arrays, str(tmp / WEIGHTS), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(raw, indent=1))
  return directory


def _read_tensors(directory: Path, allow_bin: bool | None = None) -> dict[str, np.ndarray]:
  if (directory / WEIGHTS).is_file():
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
      return load_file(str(directory / WEIGHTS))
    except (OSError, SafetensorError) as e:
      raise CheckpointError(f"{directory / WEIGHTS} is not a readable safetensors file "
                            f"({e})") from None
  if (directory / TORCH_WEIGHTS).is_file():  # Medusa's own heads; torch is optional
    if not allow_bin_default(allow_bin):
      raise CheckpointError(bin_refusal(str(directory), [TORCH_WEIGHTS]))
    return torch_state(directory / TORCH_WEIGHTS)
  raise CheckpointError(f"{directory} holds no Medusa heads ({WEIGHTS} or {TORCH_WEIGHTS})")


def load_medusa(directory, *, target_config: LlamaLikeConfig, target_params: dict | None = None,
                dtype=jnp.float32, allow_bin: bool | None = None
                ) -> tuple[MedusaConfig, dict, dict]:
  """(config, params, the `vocabjax.target` record) of a Medusa head directory for this
  target: heads of another hidden size or vocabulary, a missing or misshapen tensor, blocks
  that are not one shared module, or (with `target_params`) heads recorded for a target with
  another LM-head fingerprint are errors naming the value. `allow_bin`: read Medusa's own
  pickled `medusa_lm_head.pt` where there is no safetensors file (None: `VOCABJAX_ALLOW_BIN`)."""
  directory = Path(directory)
  try:
    raw = json.loads((directory / "config.json").read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{directory}/config.json is not a Medusa config ({e})") from None
  if not isinstance(raw, dict) or "medusa_num_heads" not in raw:
    raise CheckpointError(f"{directory}/config.json is not a Medusa config (no "
                          f"medusa_num_heads)")
  where = f"{directory}/config.json"
  Hm = config_int(raw, "medusa_num_heads", where, minimum=1)
  L = 1 if raw.get("medusa_num_layers") is None else config_int(raw, "medusa_num_layers",
                                                                where)
  record = raw.get("vocabjax", {})
  target = record.get("target", {})
  tensors = _read_tensors(directory, allow_bin)
  in_file = len({k.split(".", 1)[0] for k in tensors if k.split(".", 1)[0].isdigit()})
  if in_file > Hm:  # Medusa's own vicuna-7b heads: config.json says 2 of the file's 5 heads
    print(f"[vocabjax] {directory}: config.json says medusa_num_heads={Hm} but the file holds "
          f"{in_file} heads; reading all {in_file} (as Medusa's loader does)", file=sys.stderr)
    Hm = in_file
  D, V = target_config.hidden_size, target_config.vocab_size
  shared = bool(record.get("shared_lm_head", f"0.{L}.weight" not in tensors))
  config = MedusaConfig(num_heads=Hm, hidden_size=D, vocab_size=V, num_layers=L,
                        shared_lm_head=shared)
  if target_params is not None:
    check_trained_for(directory, target, target_params, target_config)

  used = set()

  def get(name, shape):
    if name not in tensors:
      raise CheckpointError(f"{directory}: missing tensor {name!r}")
    used.add(name)
    t = tensors[name]
    if tuple(t.shape) != shape:
      raise CheckpointError(f"{directory}: tensor {name!r} has shape {tuple(t.shape)}, the "
                            f"target (D={D}, V={V}) needs {shape}")
    return t

  heads = []
  for i in range(Hm):
    w = get(f"{i}.0.linear.weight", (D, D)) if L else np.zeros((D, D), np.float32)
    b = get(f"{i}.0.linear.bias", (D,)) if L else np.zeros((D,), np.float32)
    for j in range(1, L):
      if not (np.array_equal(get(f"{i}.{j}.linear.weight", (D, D)), w) and
              np.array_equal(get(f"{i}.{j}.linear.bias", (D,)), b)):
        raise CheckpointError(f"{directory}: head {i}'s block {j} differs from block 0; "
                              f"Medusa repeats one shared block per head")
    head = {"w": jnp.asarray(w, dtype), "b": jnp.asarray(b, dtype)}
    if not shared:
      head["lm_head"] = jnp.asarray(get(f"{i}.{L}.weight", (V, D)), dtype)
    heads.append(head)
  stray = sorted(set(tensors) - used)
  if stray:  # read whole or refused: a tensor this config does not place is not dropped
    raise CheckpointError(f"{directory}: tensor {stray[0]!r} has no place in {Hm} heads of "
                          f"medusa_num_layers={L} blocks" + (f" (and {len(stray) - 1} more)"
                                                             if len(stray) > 1 else ""))
  check_finite({"heads": heads}, str(directory))
  return config, {"heads": heads}, target
