"""Speculative vocabulary (SpecVocab, Williams et al. 2026): a per-step candidate set chosen by a
low-rank ranker, exact drafter logits only for the candidates.

Letters: X rows (batch x positions), D drafter hidden size, R ranker rank (d'), V vocabulary,
K candidates per row.

    s  = W_vocab (W_down h)              [X, V]   ranker scores, V*R + R*D multiply-adds
    idx = top_k(s, K)                    [X, K]   candidates (target ids; same tokenizer)
    z'[n, j] = U[idx[n, j]] . h[n]       [N, K]   the indexed LM head (`vocabjax.kernels`)

against V*D for the full head: cheaper when V*R + K*D < V*D (the paper's complexity check).
`ranked_policy` is a vocabulary policy (`vocabjax.vocab.policy`): drafting chooses among the K
candidates (argmax, sample, or a tree's top-k), q is zero outside them once scattered into V, and
verification keeps the full vocabulary, so the output distribution is exactly the target's
(residual max(p - q, 0) gives a missed token its full probability; greedy ignores q).

A `Ranker` is saved as safetensors (`down` [R, D], `vocab` [V, R]) with metadata naming the
drafter it was trained for (hidden size, vocabulary, layers, and a fingerprint of its LM head),
so a ranker is never silently used with another drafter.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, check_finite
from vocabjax.sampling import top_k
from vocabjax.io import atomic_write_bytes
from vocabjax.kernels.indexed_lm_head import indexed_lm_head, indexed_lm_head_sharded
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.identity import drafter_identity, identity_mismatch
from vocabjax.kernels.blocks import is_blocks
from vocabjax.models.llamalike import lm_head_rows, lm_head_weight
from vocabjax.lowering import lowering_of
from vocabjax.vocab.policy import (bound_policy, policy_state, require_float_head,
                                   with_policy_state)

FORMAT = "vocabjax-ranker/1"


class RankerError(ValueError):
  """A ranker that does not fit its drafter, or a corrupt ranker file; names the values."""


@dataclasses.dataclass(frozen=True)
class Ranker:
  down: np.ndarray  # [R, D] W_down
  vocab: np.ndarray  # [V, R] W_vocab
  drafter: dict  # drafter_identity() of the drafter it was trained for
  meta: dict = dataclasses.field(default_factory=dict)  # provenance (training run, data)

  def __post_init__(self):
    R, D = np.shape(self.down)
    V, R2 = np.shape(self.vocab)
    if R != R2:
      raise RankerError(f"W_down has rank {R} but W_vocab has rank {R2}")
    if R > D:
      raise RankerError(f"ranker W_down has shape {tuple(np.shape(self.down))} = (rank d', "
                        f"hidden d): its rank {R} exceeds its width {D} (the drafter's hidden "
                        f"size is {self.drafter.get('hidden_size')}; W_down stored transposed?)")
    if (D, V) != (self.drafter.get("hidden_size"), self.drafter.get("vocab_size")):
      raise RankerError(f"ranker shapes (d={D}, V={V}) disagree with its drafter record "
                        f"{self.drafter}")

  @property
  def rank(self) -> int:
    return int(np.shape(self.down)[0])

  @property
  def vocab_size(self) -> int:
    return int(np.shape(self.vocab)[0])

  @property
  def hidden_size(self) -> int:
    return int(np.shape(self.down)[1])

  def check_drafter(self, params: dict, config: LlamaLikeConfig) -> None:
    """RankerError if this ranker was trained for another drafter or vocabulary."""
    why = identity_mismatch(self.drafter, params, config, "the ranker was trained")
    if why:
      raise RankerError(why)

  def save(self, path) -> Path:
    """Write atomically as safetensors with the drafter record and provenance as metadata."""
    from safetensors.numpy import save

    path = Path(path)
    atomic_write_bytes(path, save({"down": np.ascontiguousarray(self.down, np.float32),
                                   "vocab": np.ascontiguousarray(self.vocab, np.float32)},
                                  metadata={"format": FORMAT, "drafter": json.dumps(self.drafter),
                                            "meta": json.dumps(self.meta)}))
    return path

  @classmethod
  def load(cls, path) -> "Ranker":
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
      raise RankerError(f"no ranker file at {path}")
    try:
      md = read_metadata(path)
      t = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
      raise RankerError(f"{path} is not a readable ranker file ({e})") from None
    missing = {"down", "vocab"} - set(t)
    if missing:
      raise RankerError(f"{path} lacks tensor(s) {sorted(missing)}")
    try:
      check_finite({"down": t["down"], "vocab": t["vocab"]}, str(path))
    except CheckpointError as e:
      raise RankerError(str(e)) from None
    return cls(t["down"], t["vocab"], json.loads(md["drafter"]), json.loads(md["meta"]))


def read_metadata(path) -> dict:
  """A ranker file's metadata (header only; RankerError if it is not a ranker file)."""
  from safetensors import safe_open

  with safe_open(str(path), framework="numpy") as f:
    md = f.metadata() or {}
  if md.get("format") != FORMAT:
    raise RankerError(f"{path} is not a vocabjax ranker (format {md.get('format')!r})")
  return md


