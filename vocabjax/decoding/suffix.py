"""SuffixDecoding (Oliaro et al., NeurIPS 2025; Snowflake's Arctic Inference, vLLM's `method:
suffix`): drafts from suffix trees over each request's prompt and output and over earlier
requests' outputs, a proposer on the host (`SuffixProposer`).

Letters: B rows, D the trees' depth (`max_tree_depth`), m a match length, n drafted tokens.

A `SuffixTree` counts every n-gram of length <= D of the sequences it holds (Arctic's sliding
window): one tree per request over its prompt and output (`start` / `extend`), one global tree
over the outputs of earlier and running requests, at most `max_cached_requests` of them (oldest
evicted first). A step matches the context's suffixes of length m = 1, 2, .. and from each match
grows a chain following the most frequent child (`use_tree=False`, vLLM's default) or a tree best
first (`use_tree=True`); a token's probability is the product of count(child) / count(parent)
(float32, as Arctic's), growth stops at `min(max_spec_tokens, int(m * max_spec_factor +
max_spec_offset + 1e-6))` tokens or below `min_token_prob`, and the best sum of probabilities
wins (ties: the longer match, then the request's tree). Checked against Arctic Inference 0.3.0's
C++ tree (`tests/decoding/test_suffix.py`; ties broken differently, docs/suffix.md). Drafts are
deterministic, so the engine's verification keeps greedy identity and the target's law.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import types
from typing import Sequence

import numpy as np

from vocabjax.decoding.pld import chain_block
from vocabjax.decoding.proposer import Context, Counted, Drafts, RowHandover, padding_block
from vocabjax.decoding.tree import MAX_TREE_NODES, TreeBounds

F32 = np.float32


_NO_CHILDREN = types.MappingProxyType({})  # a leaf's (read-only: never filled)


class _Node:
  """A trie node. A leaf holds no containers of its own (children `_NO_CHILDREN`, order an empty
  tuple; both made with its first child): most nodes of a suffix trie are leaves, and every
  object the cyclic GC tracks makes its full passes over the process longer (3 a node
  otherwise)."""
  __slots__ = ("token", "count", "children", "order", "parent")

  def __init__(self, token: int, parent, count: int = 0):
    self.token, self.count, self.parent = token, count, parent
    self.children = _NO_CHILDREN  # token -> child, once it has one
    self.order = ()  # children by non-increasing count (Arctic's sibling list)


class SuffixTree:
  """Counts of every n-gram (n <= `max_depth`) of the sequences it holds (module doc)."""

  def __init__(self, max_depth: int = 64):
    if max_depth < 2:
      raise ValueError(f"max_tree_depth must be >= 2, got {max_depth}")
    self.max_depth = max_depth
    self.root = _Node(-1, None)
    self.seqs: dict[int, list[int]] = {}
    self._active: dict[int, list] = {}  # per sequence: its suffix nodes, shortest first

  def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
    """Append `tokens` to sequence `seq_id` (a new one when unknown)."""
    seq = self.seqs.setdefault(seq_id, [])
    # the nodes of the sequence's suffixes, shortest first, updated in place (no container
    # made per token: the cyclic GC's passes over a large tree follow allocations)
    active = self._active.setdefault(seq_id, [])
    root, depth = self.root, self.max_depth
    for tok in tokens:
      tok = int(tok)
      seq.append(tok)
      root.count += 1
      active.insert(0, root)
      if len(active) > depth:
        active.pop()
      for i in range(len(active)):
        node = active[i]
        child = node.children.get(tok)
        if child is None:  # a new child: count 1, at the end of the sibling list (Arctic's)
          if not node.order:  # its first: the containers made now
            node.children, node.order = {}, []
          child = node.children[tok] = _Node(tok, node, 1)
          node.order.append(child)
        else:
          _increment(child)
        active[i] = child

  def remove(self, seq_id: int) -> None:
    """Forget sequence `seq_id` (nothing when it holds no token): every n-gram occurrence of it
    decremented, a node whose count reaches 0 dropped from its parent."""
    seq = self.seqs.pop(seq_id, None)
    self._active.pop(seq_id, None)
    for start in range(len(seq or ())):
      _decrement(self.root)
      node = self.root
      for tok in seq[start:start + self.max_depth]:
        parent, node = node, node.children[tok]
        _decrement(node)
        if node.count == 0:
          del parent.children[tok]
          parent.order.remove(node)

  def match(self, context: Sequence[int]) -> _Node | None:
    node = self.root
    for tok in context:
      node = node.children.get(int(tok))
      if node is None:
        return None
    return node

  def speculate(self, context: Sequence[int], *, max_spec_tokens: int,
                max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                min_token_prob: float = 0.1, use_tree: bool = False,
                seq_id: int | None = None) -> "Proposal":
    """The best proposal over the context's suffix matches (module doc). `seq_id`: a sequence
    this tree holds that may end with the context (a request's own tree): where it does, the
    matches are its suffixes' nodes, kept by `extend`, instead of one walk from the root per
    match length (D^2 / 2 lookups a step)."""
    context = [int(t) for t in context]
    n = len(context)
    ends = None
    seq = self.seqs.get(seq_id) if seq_id is not None else None
    if seq and len(seq) >= n and seq[len(seq) - n:] == context:
      ends = self._active[seq_id]  # the node of the context's last m tokens: ends[m - 1]
    factor, offset, floor = F32(max_spec_factor), F32(max_spec_offset), F32(min_token_prob)
    grow = _tree if use_tree else _path
    best, best_m = ([], [], [], F32(0)), 0
    for m in range(1, n):
      if ends is not None:
        node = ends[m - 1] if m <= len(ends) else None
      else:
        node = self.match(context[n - m:])
      if node is None:  # every longer suffix is missing too (the trees hold every n-gram's)
        break
      limit = max(min(max_spec_tokens, int(float(F32(m) * factor + offset) + 1e-6)), 0)
      draft = grow(node, limit, floor)
      if draft[3] >= best[3]:  # ties: the longer match
        best, best_m = draft, m
    return Proposal(*best, match_len=best_m)


def _increment(node: _Node) -> None:
  """count + 1, moved in its parent's sibling list as Arctic's `_increment_count` moves it:
  before the group of its previous sibling's count when that count is at most count + 1."""
  parent = node.parent
  if parent is None:
    node.count += 1
    return
  order = parent.order
  i = 0 if order[0] is node else order.index(node)  # most increments: the first sibling
  if i == 0 or order[i - 1].count > node.count + 1:
    node.count += 1
    return
  head = order[i - 1].count
  j = next(k for k in range(i) if order[k].count == head)
  del order[i]
  node.count += 1
  order.insert(j, node)


def _decrement(node: _Node) -> None:
  """count - 1, moved as Arctic's `_decrement_count`: to the head of the next group when its
  next sibling has its count."""
  parent = node.parent
  if parent is None:
    node.count -= 1
    return
  order = parent.order
  i = order.index(node)
  c = node.count
  if i + 1 == len(order) or order[i + 1].count < c:
    node.count -= 1
    return
  del order[i]
  node.count -= 1
  j = next((k for k in range(i, len(order)) if order[k].count < c), len(order))
  order.insert(j, node)


@dataclasses.dataclass
class Proposal:
  """A suffix tree's proposal: tokens, each one's parent (index, -1: the root), its estimated
  probability (float32), their sum (`score`) and the match length it grew from."""

  tokens: list = dataclasses.field(default_factory=list)
  parents: list = dataclasses.field(default_factory=list)
  probs: list = dataclasses.field(default_factory=list)
  score: np.float32 = F32(0)
  match_len: int = 0


def _path(node: _Node, limit: int, floor: np.float32) -> tuple:
  """(tokens, parents, probs, score) of the chain that follows the most frequent child."""
  tokens, parents, probs, score = [], [], [], F32(0)
  prob = F32(1)
  while len(tokens) < limit and prob >= floor and node.order:
    child = node.order[0]
    prob = F32(prob * (F32(child.count) / F32(node.count)))
    if prob < floor:
      break
    parents.append(len(tokens) - 1)
    tokens.append(child.token)
    probs.append(prob)
    score = F32(score + prob)
    node = child
  return tokens, parents, probs, score


def _tree(node: _Node, limit: int, floor: np.float32) -> tuple:
  """(tokens, parents, probs, score), best first by probability (ties: the earlier pushed),
  children in sibling order."""
  tokens, parents, probs, score = [], [], [], F32(0)
  queue, pushed = [], 0
  for child in node.order:
    p = F32(F32(1) * F32(child.count) / F32(node.count))
    if p < floor:
      break
    heapq.heappush(queue, (-p, pushed, child, -1))
    pushed += 1
  while len(tokens) < limit and queue:
    negp, _, child, parent = heapq.heappop(queue)
    p = F32(-negp)
    parents.append(parent)
    tokens.append(child.token)
    probs.append(p)
    score = F32(score + p)
    me = len(tokens) - 1
    for grand in child.order:
      q = F32(F32(p * F32(grand.count)) / F32(child.count))
      if q < floor:
        break
      heapq.heappush(queue, (-q, pushed, grand, me))
      pushed += 1
  return tokens, parents, probs, score


class SuffixCache:
  """The request trees and the global tree (module doc)."""

  def __init__(self, max_tree_depth: int = 64, max_cached_requests: int = 10_000,
               global_tree: bool = True):
    if max_cached_requests == 0 or max_cached_requests < -1:
      raise ValueError(f"max_cached_requests={max_cached_requests}: the global tree holds at "
                       f"least one request's output (-1: no bound); global_tree=False turns "
                       f"it off")
    self.max_depth, self.max_cached = max_tree_depth, max_cached_requests
    self.global_tree = SuffixTree(max_tree_depth) if global_tree else None
    self.local: dict = {}
    self.cached: collections.OrderedDict = collections.OrderedDict()  # request -> seq id
    self._next_id = 0

  def start(self, request, prompt: Sequence[int], *, remember: bool = True) -> None:
    """A request's tree over its prompt; with `remember` its output goes into the global tree
    too (False: a throwaway request, e.g. a warm-up, that later requests must not draft from)."""
    if self.global_tree is not None and request in self.cached:
      self.global_tree.remove(self.cached.pop(request))
    tree = SuffixTree(self.max_depth)
    tree.extend(0, prompt)
    self.local[request] = tree
    if self.global_tree is not None and remember:
      self.cached[request] = self._next_id
      self._next_id += 1
      while self.max_cached != -1 and len(self.cached) > self.max_cached:
        oldest = next(iter(self.cached))
        self.global_tree.remove(self.cached.pop(oldest))

  def extend(self, request, tokens: Sequence[int]) -> None:
    """The request's new output tokens: into its tree and the global tree."""
    self.local[request].extend(0, tokens)
    if self.global_tree is not None and request in self.cached:
      self.global_tree.extend(self.cached[request], tokens)

  def stop(self, request) -> None:
    self.local.pop(request, None)

  def speculate(self, request, context: Sequence[int], **kw) -> Proposal:
    """The request tree's proposal, or the global tree's where it scores higher."""
    context = list(context)[-self.max_depth:]
    own = self.local[request].speculate(context, seq_id=0, **kw)
    if self.global_tree is None:
      return own
    other = self.global_tree.speculate(context, **kw)
    return own if own.score >= other.score else other


def check_suffix(max_tree_depth: int, max_spec_tokens: int, max_spec_factor: float,
                 max_spec_offset: float, min_token_prob: float,
                 max_cached_requests: int) -> None:
  """Refuse nonsense settings in one line naming the value."""
  if max_tree_depth < 2:
    raise ValueError(f"max_tree_depth must be >= 2, got {max_tree_depth}")
  if not 1 <= max_spec_tokens <= MAX_TREE_NODES:
    raise ValueError(f"max_spec_tokens must be in [1, {MAX_TREE_NODES}], got {max_spec_tokens}")
  if not 0 < max_spec_factor <= MAX_TREE_NODES:
    raise ValueError(f"max_spec_factor must be > 0 and at most {MAX_TREE_NODES} (drafts per "
                     f"matched token), got {max_spec_factor}")
  if not 0 <= max_spec_offset <= MAX_TREE_NODES:
    raise ValueError(f"max_spec_offset must be >= 0 and at most {MAX_TREE_NODES}, got "
                     f"{max_spec_offset}")
  if not 0.0 <= min_token_prob <= 1.0:
    raise ValueError(f"min_token_prob must lie in [0, 1], got {min_token_prob}")
  if max_cached_requests == 0 or max_cached_requests < -1:
    raise ValueError(f"max_cached_requests={max_cached_requests}: the global tree holds at "
                     f"least one request's output (-1: no bound)")


class SuffixProposer(RowHandover, Counted):
  """SuffixDecoding's drafts (module doc), found on the host before each step. Its trees live
  across `generate` calls: the global tree keeps the outputs of earlier requests (up to
  `max_cached_requests` of them), which is where repeated work (a revision of an answer, the
  same tool call filled again) pays."""

  method = "suffix"

  def __init__(self, *, max_tree_depth: int = 64, max_spec_tokens: int = 8,
               max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
               min_token_prob: float = 0.1, max_cached_requests: int = 10_000,
               use_tree: bool = False):
    check_suffix(max_tree_depth, max_spec_tokens, max_spec_factor, max_spec_offset,
                 min_token_prob, max_cached_requests)
    self.cache = SuffixCache(max_tree_depth, max_cached_requests)
    self.settings = dict(max_spec_tokens=max_spec_tokens, max_spec_factor=max_spec_factor,
                         max_spec_offset=max_spec_offset, min_token_prob=min_token_prob,
                         use_tree=use_tree)
    self.use_tree, self.params = use_tree, {}
    n = max_spec_tokens
    self.gamma = n
    # a tree of n nodes: at most n children per node and depth n
    self.bounds = TreeBounds(top_k=n, depth=n) if use_tree else None
    self.drafted_per_step, self.extra_slots = n, n + 1
    self.buckets = _buckets(n)
    self._rows: list = []  # the request each row of the running batch is
    self._seen: list = []  # tokens of each row already in its trees
    self._requests = 0
    self._remember = True  # requests' outputs go into the global tree (`untracked`)

  def key(self):
    return ("suffix", self.gamma, self.use_tree)

  def host_begin(self, history) -> None:
    """A new batch: a request per row, its tree over the prompt (the history but its first
    generated token, which `host_block` adds as output)."""
    self._rows, self._seen = [None] * len(history), [0] * len(history)
    for b, h in enumerate(history):
      self._start_row(b, h)

  def host_end(self, history) -> None:
    """The last step's tokens into the trees (the global tree keeps the whole output), then
    the request trees dropped."""
    for b, h in enumerate(history):
      self._end_row(b, h)
    self._rows, self._seen = [], []

  def remember(self, prompt: Sequence[int], output: Sequence[int]) -> None:
    """A request answered elsewhere (a recorded run being resumed) into the trees, as if it
    had been generated here: the global tree then holds what an uninterrupted run's held."""
    request, self._requests = self._requests, self._requests + 1
    self.cache.start(request, [int(t) for t in prompt])
    self.cache.extend(request, [int(t) for t in output])
    self.cache.stop(request)

  @contextlib.contextmanager
  def untracked(self):
    """Requests generated inside leave nothing in the global tree (a warm-up call's truncated
    output would otherwise be drafted from, and a resumed run could not know of it)."""
    self._remember = False
    try:
      yield self
    finally:
      self._remember = True

  def _start_row(self, b: int, h) -> None:
    """Row b's new request, its tree over the prompt (`h` but its first generated token)."""
    request, self._requests = self._requests, self._requests + 1
    self.cache.start(request, list(h[:-1]), remember=self._remember)
    self._rows[b], self._seen[b] = request, len(h) - 1

  def _end_row(self, b: int, h) -> None:
    """Row b's last tokens into the trees, its request tree dropped."""
    if self._rows[b] is not None:
      self.cache.extend(self._rows[b], [int(t) for t in h[self._seen[b]:]])
      self.cache.stop(self._rows[b])
      self._rows[b] = None


  def host_swap(self, b: int, ended, started) -> None:
    """Continuous batching: the ended prompt's request ended (as `host_end`), the started one's
    begun (as `host_begin`)."""
    while len(self._rows) <= b:
      self._rows.append(None)
      self._seen.append(0)
    if ended is not None:
      self._end_row(b, ended)
    if started is not None:
      self._start_row(b, started)

  def proposals(self, history, active) -> list[Proposal]:
    """Each active row's proposal (its new tokens added to its trees first; `Proposal()` for
    an inactive row)."""
    out = []
    for b, (h, a) in enumerate(zip(history, active)):
      if not a:
        out.append(Proposal())
        continue
      request = self._rows[b]
      self.cache.extend(request, [int(t) for t in h[self._seen[b]:]])
      self._seen[b] = len(h)
      out.append(self.cache.speculate(request, h, **self.settings))
    self.last = out
    return out

  def tree_block(self, proposals: list[Proposal]):
    """The proposals as one tree block (a chain is a one-branch tree): (tokens, parent, depth)
    [B, m] with m the smallest bucket that holds the largest (padding nodes are their own
    parents, at depth 1: never reached)."""
    counts = np.array([len(p.tokens) for p in proposals], np.int32)
    m = next(s for s in self.buckets if s >= int(counts.max(initial=0)))
    tok, parent, depth = padding_block(len(proposals), m)
    for b, p in enumerate(proposals):
      for j, (t, par) in enumerate(zip(p.tokens, p.parents)):
        tok[b, j], parent[b, j] = t, par + 1
        depth[b, j] = 1 if par < 0 else depth[b, par] + 1
    return (tok, parent, depth), counts

  def host_block(self, history, active):
    proposals = self.proposals(history, active)
    if self.use_tree:
      return self.tree_block(proposals)
    counts = np.array([len(p.tokens) for p in proposals], np.int32)
    block, n_valid = chain_block([p.tokens for p in proposals])
    block = _pad_to(block, next(s for s in self.buckets if s >= block.shape[1]))
    return (block, n_valid), counts

  def host_shapes(self, B: int = 1, sampling=None):
    if self.use_tree:
      return [((B, m),) * 3 for m in self.buckets]
    return [((B, m), (B,)) for m in self.buckets]

  def prefill(self, params, target_params, pre):
    return ()

  def propose(self, params, state, ctx: Context, key, *, sampling, keep=None):
    if self.use_tree:
      tok, parent, depth = ctx.host
      return Drafts(tokens=tok, parent=parent, depth=depth, bounds=self.bounds), state
    block, n_valid = ctx.host
    return Drafts(tokens=block, n_valid=n_valid), state

  def commit(self, params, state, ctx, drafts, verdict):
    return state

  def record_step(self, stats, active, counts, host_counts, keep) -> None:
    stats.add("match_len", [p.match_len if a else 0 for p, a in zip(self.last, active)])
    stats.add("score", [float(p.score) if a else 0.0 for p, a in zip(self.last, active)])

  def record(self, stats) -> dict:
    """Totals for an eval record: steps with a proposal, all verifications, the mean match
    length and proposal size over the steps with one."""
    rows = [(d, m) for dr, mr in zip(stats.drafted, stats.counts.get("match_len", []))
            for d, m in zip(dr, mr) if d]
    return {"matched_steps": len(rows), "verifications": len(stats.drafted),
            "mean_match_len": float(np.mean([m for _, m in rows])) if rows else 0.0,
            "mean_drafted": float(np.mean([d for d, _ in rows])) if rows else 0.0}


def _buckets(n: int) -> tuple[int, ...]:
  """Block sizes a step's drafts are padded to (0, 1, 2, 4, ..., n): a program per size met."""
  out, s = [0], 1
  while s < n:
    out.append(s)
    s *= 2
  return tuple(out + [n])


def _pad_to(block: np.ndarray, m: int) -> np.ndarray:
  out = np.zeros((block.shape[0], m), np.int32)
  out[:, :block.shape[1]] = block
  return out
