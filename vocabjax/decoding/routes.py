"""Exact sampling with n-gram merges: translated drafts as walks down a trie of drafter
spellings, verified level by level (cross-vocabulary drafting; the `exact` rule of
`vocabjax.decoding.crossvocab`).

Letters: V target vocabulary, Vd drafter vocabulary, m target tokens fed to the target.

OmniDraft's q'(x) = prod q(d_j) is the probability of one drafter spelling, not of the
translator proposing x, so its output drifts from p. Here every target token has one canonical
drafter spelling (its direct counterpart, else the first n-gram cache key that spells it); a
drafted position walks down the trie of cache keys from a drafter token d ~ q while the next
drafted token is a child, and proposes the node's target token (nothing the target can accept
where the node is nobody's canonical spelling). Each level is one choice among
branches whose drafter law is known exactly (q at the root; q of the next token over the node's
children, plus STOP), and the target's law is p's mass on the tokens whose spelling takes each
branch; a speculative-sampling decision per level makes the emitted token follow p exactly, by
induction over levels, whatever the drafter, cache or spelling. A walk cut short draws from p
within its node's subtree; the next position's root law is q without the stopping node's
children. Host-side numpy; the target's m + 1 probabilities come back once per step
(docs/crossvocab.md, 'Exactness').
"""

from __future__ import annotations

import dataclasses

import numpy as np

STOP = -1  # the branch "the walk stops at this node"


@dataclasses.dataclass(frozen=True)
class Position:
  """One drafted target position: drafter tokens ds[start:end] walked to `node`.

  complete: the walk ended at a node without children, or stopped because the next drafted
    token was not a child (`looked_ahead`: then ds[end] starts the next position, drawn from q
    without the node's children). Incomplete: the draft ended at a node with children.
  target: the target token the position proposes (None: the node spells no target token).
  fed: the target reads it (complete, with a target token whose canonical route is this node);
    only the positions before the first unfed one are verified as drafts.
  """

  start: int
  end: int
  node: tuple
  complete: bool
  looked_ahead: bool
  target: int | None
  fed: bool


