"""Medusa-1 heads (Cai et al. 2024) on a target's final hidden state, and Medusa's static tree.

Letters: D the target's hidden size, V its vocabulary, Hm heads, Lm residual blocks per head,
n tree nodes besides the root, k the largest top-k rank a tree uses per head.

Head i (i = 0 .. Hm-1) maps the target's final (normed) hidden state h at position t to logits
for the token at t + i + 2 (the target's own LM head gives t + 1):

    x = h;  x = x + silu(W x + b)   (Lm times)          [..., D]
    logits_i = U_i x                                    [..., V]

As in Medusa's `MedusaModel`, the Lm residual blocks of one head are one module repeated
(`[ResBlock(D)] * Lm` shares its weights), W starts at zero (each head starts as the target's
head applied to h) and U_i starts as a copy of the target's LM head. `shared_lm_head` uses the
target's LM head for every head instead of Hm copies.

The static tree (`medusa_tree`): Medusa's `medusa_choices`, a list of paths (c_0, .., c_j): the
node at depth j + 1 drafts head j's c_j-th most likely token below the node of (c_0, .., c_{j-1});
the root is the token the target emitted. Nodes are ordered as Medusa orders them (by length,
then by value), so node indices match `generate_medusa_buffers`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


class MedusaError(ValueError):
  """Bad Medusa heads or tree (shapes of another target, a malformed choice list)."""


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
  num_heads: int  # Hm
  hidden_size: int  # D, the target's
  vocab_size: int  # V, the target's
  num_layers: int = 1  # Lm residual blocks per head (one shared module, as Medusa's)
  shared_lm_head: bool = False  # every head projects with the target's LM head

  def __post_init__(self):
    if self.num_heads < 1 or self.num_layers < 0:
      raise MedusaError(f"Medusa needs num_heads >= 1 and num_layers >= 0, got "
                        f"num_heads={self.num_heads}, num_layers={self.num_layers}")

  def check_target(self, hidden_size: int, vocab_size: int) -> None:
    if (self.hidden_size, self.vocab_size) != (hidden_size, vocab_size):
      raise MedusaError(f"Medusa heads for D={self.hidden_size}, V={self.vocab_size} do not fit "
                        f"a target with D={hidden_size}, V={vocab_size}")


def init_medusa(key: jax.Array, config: MedusaConfig, lm_head: jax.Array | None = None,
                dtype=jnp.float32) -> dict:
  """Medusa's initialization: W = 0, b ~ U(-1/sqrt(D), 1/sqrt(D)) (PyTorch's Linear default),
  each head's U a copy of the target's LM head `lm_head` [V, D] (required unless shared)."""
  D, V = config.hidden_size, config.vocab_size
  heads = []
  for i in range(config.num_heads):
    bound = 1.0 / np.sqrt(D)
    head = {"w": jnp.zeros((D, D), dtype),
            "b": jax.random.uniform(jax.random.fold_in(key, i), (D,), dtype, -bound, bound)}
    if not config.shared_lm_head:
      if lm_head is None or lm_head.shape != (V, D):
        raise MedusaError(f"each head's projection starts as the target's LM head [V={V}, "
                          f"D={D}]; got {None if lm_head is None else lm_head.shape}")
      head["lm_head"] = jnp.asarray(lm_head, dtype)
    heads.append(head)
  return {"heads": heads}


def medusa_hidden(params: dict, h: jax.Array, *, config: MedusaConfig) -> jax.Array:
  """[..., D] -> [..., Hm, D]: each head's residual blocks (f32 accumulation)."""
  outs = []
  for head in params["heads"]:
    x = h
    for _ in range(config.num_layers):  # one module repeated (Medusa's weight sharing)
      z = jnp.einsum("...D,ED->...E", x, head["w"], preferred_element_type=jnp.float32)
      x = x + jax.nn.silu(z + head["b"]).astype(x.dtype)
    outs.append(x)
  return jnp.stack(outs, axis=-2)


