"""A model's identity for artifacts trained against it (rankers, EAGLE heads, distilled
drafters): shapes plus a dtype-stable fingerprint of its LM head, so an artifact is refused on
another model instead of silently decoding badly."""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head_weight


SKETCH_COLS = 4  # fixed random directions the head's rows are projected on
SKETCH_TOLERANCE = 0.25  # relative distance of sketches still taken for the same head


def _head_rows(params: dict, config: LlamaLikeConfig) -> jax.Array:
  """The drafter LM head's first and last 64 rows (dequantized where quantized)."""
  U = lm_head_weight(params, config)
  return jnp.concatenate([U[:64], U[-64:]])


def drafter_fingerprint(params: dict, config: LlamaLikeConfig) -> str:
  """sha256 of the drafter LM head's first and last 64 rows in bf16 (dtype-stable: an f32 copy
  of a bf16 checkpoint gives the same digest)."""
  return _fingerprint(_head_rows(params, config))


def _fingerprint(rows) -> str:
  rows = jnp.asarray(rows).astype(jnp.bfloat16)
  return hashlib.sha256(np.asarray(rows.view(jnp.uint16)).tobytes()).hexdigest()[:16]


def head_sketch(rows) -> list[float]:
  """The head's first and last 64 rows projected on SKETCH_COLS fixed random unit directions
  (seeded by the width): 512 numbers that a quantized copy of the same head reproduces within
  its rounding (Q4_0: ~0.1 relative) and another head does not (~1.4)."""
  rows = np.asarray(jnp.asarray(rows, jnp.float32))
  D = rows.shape[1]
  P = np.random.default_rng(D).standard_normal((D, SKETCH_COLS)) / np.sqrt(D)
  return [float(f"{v:.5g}") for v in (rows.astype(np.float64) @ P).ravel()]


def sketch_distance(got, want) -> float:
  """||got - want|| / ||want|| of two head sketches (inf when their sizes differ)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if got.shape != want.shape:
    return float("inf")
  return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def drafter_identity(params: dict, config: LlamaLikeConfig) -> dict:
  """Shapes, the LM head's fingerprint (exact) and its sketch (the same head quantized)."""
  rows = _head_rows(params, config)
  return {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
          "num_layers": config.num_layers, "fingerprint": _fingerprint(rows),
          "sketch": head_sketch(rows)}


def identity_mismatch(want: dict, params: dict, config: LlamaLikeConfig, made: str,
                      exact: bool = False) -> str | None:
  """Why a file made for the drafter `want` (a `drafter_identity` record) does not fit this
  drafter, or None when it does; `made` opens the message ("the ranker was trained"). A head
  whose fingerprint differs still fits when `want` has a sketch and this head's is within
  SKETCH_TOLERANCE of it (the same model quantized, e.g. loaded with dtype="int4"), unless
  `exact` (a distilled drafter's weights are merged into its base: only that base fits)."""
  got = drafter_identity(params, config)
  for key in ("hidden_size", "vocab_size", "num_layers"):
    if want.get(key) != got[key]:
      return f"{made} for a drafter with {key}={want.get(key)}, this drafter has {key}={got[key]}"
  if want.get("fingerprint") == got["fingerprint"]:
    return None
  why = (f"{made} for another drafter (LM-head fingerprint {want.get('fingerprint')}, this "
         f"drafter's is {got['fingerprint']}")
  if exact:
    return why + ")"
  if "sketch" not in want:
    return why + "; the file has no head sketch, so a quantized copy of its drafter cannot be " \
                 "told from another model: load the drafter as it was loaded then)"
  d = sketch_distance(got["sketch"], want["sketch"])
  if d <= SKETCH_TOLERANCE:
    return None
  return why + f"; the heads' sketches are {d:.2f} apart, over the {SKETCH_TOLERANCE} a " \
               f"quantized copy of the same head stays within)"
