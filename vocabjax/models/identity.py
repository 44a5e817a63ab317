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