def medusa_logits(params: dict, h: jax.Array, *, config: MedusaConfig,
                  lm_head: jax.Array | None = None) -> jax.Array:
  """[..., D] -> [..., Hm, V] f32; `lm_head` [V, D] is the target's (for `shared_lm_head`)."""
  x = medusa_hidden(params, h, config=config)
  if config.shared_lm_head:
    if lm_head is None:
      raise MedusaError("shared_lm_head: pass the target's LM head")
    return jnp.einsum("...HD,VD->...HV", x, lm_head, preferred_element_type=jnp.float32)
  return jnp.stack([jnp.einsum("...D,VD->...V", x[..., i, :], head["lm_head"],
                               preferred_element_type=jnp.float32)
                    for i, head in enumerate(params["heads"])], axis=-2)


@dataclasses.dataclass(frozen=True)
class MedusaTree:
  """A static tree from Medusa choices; node j (0-based) of the n is at full index j + 1."""

  choices: tuple[tuple[int, ...], ...]  # Medusa's order: by length, then by value
  head: np.ndarray  # [n] the head (= depth - 1) that drafts node j
  rank: np.ndarray  # [n] its rank among that head's top-k
  parent: np.ndarray  # [n] 0 = the root, p + 1 = node p
  depth: np.ndarray  # [n] 1 .. Hm

  @property
  def size(self) -> int:  # n
    return len(self.choices)

  @property
  def max_depth(self) -> int:
    return int(self.depth.max())

  @property
  def top_k(self) -> int:  # k: the largest rank used, plus one (top-k per head needed)
    return int(self.rank.max()) + 1

  @property
  def max_children(self) -> int:  # siblings under one node, at most
    return int(np.bincount(self.parent).max())

  def attention_mask(self) -> np.ndarray:
    """[n + 1, n + 1] bool: node i sees node j iff j is i or an ancestor (root first), as
    Medusa's `medusa_attn_mask`."""
    n = self.size
    m = np.eye(n + 1, dtype=bool)
    m[:, 0] = True
    for j in range(n):
      p = int(self.parent[j])
      while p:
        m[j + 1, p] = True
        p = int(self.parent[p - 1])
    return m


def medusa_tree(choices: Sequence[Sequence[int]], num_heads: int) -> MedusaTree:
  """The tree of Medusa `choices` (e.g. Medusa's `mc_sim_7b_63`) for `num_heads` heads; every
  path's prefixes must be choices too, ranks >= 0, no path deeper than the heads."""
  paths = [tuple(int(c) for c in p) for p in choices]
  if not paths:
    raise MedusaError("empty Medusa choices: a tree needs at least one node")
  if len(set(paths)) != len(paths):
    dup = sorted({p for p in paths if paths.count(p) > 1})
    raise MedusaError(f"Medusa choices repeat {list(map(list, dup))}")
  for p in paths:
    if not p or min(p) < 0:
      raise MedusaError(f"Medusa choice {list(p)}: a path of top-k ranks >= 0 is needed")
    if len(p) > num_heads:
      raise MedusaError(f"Medusa choice {list(p)} is {len(p)} deep but there are "
                        f"{num_heads} heads")
  have = set(paths)
  for p in paths:
    if len(p) > 1 and p[:-1] not in have:
      raise MedusaError(f"Medusa choice {list(p)} has no parent {list(p[:-1])} in the choices")
  order = sorted(paths, key=lambda x: (len(x), x))
  index = {p: j for j, p in enumerate(order)}
  parent = np.array([0 if len(p) == 1 else index[p[:-1]] + 1 for p in order], np.int32)
  depth = np.array([len(p) for p in order], np.int32)
  return MedusaTree(choices=tuple(order), head=depth - 1,
                    rank=np.array([p[-1] for p in order], np.int32), parent=parent, depth=depth)
