"""Dynamic shortlists over token clusters (DynaSpec, Zhang et al. 2025, arXiv 2510.13847): a small
router picks, per drafting step, a few clusters of the vocabulary; the drafter's head computes
only their tokens.

Letters: N hidden rows, D drafter hidden size, V vocabulary, C clusters, M a cluster's most
members (padded), m clusters chosen per row.

    s   = W_r h + b                       [N, C]     the router, C*D multiply-adds
    c   = top_m(s)                        [N, m]     the row's clusters
    ids = members[c]                      [N, m*M]   their tokens (padding: -1, logit -inf)
    z[n, j] = U[ids[n, j]] . h[n]         [N, m*M]   the indexed LM head

against V*D for the full head. The clusters partition the vocabulary (each token in exactly
one), so a shortlist never repeats a token. DynaSpec reports 98.4% of the full head's acceptance
length on Llama-3-8B against 93.6% for a fixed frequency-ranked list. Its abstract is what could
be read here: the clustering, the router's inputs and loss, and the cluster counts are this
module's choices, said so in docs/vocabulary.md:
- clusters: balanced k-means of the drafter's LM-head rows (normalized: tokens the head scores
  alike share a cluster), every cluster at most ceil(V / C) tokens (`fit_clusters`, numpy);
- the router: one linear layer on the drafter's final hidden state h (the state the head
  reads; DynaSpec runs its classifier beside the drafter's layers on a second CUDA stream, which
  one XLA program does not), trained by `python -m vocabjax.train.router` with optax: softmax
  cross-entropy of the cluster of the target's next token, on the ranker's feature shards.
A `ClusterRouter` is saved as safetensors (`members` [C, M], `weight` [C, D], `bias` [C]) with the
drafter's identity (its LM-head fingerprint), so it is never used with another drafter.
Verification keeps the full vocabulary: output is exactly the target's whatever the router picks.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, check_finite
from vocabjax.io import atomic_write_bytes
from vocabjax.kernels.blocks import is_blocks
from vocabjax.kernels.indexed_lm_head import indexed_lm_head
from vocabjax.lowering import lowering_of
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.identity import identity_mismatch
from vocabjax.models.llamalike import lm_head_rows, lm_head_weight
from vocabjax.sampling import top_k
from vocabjax.vocab.policy import (bound_policy, policy_impl, policy_state, require_float_head,
                                   with_policy_state)

FORMAT = "vocabjax-router/1"


class RouterError(ValueError):
  """Clusters or a router that do not fit their drafter, or a corrupt router file."""


def check_members(members: np.ndarray, vocab_size: int) -> None:
  """`members` [C, M] (-1 padding) must partition [0, V): each token in exactly one cluster."""
  members = np.asarray(members)
  if members.ndim != 2 or members.shape[0] == 0:
    raise RouterError(f"clusters need a [C, M] member table with C >= 1, got shape "
                      f"{members.shape} (a cluster count of zero?)")
  held = members[members >= 0]
  if held.size != vocab_size or np.any(np.bincount(held, minlength=vocab_size) != 1):
    raise RouterError(f"the clusters do not partition the vocabulary of V={vocab_size} tokens "
                      f"(they hold {held.size} ids, {np.unique(held).size} distinct)")


@dataclasses.dataclass(frozen=True, eq=False)
class ClusterRouter:
  members: np.ndarray  # [C, M] int32 token ids per cluster, -1 padding
  weight: np.ndarray  # [C, D] the router's W_r
  bias: np.ndarray  # [C]
  drafter: dict  # drafter_identity() of the drafter it was fitted for
  meta: dict = dataclasses.field(default_factory=dict)  # provenance

  def __post_init__(self):
    C, D = np.shape(self.weight)
    if np.shape(self.members)[0] != C or np.shape(self.bias) != (C,):
      raise RouterError(f"router shapes disagree: members {np.shape(self.members)}, weight "
                        f"{np.shape(self.weight)}, bias {np.shape(self.bias)}")
    if D != self.drafter.get("hidden_size"):
      raise RouterError(f"the router reads hidden states of size {D}, its drafter record says "
                        f"hidden_size={self.drafter.get('hidden_size')}")
    check_members(self.members, self.drafter.get("vocab_size", -1))

  @property
  def num_clusters(self) -> int:
    return int(np.shape(self.weight)[0])

  @property
  def cluster_size(self) -> int:  # M
    return int(np.shape(self.members)[1])

  @property
  def vocab_size(self) -> int:
    return int(self.drafter["vocab_size"])

  def cluster_of(self) -> np.ndarray:
    """[V] each token's cluster."""
    out = np.empty(self.vocab_size, np.int32)
    c, j = np.nonzero(np.asarray(self.members) >= 0)
    out[np.asarray(self.members)[c, j]] = c
    return out

  def check_drafter(self, params: dict, config: LlamaLikeConfig) -> None:
    """RouterError if this router was fitted for another drafter or vocabulary."""
    why = identity_mismatch(self.drafter, params, config, "the router was fitted")
    if why:
      raise RouterError(why)

  def save(self, path) -> Path:
    from safetensors.numpy import save

    path = Path(path)
    atomic_write_bytes(path, save(
        {"members": np.ascontiguousarray(self.members, np.int32),
         "weight": np.ascontiguousarray(self.weight, np.float32),
         "bias": np.ascontiguousarray(self.bias, np.float32)},
        metadata={"format": FORMAT, "drafter": json.dumps(self.drafter),
                  "meta": json.dumps(self.meta)}))
    return path

  @classmethod
  def load(cls, path) -> "ClusterRouter":
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
      raise RouterError(f"no router file at {path} (fit one with `python -m "
                        f"vocabjax.train.router`)")
    try:
      with safe_open(str(path), framework="numpy") as f:
        md = f.metadata() or {}
      t = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
      raise RouterError(f"{path} is not a readable router file ({e})") from None
    if md.get("format") != FORMAT:
      raise RouterError(f"{path} is not a vocabjax router (format {md.get('format')!r})")
    missing = {"members", "weight", "bias"} - set(t)
    if missing:
      raise RouterError(f"{path} lacks tensor(s) {sorted(missing)}")
    try:
      check_finite({"weight": t["weight"], "bias": t["bias"]}, str(path))
    except CheckpointError as e:
      raise RouterError(str(e)) from None
    return cls(t["members"], t["weight"], t["bias"], json.loads(md["drafter"]),
               json.loads(md["meta"]))