def ranked_head_rows(k: int, V: int, R: int, D: int) -> int:
  """Cost of one row's ranked policy in D-wide head rows: k + (V*R + R*D) / D, rounded up."""
  return k + -(-(V * R + R * D) // D)


@dataclasses.dataclass(frozen=True)
class SpeculativeVocab:
  """A drafter vocabulary policy: `ranker`'s top-`k` candidates per step (module doc)."""

  ranker: Ranker
  k: int
  impl: str = "auto"  # indexed LM head implementation (`vocabjax.kernels.indexed_lm_head`)

  def __post_init__(self):
    V = self.ranker.vocab_size
    if not 1 <= self.k <= V:
      raise RankerError(f"k={self.k} must be in [1, V={V}] (the drafter's vocabulary)")

  @property
  def size(self) -> int:  # candidates per row (what a tree's top_k must not exceed)
    return self.k

  @property
  def head_rows(self) -> int:
    r = self.ranker
    return ranked_head_rows(self.k, r.vocab_size, r.rank, r.hidden_size)

  def attach(self, params: dict, config: LlamaLikeConfig, mesh=None):
    """(params with the ranker beside them, the policy). On a `mesh` whose "model" axis splits
    the drafter's LM head by rows, the indexed head runs under shard_map
    (`indexed_lm_head_sharded`): a Pallas kernel is one device's program."""
    require_float_head(params, RankerError, "a SpecVocab ranker is matched to its drafter's "
                       "float LM head (by fingerprint) and is not supported with an int8 drafter")
    self.ranker.check_drafter(params, config)
    dtype = lm_head_weight(params, config).dtype
    ranker = {"down": jnp.asarray(self.ranker.down, dtype),
              "vocab": jnp.asarray(self.ranker.vocab, dtype)}
    V = self.ranker.vocab_size
    split = mesh if mesh is not None and mesh.shape["model"] > 1 and V % mesh.shape[
        "model"] == 0 else None  # a head the sharding rules do not split stays replicated
    return (with_policy_state(params, ranker),
            _ranked_policy_of(config, self.k, self.impl, split))


def _ranked_policy_of(config: LlamaLikeConfig, k: int, impl: str, mesh):
  """`ranked_policy` with these settings bound (equal settings, equal policies)."""
  return bound_policy(ranked_policy, config=config, k=k, impl=impl, mesh=mesh)


def ranker_scores(ranker: dict, h: jax.Array) -> jax.Array:
  """s = W_vocab (W_down h), f32 accumulation: [..., D] -> [..., V]."""
  low = jnp.einsum("...D,RD->...R", h, ranker["down"], preferred_element_type=jnp.float32)
  return jnp.einsum("...R,VR->...V", low.astype(ranker["vocab"].dtype), ranker["vocab"],
                    preferred_element_type=jnp.float32)


def ranked_policy(params: dict, h: jax.Array, *, config: LlamaLikeConfig, k: int,
                  impl: str = "auto", mesh=None) -> tuple[jax.Array, jax.Array]:
  """(candidate target ids [..., k], their exact drafter logits [..., k]); `mesh`: the LM head
  is split by rows over its "model" axis (the indexed head under shard_map)."""
  lead, D = h.shape[:-1], h.shape[-1]
  flat = h.reshape(-1, D)
  lw = lowering_of(params)
  _, idx = top_k(ranker_scores(policy_state(params), flat), k, split=lw.split_top_k,
                 block=lw.block_top_k)
  if mesh is not None:
    z = indexed_lm_head_sharded(flat, lm_head_weight(params, config), idx, mesh=mesh,
                                impl=impl)
  else:
    U = lm_head_rows(params, config)[0]  # GGUF blocks: only the K rows are widened
    z = indexed_lm_head(flat, U if is_blocks(U) else lm_head_weight(params, config), idx,
                        impl=impl)
  return idx.reshape(lead + (k,)), z.reshape(lead + (k,))


def svd_ranker(params: dict, config: LlamaLikeConfig, rank: int, meta: dict | None = None
               ) -> Ranker:
  """The best rank-`rank` approximation of the drafter's own logits (Eckart-Young): with
  U = P S Q^T, W_down = Q_r^T and W_vocab = U Q_r = P_r S_r, so s = U Q_r Q_r^T h. The
  training's starting point, and a ranker that needs no data at all."""
  r = svd_of_head(lm_head_weight(params, config), rank)
  return Ranker(down=r.down, vocab=r.vocab, drafter=drafter_identity(params, config),
                meta={"init": "svd", **(meta or {})})


def svd_of_head(U, rank: int) -> Ranker:
  """`svd_ranker` of an LM head U [V, D] given as the matrix itself (an EAGLE head's rows)."""
  U = np.asarray(U, np.float64)
  D = U.shape[1]
  if not 1 <= rank <= D:
    raise RankerError(f"ranker rank d'={rank} must be in [1, d={D}] (the drafter's hidden size)")
  _, vecs = np.linalg.eigh(U.T @ U)  # ascending eigenvalues of U^T U = Q S^2 Q^T
  Q = vecs[:, ::-1][:, :rank]  # [D, R]
  return Ranker(down=np.ascontiguousarray(Q.T, np.float32), vocab=(U @ Q).astype(np.float32),
                drafter={"hidden_size": D, "vocab_size": U.shape[0]}, meta={"init": "svd"})