class Routes:
  """The canonical routes of target tokens and the trie of cache keys (module doc)."""

  def __init__(self, d2t: np.ndarray, t2d: np.ndarray):
    self.d2t, self.t2d = np.asarray(d2t), np.asarray(t2d)
    self.Vd, self.V = self.d2t.size, self.t2d.size
    # [V]: the first drafter token of each target token's route; Vd = no route
    self.root = np.where(self.t2d >= 0, self.t2d, self.Vd).astype(np.int64)
    self.canon: dict[int, tuple] = {}  # target id -> its key, for tokens without a direct id
    self.children: dict[tuple, set] = {}  # trie node -> next drafter ids
    self.leaf: dict[tuple, int] = {}  # key -> target id
    self._members: dict[tuple, list] = {}  # node -> [(target id, branch)] of keyed routes
    self._arrays: dict[tuple, tuple] = {}  # members(node), built once per change of the node

  def add(self, key, target: int) -> None:
    """A cache entry: drafter ids `key` (2 or more) spell target token `target`."""
    key, target = tuple(int(i) for i in key), int(target)
    if len(key) < 2 or key in self.leaf:
      return
    self.leaf[key] = target
    for L in range(1, len(key)):
      self.children.setdefault(key[:L], set()).add(key[L])
    if self.t2d[target] >= 0 or target in self.canon:
      return  # the token already has its route; this key's node proposes it at no mass
    self.canon[target] = key
    self.root[target] = key[0]
    for L in range(1, len(key) + 1):
      self._members.setdefault(key[:L], []).append((target, key[L] if L < len(key) else STOP))
      self._arrays.pop(key[:L], None)

  def route(self, x: int) -> tuple | None:
    return (int(self.t2d[x]),) if self.t2d[x] >= 0 else self.canon.get(int(x))

  def target_of(self, node: tuple) -> int | None:
    if len(node) == 1:
      t = int(self.d2t[node[0]])
      return t if t >= 0 else None
    return self.leaf.get(node)

  def members(self, node: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(target ids, branch of each: a child drafter id or STOP) of the routes through `node`."""
    if node in self._arrays:
      return self._arrays[node]
    rows = list(self._members.get(node, ()))
    if len(node) == 1 and self.d2t[node[0]] >= 0:
      rows.append((int(self.d2t[node[0]]), STOP))
    if rows:
      xs, br = zip(*rows)
      arrays = np.asarray(xs, np.int64), np.asarray(br, np.int64)
    else:
      arrays = np.zeros(0, np.int64), np.zeros(0, np.int64)
    self._arrays[node] = arrays
    return arrays

  def plan(self, ds, nd: int | None = None) -> list[Position]:
    """Walk drafted drafter ids ds[:nd] into target positions (module doc). The list ends at
    the first position that is not fed (it is verified as far as it goes) or at the run's end."""
    ds = [int(d) for d in ds[:nd]]
    out, i = [], 0
    while i < len(ds):
      start, node = i, (ds[i],)
      complete, looked = True, False
      while node in self.children:
        if i + 1 >= len(ds):
          complete = False
          break
        if ds[i + 1] in self.children[node]:
          i += 1
          node += (ds[i],)
        else:
          looked = True
          break
      t = self.target_of(node)
      fed = complete and t is not None and self.route(t) == node
      out.append(Position(start, i + 1, node, complete, looked, t, fed))
      if not fed:
        break
      i += 1
    return out

  def verify(self, p: np.ndarray, positions: list[Position], ds, qs: np.ndarray,
             rng: np.random.Generator) -> tuple[int, int]:
    """Verify planned positions against the target's probabilities.

    p [m + 1, V]: the target's processed probabilities at the fed positions and the one after
    them (m = the fed positions); ds: the drafted drafter ids; qs [nd, Vd]: the drafter's law
    each of them was drawn from. Returns (accepted positions n, the next token): the first n
    fed positions' targets are kept and the next token follows them, distributed as p.
    """
    p = np.asarray(p, np.float64)
    excluded: set | None = None
    for j, pos in enumerate(positions):
      pj = p[j]
      q = np.asarray(qs[pos.start], np.float64)
      if excluded:
        q = q.copy()
        q[list(excluded)] = 0.0
        q /= q.sum()
      P = np.bincount(self.root, weights=pj, minlength=self.Vd + 1)
      Q = np.append(q, 0.0)
      b = int(ds[pos.start])
      if not _accept(rng, P[b], Q[b]):
        branch = _draw(rng, np.maximum(P - Q, 0.0), P)
        return j, _draw_in(rng, pj, np.flatnonzero(self.root == branch))
      node, k = (b,), pos.start
      while node in self.children:
        xs, br = self.members(node)
        kids = sorted(self.children[node])
        labels = np.asarray(kids + [STOP], np.int64)
        w = pj[xs]
        Pb = np.asarray([w[br == c].sum() for c in labels])
        if k + 1 >= pos.end and not pos.complete:  # cut short: the rest from p
          return j, _draw_in(rng, pj, xs)
        qn = np.asarray(qs[k + 1], np.float64)
        Qb = np.append(qn[kids], max(0.0, 1.0 - qn[kids].sum()))
        moved = k + 1 < pos.end
        drafted = len(kids) if not moved else kids.index(int(ds[k + 1]))
        if not _accept(rng, Pb[drafted], Qb[drafted] * Pb.sum()):
          c = labels[_draw(rng, np.maximum(Pb / max(Pb.sum(), 1e-300) - Qb, 0.0), Pb)]
          return j, _draw_in(rng, pj, xs[br == c])
        if not moved:
          break
        k += 1
        node += (int(ds[k]),)
      if not pos.fed:  # a node spelling nothing (or not canonically): p put no mass on it
        raise AssertionError(f"accepted an unfed position {pos}")
      excluded = self.children.get(node) if pos.looked_ahead else None
    m = sum(pos.fed for pos in positions)
    return m, _draw_in(rng, p[m], None)


def _accept(rng, P: float, Q: float) -> bool:
  """u < P / Q with u uniform, without dividing (Q > 0: the branch was drawn)."""
  return rng.random() * Q < P


def _draw(rng, weights: np.ndarray, fallback: np.ndarray) -> int:
  """An index drawn proportionally to `weights` (to `fallback` when they sum to 0, which
  happens only when P == Q at a rejection, an event of probability 0)."""
  w = weights if weights.sum() > 0 else fallback
  c = np.cumsum(w)
  return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(w) - 1))


def _draw_in(rng, pj: np.ndarray, ids: np.ndarray | None) -> int:
  """A token drawn from p restricted to `ids` (all tokens when None)."""
  if ids is None:
    return _draw(rng, pj, np.ones_like(pj))
  return int(ids[_draw(rng, pj[ids], np.ones(len(ids)))])
