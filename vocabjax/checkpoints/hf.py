"""Hugging Face checkpoint directories: config.json + model.safetensors (or a sharded index)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, LAYER_NAMES, TOP_NAMES, assemble_params
from vocabjax.checkpoints.hf_config import InvalidConfigError, config_from_hf
from vocabjax.checkpoints.hub import allow_bin_default, bin_refusal
from vocabjax.errors import clip
from vocabjax.io import atomic_directory
from vocabjax.models.config import LlamaLikeConfig


def _index_files(index: Path, directory: Path) -> list[Path]:
  """The shards a sharded index names, each a file inside `directory` (an index naming a file
  elsewhere, `../x` or an absolute path, is refused)."""
  try:
    weight_map = json.loads(index.read_text())["weight_map"]
    names = sorted(set(weight_map.values()))
  except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
    raise CheckpointError(f"{index}: malformed sharded index ({e})") from e
  # named lexically (a hub cache's files are links into its blob store: not resolved here)
  outside = [n for n in names if not isinstance(n, str) or os.path.isabs(n)
             or os.path.normpath(n).split(os.sep)[0] == ".."]
  if outside:
    raise CheckpointError(f"{index} names shard(s) outside {directory}: {outside[:5]}")
  files = [directory / n for n in names]
  missing = [str(f) for f in files if not f.exists()]
  if missing:
    raise CheckpointError(f"{index} names shard(s) that do not exist: {missing}")
  return files


def _safetensors_files(directory: Path) -> list[Path]:
  index = directory / "model.safetensors.index.json"
  if index.exists():
    return _index_files(index, directory)
  single = directory / "model.safetensors"
  if single.exists():
    return [single]
  raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def _pickled_files(directory: Path) -> list[Path]:
  index = directory / "pytorch_model.bin.index.json"
  if index.exists():
    return _index_files(index, directory)
  single = directory / "pytorch_model.bin"
  return [single] if single.exists() else []


def torch_state(path: Path) -> dict[str, np.ndarray]:
  """A pickled PyTorch state dict (`.bin` / `.pt`) read with `torch.load(weights_only=True)`
  (no code runs: only tensors and plain containers are accepted), as float32/int numpy
  arrays. Only for files the user allowed (`hub.allow_bin_default`)."""
  import torch  # local: torch is optional (the gguf extra), and only pickles need it

  try:
    try:
      state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
      if "_use_new_zipfile_serialization" not in str(e):
        raise
      # torch.save's legacy (pre-1.6, non-zip) format: readable, only not memory-mapped
      state = torch.load(str(path), map_location="cpu", weights_only=True)
  except Exception as e:  # pickle errors, a truncated zip, a refused global
    raise CheckpointError(f"{path}: not a loadable PyTorch weights file "
                          f"({type(e).__name__}: {clip(str(e))})") from None
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    raise CheckpointError(f"{path}: expected a state dict of tensors, got {type(state).__name__}")
  return {k: (v.float() if v.dtype in (torch.bfloat16, torch.float16) else v).numpy()
          for k, v in state.items()}


def read_hf_config(directory: str | os.PathLike) -> dict:
  path = Path(directory) / "config.json"
  if not path.exists():
    raise CheckpointError(f"{directory}: no config.json")
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path}: malformed JSON ({e})") from e


def load_hf(directory: str | os.PathLike, dtype=jnp.float32, *,
            allow_bin: bool | None = None, placement=None
            ) -> tuple[LlamaLikeConfig, dict, dict]:
  """Read an HF directory: (config, params, the raw config dict). Safetensors weights; a
  directory with only pickled weights (`pytorch_model.bin`, or its sharded index) is read
  with `torch.load(weights_only=True)` when allowed (`allow_bin`, `VOCABJAX_ALLOW_BIN=1`),
  refused naming the flag otherwise. `placement`: config -> the params' Shardings, each
  tensor placed as it is read (`convert.assemble_params`)."""
  from safetensors import SafetensorError, safe_open

  directory = Path(directory)
  raw = read_hf_config(directory)
  try:
    config = config_from_hf(raw)
  except InvalidConfigError as e:
    raise InvalidConfigError(f"{directory}/{e}") from None
  handles, where = [], {}
  has_safetensors = any((directory / f).exists() for f in ("model.safetensors",
                                                           "model.safetensors.index.json"))
  pickled = [] if has_safetensors else _pickled_files(directory)
  if pickled:
    if not allow_bin_default(allow_bin):
      raise CheckpointError(bin_refusal(str(directory), [f.name for f in pickled]))
    for f in pickled:
      state = torch_state(f)
      for name in state:
        where[name] = state
  else:
    try:
      for f in _safetensors_files(directory):
        h = safe_open(str(f), framework="numpy")
        handles.append(h)
        for name in h.keys():
          where[name] = h
    except (SafetensorError, OSError) as e:
      raise CheckpointError(f"{directory}: corrupt or truncated safetensors file: {e}") from e

  def lookup(name: str) -> np.ndarray:
    src = where[name]
    return src[name] if isinstance(src, dict) else src.get_tensor(name)

  params = assemble_params(config, lookup, where.keys(), scheme="hf", dtype=dtype,
                           source=str(directory),
                           shardings=placement(config) if placement else None)
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
