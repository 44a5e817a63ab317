"""Hugging Face checkpoint directories: config.json + model.safetensors (or a sharded index)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, assemble_params
from vocabjax.checkpoints.hf_config import config_from_hf
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