def fit_clusters(U, num_clusters: int, *, iters: int = 8, seed: int = 0,
                 progress=None) -> np.ndarray:
  """Balanced k-means of the LM-head rows U [V, D] (each normalized): [C, M] members with
  M = ceil(V / C), -1 padding, seeded by k-means++. Each iteration assigns every token to the nearest centroid that
  has room (tokens nearest their best centroid first) and moves each centroid to its members'
  mean direction.
  `progress`: a callable(iteration) told each iteration."""
  U = np.asarray(U, np.float32)
  V = U.shape[0]
  if not 1 <= num_clusters <= V:
    raise RouterError(f"num_clusters={num_clusters} must be in [1, V={V}]")
  X = U / np.maximum(np.linalg.norm(U, axis=1, keepdims=True), 1e-12)
  rs = np.random.RandomState(seed)
  cent = np.empty((num_clusters, X.shape[1]), np.float32)  # k-means++ seeding
  cent[0] = X[rs.randint(V)]
  near = X @ cent[0]
  for c in range(1, num_clusters):
    gap = np.maximum(1.0 - near, 0.0) ** 2
    cent[c] = X[rs.choice(V, p=gap / gap.sum()) if gap.sum() > 0 else rs.randint(V)]
    near = np.maximum(near, X @ cent[c])
  M = -(-V // num_clusters)
  assign = np.zeros(V, np.int64)
  for it in range(max(iters, 1)):
    assign = _capacity_assign(X @ cent.T, M)  # cosine similarity [V, C]
    for c in range(num_clusters):
      mem = X[assign == c]
      if len(mem):
        cent[c] = mem.mean(0) / max(np.linalg.norm(mem.mean(0)), 1e-12)
    if progress is not None:
      progress(it)
  members = np.full((num_clusters, M), -1, np.int32)
  for c in range(num_clusters):
    ids = np.flatnonzero(assign == c)
    members[c, :len(ids)] = ids
  return members


def _capacity_assign(sim: np.ndarray, M: int) -> np.ndarray:
  """Each token (most confident first) to its most similar cluster holding fewer than M:
  sim [V, C] -> [V] cluster ids."""
  V, C = sim.shape
  assign = np.empty(V, np.int64)
  room = np.full(C, M, np.int64)
  closed = np.zeros(C, bool)
  for t in np.argsort(-sim.max(axis=1), kind="stable").tolist():
    row = sim[t]
    c = int(np.argmax(np.where(closed, -np.inf, row) if closed.any() else row))
    assign[t] = c
    room[c] -= 1
    if not room[c]:
      closed[c] = True
  return assign


@dataclasses.dataclass(frozen=True, eq=False)
class ClusteredVocab:
  """A drafter vocabulary policy: the tokens of the router's top `top` clusters (module doc)."""

  router: ClusterRouter
  top: int  # m: clusters chosen per row
  impl: str = "auto"  # the indexed LM head's implementation

  def __post_init__(self):
    C = self.router.num_clusters
    if not 1 <= self.top <= C:
      raise RouterError(f"top={self.top} clusters must be in [1, C={C}] (the router's)")

  @property
  def size(self) -> int:  # candidates per row (what a tree's top_k must not exceed)
    return self.top * self.router.cluster_size

  @property
  def head_rows(self) -> int:  # the shortlist's rows and the router's C rows
    return self.size + self.router.num_clusters

  def attach(self, params: dict, config: LlamaLikeConfig, mesh=None):
    """(params with the router and clusters beside them, the policy)."""
    require_float_head(params, RouterError, "a cluster router gathers rows of a float LM head")
    self.router.check_drafter(params, config)
    dtype = lm_head_weight(params, config).dtype
    members = np.asarray(self.router.members)
    state = {"weight": jnp.asarray(self.router.weight, dtype),
             "bias": jnp.asarray(self.router.bias, jnp.float32),
             "members": jnp.asarray(np.maximum(members, 0), jnp.int32),
             "valid": jnp.asarray(members >= 0)}
    impl = policy_impl(self.impl, mesh)
    return (with_policy_state(params, state),
            bound_policy(clustered_policy, config=config, top=self.top, impl=impl))


def router_scores(state: dict, h: jax.Array) -> jax.Array:
  """s = W_r h + b: [..., D] -> [..., C] f32."""
  return jnp.einsum("...D,CD->...C", h, state["weight"],
                    preferred_element_type=jnp.float32) + state["bias"]


def clustered_policy(params: dict, h: jax.Array, *, config: LlamaLikeConfig, top: int,
                     impl: str = "auto") -> tuple[jax.Array, jax.Array]:
  """(candidate ids [..., top*M], logits [..., top*M]): the top clusters' tokens; padding -inf."""
  st = policy_state(params)
  lead, D = h.shape[:-1], h.shape[-1]
  flat = h.reshape(-1, D)
  lw = lowering_of(params)
  _, chosen = top_k(router_scores(st, flat), top, split=lw.split_top_k)  # [N, m]
  N, M = flat.shape[0], st["members"].shape[1]
  ids = st["members"][chosen].reshape(N, top * M)
  ok = st["valid"][chosen].reshape(N, top * M)
  U = lm_head_rows(params, config)[0]
  z = indexed_lm_head(flat, U if is_blocks(U) else lm_head_weight(params, config), ids,
                      impl=impl)
  z = jnp.where(ok, z, -jnp.inf)
  return ids.reshape(lead + (top * M,)), z.reshape(lead + (top * M,))
