"""Named checkpoint tensors -> the params pytree, with every tensor checked.

Both loaders (safetensors, GGUF) hand over a `lookup(name) -> np.ndarray` in PyTorch layout
([out, in] for linear weights) and a naming scheme; this module owns the mapping to vocabjax's
layout (PyTorch's [out, in] for linear weights, a list of per-layer dicts), the shape checks
and the dtype cast.
"""

from __future__ import annotations

from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.identity import drafter_fingerprint
from vocabjax.models.llamalike import param_shapes
from vocabjax.kernels.blocks import BlockWeight


class CheckpointError(ValueError):
  """A checkpoint tensor is missing, has the wrong shape, or is not recognized."""


def config_int(raw: dict, name: str, where: str, *, minimum: int = 0) -> int:
  """`raw[name]` as a config field: an integer (not a bool, a string or a float) of at least
  `minimum`, else a CheckpointError naming `where`, the field and its value."""
  v = raw.get(name)
  if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
    raise CheckpointError(f"{where}: {name}={v!r} must be an integer of at least {minimum}")
  return v


def check_trained_for(directory, target: dict, target_params: dict,
                      target_config: LlamaLikeConfig) -> None:
  """Refuse heads recorded (`target`: their `vocabjax.target` entry) for a target with another
  LM-head fingerprint than `target_params`' (other weights of the same shapes)."""
  if not target.get("fingerprint"):
    return
  got = drafter_fingerprint(target_params, target_config)
  if got != target["fingerprint"]:
    raise CheckpointError(f"{directory} was trained for another target ({target.get('source')}"
                          f", LM-head fingerprint {target['fingerprint']}; this target's is "
                          f"{got})")


# leaf -> (HF name, GGUF name). "{i}" is the layer index.
LAYER_NAMES = {
    "attn_norm": ("model.layers.{i}.input_layernorm.weight", "blk.{i}.attn_norm.weight"),
    "wq": ("model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight"),
    "wk": ("model.layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight"),
    "wv": ("model.layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight"),
    "wo": ("model.layers.{i}.self_attn.o_proj.weight", "blk.{i}.attn_output.weight"),
    "bq": ("model.layers.{i}.self_attn.q_proj.bias", "blk.{i}.attn_q.bias"),
    "bk": ("model.layers.{i}.self_attn.k_proj.bias", "blk.{i}.attn_k.bias"),
    "bv": ("model.layers.{i}.self_attn.v_proj.bias", "blk.{i}.attn_v.bias"),
    "q_norm": ("model.layers.{i}.self_attn.q_norm.weight", "blk.{i}.attn_q_norm.weight"),
    "k_norm": ("model.layers.{i}.self_attn.k_norm.weight", "blk.{i}.attn_k_norm.weight"),
    "mlp_norm": ("model.layers.{i}.post_attention_layernorm.weight", "blk.{i}.ffn_norm.weight"),
    "w_gate": ("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight"),
    "w_up": ("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight"),
    "w_down": ("model.layers.{i}.mlp.down_proj.weight", "blk.{i}.ffn_down.weight"),
}
# Gemma 3's four norms per layer: `mlp_norm` is its pre-feedforward norm, and HF's
# post_attention_layernorm is the norm *after* attention (Llama's name for the MLP's input norm).
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "mlp_norm": ("model.layers.{i}.pre_feedforward_layernorm.weight", "blk.{i}.ffn_norm.weight"),
    "post_attn_norm": ("model.layers.{i}.post_attention_layernorm.weight",
                       "blk.{i}.post_attention_norm.weight"),
    "post_mlp_norm": ("model.layers.{i}.post_feedforward_layernorm.weight",
                      "blk.{i}.post_ffw_norm.weight"),
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


def layer_names(config: LlamaLikeConfig) -> dict:
  """leaf -> (HF name, GGUF name) of a decoder layer of `config`'s architecture."""
  return GEMMA3_LAYER_NAMES if config.sandwich_norms else LAYER_NAMES


def expected_names(config: LlamaLikeConfig, scheme: str) -> list[str]:
  col = SCHEMES[scheme]
  shapes = param_shapes(config)
  names = [TOP_NAMES[k][col] for k in TOP_NAMES if k in shapes]
  per_layer = layer_names(config)
  for i, layer in enumerate(shapes["layers"]):
    names += [per_layer[leaf][col].format(i=i) for leaf in layer]
  return names


def assemble_params(config: LlamaLikeConfig, lookup: Callable[[str], np.ndarray],
                    available: Iterable[str], *, scheme: str, dtype=jnp.float32,
                    source: str = "checkpoint", shardings: dict | None = None) -> dict:
  """Build the params pytree; raise CheckpointError naming every missing or misshapen tensor.

  `shardings` (the params' tree of Shardings, `sharding.param_shardings`): each tensor is read,
  cast and placed with its sharding before the next is read, so the host holds about one
  tensor at a time, not the model (default: each on the default device)."""
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

  def fetch(name: str, want: tuple, where=None) -> jax.Array:
    arr = lookup(name)
    if isinstance(arr, BlockWeight):  # GGUF blocks, kept as stored (one device)
      if tuple(arr.shape) != want:
        raise CheckpointError(f"{source}: tensor {name} has shape {tuple(arr.shape)}, "
                              f"expected {want}")
      return arr
    arr = np.asarray(arr)
    if tuple(arr.shape) != want:
      raise CheckpointError(f"{source}: tensor {name} has shape {tuple(arr.shape)}, "
                            f"expected {want}")
    out = jax.device_put(arr.astype(out_dtype, copy=False), where)
    if where is not None:
      out.block_until_ready()  # placed before the next tensor is read: its host copy goes
    return out

  sh = shardings or {}
  params: dict = {key: fetch(TOP_NAMES[key][col], shapes[key], sh.get(key))
                  for key in TOP_NAMES if key in shapes}
  per_layer = layer_names(config)
  params["layers"] = [{leaf: fetch(per_layer[leaf][col].format(i=i), shape,
                                   sh["layers"][i][leaf] if sh else None)
                       for leaf, shape in layer.items()}
                      for i, layer in enumerate(shapes["layers"])]
  return params


def check_finite(params: dict, source: str) -> None:
  """CheckpointError naming the first tensor (its path in the params tree) that holds a NaN or
  an infinity, and how many: such a weight makes every logit NaN, and decoding would emit
  token 0 at every step with nothing said. One pass over the weights, on their device. Every
  weight file vocabjax loads is checked: models, EAGLE and Medusa heads, rankers, distilled
  drafters and their LoRA adapters."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  floats = [(p, a) for p, a in flat if jnp.issubdtype(a.dtype, jnp.floating)]
  if not floats:
    return
  # x * 0 is 0 where x is finite and NaN where it is not, so a sum of it is NaN exactly when
  # the tensor holds a NaN or an inf: one float reduction per tensor (3-4x faster than
  # counting; a 1.5B model's 7 GB checked in ~1 s), the count only for a tensor that fails
  bad = jax.jit(lambda xs: jnp.stack([~jnp.isfinite(jnp.sum(x * 0, dtype=jnp.float32))
                                      for x in xs]))([a for _, a in floats])
  for (p, a), b in zip(floats, np.asarray(bad)):
    if b:
      n = int(jnp.sum(~jnp.isfinite(a)))
      name = jax.tree_util.keystr(p)
      raise CheckpointError(f"{source}: tensor {name} {list(a.shape)} holds {n} non-finite "
                            f"value(s) (NaN or inf): the file is corrupt or was saved from a "
                            f"diverged model")
