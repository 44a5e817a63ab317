"""LoRA adapters for the llama-like params pytree (Hu et al. 2021), pure-functional.

Letters: F out features, D in features, R rank (the kernel's names: D input width, F output).

A weight W [F, D] of a targeted leaf gets W + (alpha / R) * B @ A with A [R, D] (random) and
B [F, R] (zeros), so the merged model equals the base at initialisation. Only the adapter is
trained (the base is a constant of the loss); `merge` builds the effective params, and the same
function exports the fine-tuned drafter for decoding (no adapter code in the decoding path).

    lora = init_lora(key, params, rank=32)
    loss(merge(params, lora, alpha=32.0), batch)       # grads w.r.t. lora only
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# attention and MLP projections of every layer (OmniDraft / SpecDec++ LoRA on the drafter)
DEFAULT_TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def init_lora(key: jax.Array, params: dict, *, rank: int = 32,
              targets: tuple[str, ...] = DEFAULT_TARGETS) -> dict:
  """{"layers": [{name: {"a": [R, D], "b": [F, R]}}]} for every targeted [F, D] weight (MLP
  weights stored [in, out] as `name_t` are adapted in that layout)."""
  if rank < 1:
    raise ValueError(f"LoRA rank must be >= 1, got {rank=}")
  layers = []
  for i, layer in enumerate(params["layers"]):
    ad = {}
    for j, name in enumerate(targets):
      key_name = name if name in layer else name + "_t" if name + "_t" in layer else None
      if key_name is None:
        continue
      F, D = layer[key_name].shape
      if rank > min(F, D):
        raise ValueError(f"LoRA {rank=} exceeds min(out, in) = {min(F, D)} of layer {i} "
                         f"{key_name} {layer[key_name].shape}")
      k = jax.random.fold_in(jax.random.fold_in(key, i), j)
      ad[key_name] = {"a": jax.random.normal(k, (rank, D), jnp.float32) / jnp.sqrt(D),
                      "b": jnp.zeros((F, rank), jnp.float32)}
    layers.append(ad)
  if not any(layers):
    raise ValueError(f"no weight named {targets} in the params to adapt")
  return {"layers": layers}


def merge(params: dict, lora: dict, *, alpha: float) -> dict:
  """The params with every adapter folded in: W + (alpha / R) * B @ A (W's dtype)."""
  layers = []
  for layer, ad in zip(params["layers"], lora["layers"]):
    layer = dict(layer)
    for name, ab in ad.items():
      R = ab["a"].shape[0]
      delta = (alpha / R) * (ab["b"] @ ab["a"])
      layer[name] = (layer[name].astype(jnp.float32) + delta).astype(layer[name].dtype)
    layers.append(layer)
  return {**params, "layers": layers}


def num_params(lora: dict) -> int:
  return sum(x.size for x in jax.tree.leaves(lora))
