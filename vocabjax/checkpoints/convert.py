"""Named checkpoint tensors -> the params pytree, with every tensor checked.

Both loaders (safetensors, GGUF) hand over a `lookup(name) -> np.ndarray` in PyTorch layout
([out, in] for linear weights) and a naming scheme; this module owns the mapping to vocabjax's
layout ([in, out], layers stacked on axis 0), the shape checks and the dtype cast.
"""

from __future__ import annotations

from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import param_shapes


class CheckpointError(ValueError):
  """A checkpoint tensor is missing, has the wrong shape, or is not recognized."""


# leaf -> (HF name, GGUF name, transpose). "{i}" is the layer index.
LAYER_NAMES = {
    "attn_norm": ("model.layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight", False),
    "wq": ("model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight", True),
    "wk": ("model.layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight", True),
    "wv": ("model.layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight", True),
    "wo": ("model.layers.{i}.self_attn.o_proj.weight", "blk.{i}.attn_output.weight", True),
    "bq": ("model.layers.{i}.self_attn.q_proj.bias", "blk.{i}.attn_q.bias", False),
    "bk": ("model.layers.{i}.self_attn.k_proj.bias", "blk.{i}.attn_k.bias", False),
    "bv": ("model.layers.{i}.self_attn.v_proj.bias", "blk.{i}.attn_v.bias", False),
    "q_norm": ("model.layers.{i}.self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight", False),
    "k_norm": ("model.layers.{i}.self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight", False),
    "mlp_norm": ("model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight",
                 False),
    "w_gate": ("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight", True),
    "w_up": ("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight", True),
    "w_down": ("model.layers.{i}.mlp.down_proj.weight", "blk.{i}.ffn_down.weight", True),
}
TOP_NAMES = {
    "embed": ("model.embed_tokens.weight", "token_embd.weight"),
    "final_norm": ("model.norm.weight", "output_norm.weight"),
    "lm_head": ("lm_head.weight", "output.weight"),
}
SCHEMES = {"hf": 0, "gguf": 1}
# Tensors that carry nothing the forward needs (recomputed or redundant).
IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq", "rope_freqs.weight")


def np_dtype(dtype) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if jnp.dtype(dtype) == jnp.bfloat16 else np.dtype(dtype)


def expected_names(config: LlamaLikeConfig, scheme: str) -> list[str]:
  col = SCHEMES[scheme]
  shapes = param_shapes(config)
  names = [TOP_NAMES[k][col] for k in TOP_NAMES if k in shapes]
  for leaf in shapes["layers"]:
    names += [LAYER_NAMES[leaf][col].format(i=i) for i in range(config.num_layers)]
  return names


def assemble_params(config: LlamaLikeConfig, lookup: Callable[[str], np.ndarray],
                    available: Iterable[str], *, scheme: str, dtype=jnp.float32,
                    source: str = "checkpoint") -> dict:
  """Build the params pytree; raise CheckpointError naming every missing or misshapen tensor."""
  col = SCHEMES[scheme]
  available = set(available)
  shapes = param_shapes(config)
  expected = set(expected_names(config, scheme))
  missing = sorted(expected - available)
  if missing:
    raise CheckpointError(f"{source}: {len(missing)} tensor(s) missing for {config.arch}: "
                          f"{missing[:8]}{' ...' if len(missing) > 8 else ''}")
  extra = sorted(n for n in available - expected if not n.endswith(IGNORABLE_SUFFIXES)
                 and not (config.tie_word_embeddings and n == TOP_NAMES["lm_head"][col]))
  if extra:
    raise CheckpointError(f"{source}: {len(extra)} unrecognized tensor(s) (the config does not "
                          f"describe them): {extra[:8]}{' ...' if len(extra) > 8 else ''}")
  out_dtype = np_dtype(dtype)

  def fetch(name: str, want: tuple, transpose: bool) -> np.ndarray:
    arr = np.asarray(lookup(name))
    if transpose:
      arr = arr.T
    if tuple(arr.shape) != want:
      raise CheckpointError(f"{source}: tensor {name} has shape {tuple(arr.shape)} "
                            f"(after transpose={transpose}), expected {want}")
    return arr.astype(out_dtype, copy=False)

  params: dict = {}
  for key in TOP_NAMES:
    if key in shapes:
      params[key] = jax.device_put(fetch(TOP_NAMES[key][col], shapes[key], False))
  layers = {}
  for leaf, shape in shapes["layers"].items():
    template, transpose = LAYER_NAMES[leaf][col], LAYER_NAMES[leaf][2]
    stacked = np.empty(shape, out_dtype)
    for i in range(config.num_layers):
      stacked[i] = fetch(template.format(i=i), shape[1:], transpose)
    layers[leaf] = jax.device_put(stacked)
    del stacked
  params["layers"] = layers
  return params
