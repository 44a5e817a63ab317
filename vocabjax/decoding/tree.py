"""EAGLE-2 dynamic-tree drafting (Li et al. 2024) and tree verification.

Letters: B batch, k top_k, d depth, n total_tokens (tree nodes besides the root), m candidates
(k + (d - 1) k^2), S cache slots, V vocabulary.

Drafting: the root (the newest committed token) gives k children scored by the drafter's
log-probability. At each further depth the k best frontier nodes are fed to the drafter
together (each sees only its ancestors: an explicit mask over the cache slots) and give k
children each; all k^2 cumulative log-prob scores are kept, and the k best become the next
frontier. Finally the best n of all m candidates form the tree. A child never outscores its
parent (log q <= 0), and candidates are laid out parents-first with ties going to the lower
index, so the selected set is always connected.

Verification (one target forward over the n + 1 tree slots with the ancestor mask and
depth-based positions) is greedy, or lossless stochastic for deterministically chosen drafts
(`verify_tree_sampling`). The accepted path's KV entries are compacted in the target cache;
the drafter re-reads the accepted tokens at the start of the next step.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from vocabjax.sampling import SamplingParams, probs, top_k
from vocabjax.decoding.verify import verify_tree_greedy, verify_tree_sampling
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.lowering import lowering_of
from vocabjax.lowering import scan as lowering_scan
from vocabjax.models.llamalike import forward, forward_features, lm_head
from vocabjax.vocab.policy import to_target_many


MAX_TREE_NODES = 4096  # nodes one verification reads as a block (the trees used run 8-64)


@dataclasses.dataclass(frozen=True)
class TreeParams:
  """EAGLE-2 tree budget."""

  top_k: int = 4  # children per expanded node, and frontier width
  depth: int = 4  # levels below the root
  total_tokens: int = 16  # nodes verified by the target besides the root

  def __post_init__(self):
    if self.top_k < 1 or self.depth < 1:
      raise ValueError(f"tree needs top_k >= 1 and depth >= 1, got {self.top_k=} {self.depth=}")
    if self.total_tokens < self.top_k:
      raise ValueError(f"tree budget {self.total_tokens=} is smaller than {self.top_k=}")
    if self.total_tokens < self.depth:  # each level below the root needs one node at least
      raise ValueError(f"tree budget total_tokens={self.total_tokens} is smaller than "
                       f"depth={self.depth}: {self.total_tokens} nodes below the root reach "
                       f"depth {self.total_tokens} at most; raise total_tokens or lower depth")
    if self.total_tokens > MAX_TREE_NODES or self.top_k > MAX_TREE_NODES:
      raise ValueError(f"tree total_tokens={self.total_tokens}, top_k={self.top_k}: one "
                       f"verification reads the tree as one block, at most {MAX_TREE_NODES} "
                       f"nodes")
    if self.total_tokens > self.num_candidates:
      raise ValueError(f"tree budget {self.total_tokens=} exceeds the {self.num_candidates} "
                       f"candidates that top_k={self.top_k}, depth={self.depth} produce")

  @property
  def num_candidates(self) -> int:
    return self.top_k + (self.depth - 1) * self.top_k ** 2

  @property
  def draft_slots(self) -> int:
    """Drafter cache slots one step may write past the committed tokens."""
    return max(self.depth + 1, 1 + (self.depth - 1) * self.top_k)


def read_pending(params, cache: KVCache, pend_tokens, pend_count, *, config: LlamaLikeConfig):
  """Feed an independent drafter whose `cache` holds every committed token but the
  `pend_count` [B] pending ones (`pend_tokens` [B, P], left-aligned) those tokens: (its output
  at the root, the last pending token [B, D], the cache holding every committed token, root
  included)."""
  B, P = pend_tokens.shape
  L0 = cache.lengths
  h, cache = forward(params, pend_tokens, L0[:, None] + jnp.arange(P)[None], cache,
                     config=config)
  h_root = jnp.take_along_axis(h, (pend_count - 1)[:, None, None], axis=1)[:, 0]
  return h_root, cache.with_lengths(L0 + pend_count)


def grow_drafter_tree(params, h_root, cache: KVCache, *, config: LlamaLikeConfig,
                      tree: TreeParams, policy):
  """`grow_tree` with an independent drafter from its output at the root (`read_pending`):
  (node tokens [B, n], parent [B, n] in 0..n (0 = root), depth [B, n], the drafter cache as
  given)."""
  def expand(params, tok, parent_state, positions, cache, prefix_mask):
    del parent_state  # the drafter reads its own cache only
    k = tok.shape[1]
    h, cache = forward(params, tok, positions, cache, jnp.eye(k, dtype=jnp.bool_)[None],
                       config=config, prefix_mask=prefix_mask)
    return h, h, cache

  return grow_tree(params, h_root, h_root, cache, tree=tree, policy=policy, expand=expand)


def drop_rows(tok, parent, depth, keep):
  """The tree with the nodes of rows where `keep` [B] is False made padding (their own parents,
  never reached from the root, as `merge_nodes`'s padding); all of it when keep is None."""
  if keep is None:
    return tok, parent, depth
  own = jnp.arange(1, parent.shape[1] + 1, dtype=parent.dtype)[None]
  return (tok, jnp.where(keep[:, None], parent, own),
          jnp.where(keep[:, None], depth, jnp.ones_like(depth)))


def grow_tree(params, h_root, state_root, cache, *, tree: TreeParams, policy, expand,
              root=None):
  """EAGLE-2 tree growth shared by every drafter (see the module doc).

  h_root [B, D]: the policy's input at the root; state_root [B, ...]: what the root's children
  are expanded from (an EAGLE head's own output; unused by an independent drafter). `cache`
  holds the committed entries (its lengths), the root's included. `expand(params, tok [B, k],
  parent_state [B, k, ...], positions [B, k], cache, prefix_mask [B, k, S])` feeds one frontier
  and returns (policy input [B, k, D], state [B, k, ...], cache). Returns (node tokens [B, n],
  parent [B, n] in 0..n (0 = root), depth [B, n], the cache with its lengths as given).
  `root`: policy(params, h_root) when the caller has computed it already.
  """
  k, d = tree.top_k, tree.depth
  C = cache.lengths
  B = C.shape[0]
  split, block = lowering_of(params).split_top_k, lowering_of(params).block_top_k
  ids, logits = root if root is not None else policy(params, h_root)
  score1, j1 = top_k(jax.nn.log_softmax(logits, axis=-1), k, split=split, block=block)
  tok1 = to_target_many(ids, j1)
  S = cache.max_len
  slots = jnp.arange(S)

  cand_tok, cand_score, cand_parent = [tok1], [score1], [jnp.full((B, k), -1, jnp.int32)]
  if d > 1:
    def step(carry, i):
      cache, f_idx, f_tok, f_score, f_anc, f_state = carry
      start = cache.lengths
      h, st, cache = expand(params, f_tok, f_state,
                            jnp.broadcast_to((C - 1 + i)[:, None], (B, k)), cache, f_anc)
      own = (slots[None, None, :] == (start[:, None] + jnp.arange(k)[None])[..., None])
      child_anc = f_anc | own  # [B, k, S]: what each frontier node's children may see
      ids, logits = policy(params, h)  # logits [B, k, V or K candidates]
      top_score, top_j = top_k(jax.nn.log_softmax(logits, axis=-1), k, split=split,
                               block=block)  # [B, k, k]
      top_tok = to_target_many(ids, top_j)
      c_score = (f_score[..., None] + top_score).reshape(B, k * k)
      c_tok = top_tok.reshape(B, k * k).astype(jnp.int32)
      c_parent = jnp.repeat(f_idx, k, axis=1)
      best_score, sel = top_k(c_score, k, split=split)  # ties: lower index first
      base = k + (i - 1) * k * k
      par = sel // k  # which frontier node each new frontier node hangs from
      pick = lambda x: jnp.take_along_axis(  # noqa: E731
          x, par.reshape(B, k, *([1] * (x.ndim - 2))), 1)
      nxt = (cache, base + sel, jnp.take_along_axis(c_tok, sel, 1), best_score, pick(child_anc),
             pick(st))
      return nxt, (c_tok, c_score, c_parent)

    f_anc = jnp.broadcast_to((slots[None, :] < C[:, None])[:, None, :], (B, k, S))
    f_state = jnp.broadcast_to(state_root[:, None], (B, k) + state_root.shape[1:])
    init = (cache, jnp.broadcast_to(jnp.arange(k), (B, k)), tok1.astype(jnp.int32), score1,
            f_anc, f_state)
    (cache, *_), (toks, scores, parents) = lowering_scan(step, init, jnp.arange(1, d),
                                                         lowering_of(params))
    cand_tok += list(toks)
    cand_score += list(scores)
    cand_parent += list(parents)
  cand_tok = jnp.concatenate(cand_tok, axis=1).astype(jnp.int32)  # [B, m]
  cand_score = jnp.concatenate(cand_score, axis=1)
  cand_parent = jnp.concatenate(cand_parent, axis=1)
  cand_depth = jnp.concatenate([jnp.ones((k,), jnp.int32)] +
                               [jnp.full((k * k,), i + 1, jnp.int32) for i in range(1, d)])

  N, M = tree.total_tokens, tree.num_candidates
  _, sel = top_k(cand_score, N, split=split)
  sel = jnp.sort(sel, axis=1)  # parents-first node order
  node_of = jax.vmap(lambda s: jnp.zeros((M,), jnp.int32).at[s].set(  # per row: stays split
      jnp.arange(1, N + 1, dtype=jnp.int32)))(sel)  # over a mesh's "data" axis
  parent_cand = jnp.take_along_axis(cand_parent, sel, 1)
  parent = jnp.where(parent_cand < 0, 0,
                     jnp.take_along_axis(node_of, jnp.maximum(parent_cand, 0), 1))
  # The expansions wrote past slot C only; resetting the length drops them.
  return jnp.take_along_axis(cand_tok, sel, 1), parent, cand_depth[sel], cache.with_lengths(C)


def merge_nodes(tok, parent, depth, x_tok, x_parent, x_depth):
  """Add a second tree's nodes under the same root, merged: (tokens, parent, depth) [B, n + m].

  tok / parent / depth [B, n]: a tree (parent 0 the root, j + 1 its node j, siblings distinct).
  x_tok / x_parent / x_depth [B, m]: another tree over the same root, parents first, in the
  same form; a node that is its own parent (x_parent[b, j] == j + 1) is padding. Each x node
  whose parent (as merged) already has a child with its token is merged into that child (its
  own children hang from it instead); the others are appended as nodes n + j with their parent
  mapped. A merged or padding node stays in the output as padding (its own parent, depth 1):
  never reachable from the root, never verified on a path. So siblings stay distinct, which
  greedy verification (the first matching child) and `verify_tree_sampling` (p' with each
  tried sibling removed) rely on. A node has at most (its children in the first tree) + (in the
  second) children."""
  B, n = tok.shape
  m = x_tok.shape[1]
  if m == 0:
    return tok, parent, depth
  all_tok = jnp.concatenate([tok, x_tok], axis=1).astype(jnp.int32)
  all_par = jnp.concatenate([parent, jnp.zeros((B, m), jnp.int32)], axis=1).astype(jnp.int32)
  all_dep = jnp.concatenate([depth, jnp.ones((B, m), jnp.int32)], axis=1).astype(jnp.int32)
  live = jnp.concatenate([jnp.ones((B, n), jnp.bool_), jnp.zeros((B, m), jnp.bool_)], axis=1)
  where_x = jnp.zeros((B, m + 1), jnp.int32)  # x's node index (0 root, j + 1) -> merged index
  x_parent, x_depth = x_parent.astype(jnp.int32), x_depth.astype(jnp.int32)
  idx = jnp.arange(n + m, dtype=jnp.int32)[None]

  # One x node per iteration, parents first (each x node's parent is placed before it): a loop
  # over fixed-shape arrays (nodes from n + j on are not yet live), so the program holds one
  # body whatever m (unrolled, each j's slices were other shapes, so other kernels:
  # kernels/trie_bucket_compile.py).
  def body(j, carry):
    all_par, all_dep, live, where_x = carry
    xp = jax.lax.dynamic_index_in_dim(x_parent, j, 1, keepdims=False)
    pad = xp == j + 1
    mp = jnp.take_along_axis(where_x, jnp.minimum(xp, j)[:, None], axis=1)[:, 0]
    here = jax.lax.dynamic_index_in_dim(all_tok, n + j, 1, keepdims=True)
    same = live & (all_par == mp[:, None]) & (all_tok == here)
    found = same.any(axis=1)
    keep = ~pad & ~found
    own = n + j + 1
    at = idx == n + j
    all_par = jnp.where(at, jnp.where(keep, mp, own)[:, None], all_par)
    x_dep = jax.lax.dynamic_index_in_dim(x_depth, j, 1, keepdims=False)
    all_dep = jnp.where(at, jnp.where(keep, x_dep, 1)[:, None], all_dep)
    live = jnp.where(at, keep[:, None], live)
    where_x = jnp.where(jnp.arange(m + 1)[None] == j + 1, jnp.where(
        found & ~pad, jnp.argmax(same, axis=1).astype(jnp.int32) + 1, own)[:, None], where_x)
    return all_par, all_dep, live, where_x

  all_par, all_dep, _, _ = jax.lax.fori_loop(0, m, body, (all_par, all_dep, live, where_x))
  return all_tok, all_par, all_dep


def ancestor_mask(parent_full: jax.Array, depth: int) -> jax.Array:
  """[B, n+1, n+1] bool: node j sees node i iff i is j or one of its ancestors.

  parent_full [B, n+1] with the root (index 0) its own parent.
  """
  B, n = parent_full.shape
  anc = jnp.broadcast_to(jnp.eye(n, dtype=jnp.bool_), (B, n, n))
  for _ in range(depth):  # pointer doubling is unnecessary at these depths
    anc = anc | jnp.take_along_axis(anc, parent_full[..., None], axis=1)
  return anc


def compact_path(cache: KVCache, base: jax.Array, path: jax.Array, n: jax.Array, *,
                 per_row: bool = False, region: int | None = None) -> KVCache:
  """Move the accepted nodes' KV (tree slots base + path[i]) to base + i; lengths = base + n + 1.

  With `region` (the tree's slots, base .. base + region - 1, hold every node; on TPU and GPU:
  XLA:CPU's compile of it took 20 GB in a tree test): row by row, the
  region read as one slice, the path's W slots taken from it and written back at base with one
  dynamic-update-slice: every access a contiguous run of slots, which XLA:TPU does in place
  in the cache's own layout (an indexed scatter over slots, or a gather of slots from a row,
  made it copy the whole cache into another layout and back every step: a tree step on a v5e
  chip read 22x its cache's growth, kernels/results/tpu_bytes). Without it: on one device an
  indexed scatter of the W path slots over (row, slot) pairs; with `per_row`
  (`Lowering.row_writes`: a mesh) per row (vmapped over B) a gather of the W path slots and one
  dynamic-update-slice at base, so a batch split over a mesh's "data" axis stays split (the
  indexed scatter made XLA gather every row's entries to every device; on one device XLA
  copies the whole cache for the vmapped form: docs/measurements.md, 'Tree path move'). A
  sliding layers' ring is always scattered (its slots wrap)."""
  B, W = path.shape
  i = jnp.arange(W)[None]
  src = base[:, None] + jnp.where(i <= n[:, None], path, i)  # [B, W]
  b = jnp.arange(B)[:, None]
  dst = base[:, None] + i
  def row(buf, s, b0):  # buf [L, S, N, hd]
    return jax.lax.dynamic_update_slice(buf, jnp.take(buf, s, axis=1), (0, b0, 0, 0))

  move = jax.vmap(row, in_axes=(1, 0, 0), out_axes=1)

  def regions(x, src, base):  # x [L, B, S, N, hd]
    L, _, S, N, hd = x.shape
    R = min(region, S)
    for r in range(B):  # B static: a few rows
      start = jnp.minimum(base[r], S - R)
      tree_slots = jax.lax.dynamic_slice(x, (0, r, start, 0, 0), (L, 1, R, N, hd))
      path_slots = jnp.take(tree_slots, src[r] - start, axis=2)  # [L, 1, W, N, hd]
      x = jax.lax.dynamic_update_slice(x, path_slots, (0, r, base[r], 0, 0))
    return x

  def ring_row(buf, s, d):  # buf [L, R, N, hd], s and d ring slots [W]
    return buf.at[:, d].set(jnp.take(buf, s, axis=1))

  def compact(x, R):
    if R is not None:  # sliding layers' ring (`models.cache`): slot s at s mod R, scattered
      if per_row:  # per row as above (the batch's scatter permuted slots between devices)
        return jax.vmap(ring_row, in_axes=(1, 0, 0), out_axes=1)(x, src % R, dst % R)
      return x.at[:, b, dst % R].set(x[:, b, src % R])
    if region is not None:
      return regions(x, src, base)
    return move(x, src, base) if per_row else x.at[:, b, dst].set(x[:, b, src])

  return cache.map_kv(compact).replace(lengths=base + n + 1)


class TreeBounds(NamedTuple):
  """What verification needs of a tree: most children per node and its depth (a static tree,
  e.g. Medusa's, is not bound by `TreeParams`'s EAGLE-2 budget rules)."""

  top_k: int
  depth: int


@struct.dataclass
class Verified:
  """What one tree verification commits (every array per row)."""

  accepted: jax.Array  # [B] accepted drafts n
  path: jax.Array  # [B, d + 1] node indices of the accepted path, root first, 0-padded
  next: jax.Array  # [B] the token the target emits after the path
  target_cache: KVCache  # the path's KV compacted; lengths + n + 1
  emitted: jax.Array  # [B, d + 1] the n accepted tokens and `next`, then -1
  pend_tokens: jax.Array  # [B, d + 1] the n accepted tokens and `next` (then repeats)
  features: jax.Array | None  # [B, d + 1, Lf*Dt] target features on the path (when asked)
  hidden: jax.Array  # [B, D] the target's final hidden state at the path's end (it gave next)


def verify_tree(target_params, last, node_tok, parent, depth, target_cache: KVCache, key, *,
                target_config: LlamaLikeConfig, tree: TreeParams | TreeBounds,
                sampling: SamplingParams, feature_layers: tuple[int, ...] | None = None) -> Verified:
  """Score the tree [root=last, nodes] in one target forward (ancestor mask, depth-based
  positions), accept a path, compact the target cache. With `feature_layers`, also return the
  target's features of those layers at the path's nodes (an EAGLE head's next inputs)."""
  d = tree.depth
  B = node_tok.shape[0]
  Nt = target_cache.lengths
  tokens = jnp.concatenate([last[:, None], node_tok], axis=1)  # [B, n + 1]
  parent_full = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), parent], axis=1)
  depth_full = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), depth], axis=1)
  mask = ancestor_mask(parent_full, d)
  pos = Nt[:, None] + depth_full
  if feature_layers:
    h, tcache, feats = forward_features(target_params, tokens, pos, target_cache, mask,
                                        config=target_config, layers=feature_layers)
  else:
    h, tcache = forward(target_params, tokens, pos, target_cache, mask, config=target_config)
  tlogits = lm_head(target_params, h, config=target_config)  # [B, n + 1, V]
  if sampling.greedy:
    n, path, nxt = verify_tree_greedy(tokens, parent_full, tlogits, d)
  else:
    n, path, nxt = verify_tree_sampling(key, tokens, parent_full, probs(tlogits, sampling),
                                        tree.top_k, d)

  lw = lowering_of(target_params)
  tcache = compact_path(tcache, Nt, path, n, per_row=lw.row_writes,
                        region=tokens.shape[1] if lw.platform in ("gpu", "tpu") else None)
  path_tok = jnp.take_along_axis(tokens, path, axis=1)  # [B, d + 1], root first
  slot = jnp.arange(d + 1)[None]
  emitted = jnp.where(slot < n[:, None], jnp.pad(path_tok[:, 1:], ((0, 0), (0, 1))),
                      jnp.where(slot == n[:, None], nxt[:, None], -1))
  pend = jnp.where(slot < n[:, None], jnp.pad(path_tok[:, 1:], ((0, 0), (0, 1))),
                   nxt[:, None])  # accepted nodes, then the new last; padding repeats it
  path_feats = (jnp.take_along_axis(feats, path[..., None], axis=1) if feature_layers
                else None)
  end = jnp.take_along_axis(path, n[:, None], axis=1)  # [B, 1] the node that gave `next`
  end_hidden = jnp.take_along_axis(h, end[..., None], axis=1)[:, 0]
  return Verified(accepted=n, path=path, next=nxt, target_cache=tcache, emitted=emitted,
                  pend_tokens=pend.astype(jnp.int32), features=path_feats, hidden=end_hidden)
