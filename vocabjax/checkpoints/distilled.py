"""The distilled drafter format (`python -m vocabjax.train.distill`'s `out/drafter/`):

  distill.json          mode ("lora" | "full"), lora_rank, lora_alpha, base (the base drafter's
                        `models.identity.drafter_identity`), and the training job's settings
  drafter.safetensors   the LoRA adapter (mode lora: merged into the base at load) or every
                        drafter weight (mode full), flattened with dotted names
  head.safetensors      (optional) the SpecDec++ acceptance head

`load_distilled` refuses a directory trained on another base drafter; a base of GGUF blocks (a
.gguf drafter's default) is widened to f32 first (the merged drafter runs in f32). Files are
written via a temporary name and renamed, so an interrupted export never leaves half a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from vocabjax.checkpoints.convert import CheckpointError, check_finite
from vocabjax.io import atomic_write_json
from vocabjax.kernels.blocks import dequantize, is_blocks
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.identity import identity_mismatch
from vocabjax.models.lora import init_lora, merge


class DistilledError(CheckpointError):
  """A distilled drafter that cannot be read or does not fit its base drafter."""


def flatten(tree, prefix: str = "") -> dict:
  """{dotted name: leaf} of a pytree of dicts and lists."""
  out = {}
  if isinstance(tree, dict):
    for k, v in tree.items():
      out.update(flatten(v, f"{prefix}{k}."))
  elif isinstance(tree, (list, tuple)):
    for i, v in enumerate(tree):
      out.update(flatten(v, f"{prefix}{i}."))
  else:
    out[prefix[:-1]] = tree
  return out


def unflatten_like(flat: dict, like, prefix: str = ""):
  """The pytree shaped like `like` from `flatten`'s names; a missing tensor or a wrong shape is
  a DistilledError naming it."""
  if isinstance(like, dict):
    return {k: unflatten_like(flat, v, f"{prefix}{k}.") for k, v in like.items()}
  if isinstance(like, (list, tuple)):
    return [unflatten_like(flat, v, f"{prefix}{i}.") for i, v in enumerate(like)]
  name = prefix[:-1]
  if name not in flat:
    raise DistilledError(f"the distilled drafter lacks tensor {name!r}")
  if tuple(flat[name].shape) != tuple(like.shape):
    raise DistilledError(f"tensor {name!r} has shape {tuple(flat[name].shape)}, the drafter "
                         f"needs {tuple(like.shape)}")
  return jnp.asarray(flat[name], like.dtype)


def _save(path: Path, tensors: dict) -> None:
  tmp = path.with_name(path.name + ".partial")
  save_file({k: np.asarray(v) for k, v in tensors.items()}, str(tmp))
  tmp.replace(path)


def save_distilled(directory, drafter, head: dict | None, meta: dict) -> None:
  """Write `drafter` (the LoRA adapter or the full params, per `meta["mode"]`), the optional
  acceptance `head` and `meta` (see the module doc) into `directory`."""
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  _save(directory / "drafter.safetensors", flatten(drafter))
  if head is not None:
    _save(directory / "head.safetensors", head)
  atomic_write_json(directory / "distill.json", meta)


def load_distilled(directory, base_params, base_config: LlamaLikeConfig):
  """(drafter params with the distillation applied, acceptance head or None). Refused when the
  directory was trained on another base drafter."""
  directory = Path(directory)
  try:
    meta = json.loads((directory / "distill.json").read_text())
    flat = load_file(str(directory / "drafter.safetensors"))
  except (OSError, json.JSONDecodeError, SafetensorError) as e:
    raise DistilledError(f"{directory} is not a readable distilled drafter ({e})") from None
  check_finite(flat, str(directory / "drafter.safetensors"))  # the adapters / weights as stored
  why = identity_mismatch(meta["base"], base_params, base_config,
                          f"{directory} was distilled", exact=True)
  if why:
    raise DistilledError(why)
  # a GGUF file's blocks (the default for a .gguf drafter): the distilled weights are the
  # blocks' values plus the adapters (or replace them), so the drafter runs in f32
  base_params = jax.tree.map(lambda w: dequantize(w) if is_blocks(w) else w, base_params,
                             is_leaf=is_blocks)
  if meta["mode"] == "lora":
    like = init_lora(jax.random.key(0), base_params, rank=meta["lora_rank"])
    params = merge(base_params, unflatten_like(flat, like), alpha=meta["lora_alpha"])
  else:
    params = unflatten_like(flat, base_params)
  head = None
  if (directory / "head.safetensors").exists():
    head = {k: jnp.asarray(v) for k, v in load_file(str(directory / "head.safetensors")).items()}
    check_finite(head, str(directory / "head.safetensors"))
  return params, head
