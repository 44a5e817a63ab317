"""Hugging Face checkpoint directories: config.json + model.safetensors (or a sharded index)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, LAYER_NAMES, TOP_NAMES, assemble_params
from vocabjax.checkpoints.hf_config import config_from_hf
from vocabjax.io import atomic_directory
from vocabjax.models.config import LlamaLikeConfig


def _safetensors_files(directory: Path) -> list[Path]:
  index = directory / "model.safetensors.index.json"
  if index.exists():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise CheckpointError(f"{index}: malformed sharded index ({e})") from e
    files = sorted({directory / f for f in weight_map.values()})
    missing = [str(f) for f in files if not f.exists()]
    if missing:
      raise CheckpointError(f"{index} names shard(s) that do not exist: {missing}")
    return files
  single = directory / "model.safetensors"
  if single.exists():
    return [single]
  raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def read_hf_config(directory: str | os.PathLike) -> dict:
  path = Path(directory) / "config.json"
  if not path.exists():
    raise CheckpointError(f"{directory}: no config.json")
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path}: malformed JSON ({e})") from e


def load_hf(directory: str | os.PathLike,
            dtype=jnp.float32) -> tuple[LlamaLikeConfig, dict, dict]:
  """Read an HF directory: (config, params, the raw config dict)."""
  from safetensors import SafetensorError, safe_open

  directory = Path(directory)
  raw = read_hf_config(directory)
  config = config_from_hf(raw)
  handles, where = [], {}
  try:
    for f in _safetensors_files(directory):
      h = safe_open(str(f), framework="numpy")
      handles.append(h)
      for name in h.keys():
        where[name] = h
  except (SafetensorError, OSError) as e:
    raise CheckpointError(f"{directory}: corrupt or truncated safetensors file: {e}") from e

  def lookup(name: str) -> np.ndarray:
    return where[name].get_tensor(name)

  params = assemble_params(config, lookup, where.keys(), scheme="hf", dtype=dtype,
                           source=str(directory))
  return config, params, raw


def save_hf(params: dict, config, directory, *, source) -> Path:
  """Write `params` (the loaded, "out_in" layout) as a Hugging Face directory: model.safetensors
  under the HF tensor names, plus config/tokenizer/generation files copied from `source` (the
  directory the model was loaded from). Written to a temporary directory, then renamed."""
  import shutil

  from safetensors.numpy import save_file

  directory, source = Path(directory), Path(source)
  if not source.is_dir():
    raise ValueError(f"save_hf copies config and tokenizer from a directory; {source} is not one")
  tensors = {TOP_NAMES[k][0]: params[k] for k in TOP_NAMES if k in params}
  for i, layer in enumerate(params["layers"]):
    for leaf, w in layer.items():
      if leaf not in LAYER_NAMES:
        raise ValueError(f"layer {i} leaf {leaf!r} has no HF name (convert the MLP layout back "
                         f"to 'out_in' first)")
      tensors[LAYER_NAMES[leaf][0].format(i=i)] = w
  with atomic_directory(directory) as tmp:
    save_file({k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in tensors.items()},
              str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for f in source.iterdir():
      if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".index.json", ".gguf")):
        shutil.copy2(f, tmp / f.name)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["torch_dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
  return directory
