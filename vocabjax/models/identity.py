"""A model's identity for artifacts trained against it (rankers, EAGLE heads, distilled
drafters): shapes plus a dtype-stable fingerprint of its LM head, so an artifact is refused on
another model instead of silently decoding badly."""

from __future__ import annotations

import hashlib

import jax.numpy as jnp
import numpy as np

from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head_weight


def drafter_fingerprint(params: dict, config: LlamaLikeConfig) -> str:
  """sha256 of the drafter LM head's first and last 64 rows in bf16 (dtype-stable: an f32 copy
  of a bf16 checkpoint gives the same digest)."""
  U = lm_head_weight(params, config)
  rows = jnp.concatenate([U[:64], U[-64:]]).astype(jnp.bfloat16)
  return hashlib.sha256(np.asarray(rows.view(jnp.uint16)).tobytes()).hexdigest()[:16]


def drafter_identity(params: dict, config: LlamaLikeConfig) -> dict:
  return {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
          "num_layers": config.num_layers, "fingerprint": drafter_fingerprint(params, config)}


def identity_mismatch(want: dict, params: dict, config: LlamaLikeConfig, made: str) -> str | None:
  """Why a file made for the drafter `want` (a `drafter_identity` record) does not fit this
  drafter, or None when it does; `made` opens the message ("the ranker was trained")."""
  got = drafter_identity(params, config)
  for key in ("hidden_size", "vocab_size", "num_layers"):
    if want.get(key) != got[key]:
      return f"{made} for a drafter with {key}={want.get(key)}, this drafter has {key}={got[key]}"
  if want.get("fingerprint") != got["fingerprint"]:
    return (f"{made} for another drafter (LM-head fingerprint {want.get('fingerprint')}, this "
            f"drafter's is {got['fingerprint']})")
  return None
