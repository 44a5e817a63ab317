"""Hybrids: a device tree (an EAGLE head's, a drafter model's) with a host tree merged into it
(prompt lookup's trie, SuffixDecoding's proposal) and verified in one target forward.

Letters: B rows, n device-tree nodes, m host-block nodes (a bucket of `buckets`).

A hybrid composes two parts, neither of which knows of the other:

    HostTreeHybrid(EagleProposer(...), LookupTrie(gamma=4))       # method "eagle_pld"
    HostTreeHybrid(EagleProposer(...), SuffixTrees(SuffixProposer()))  # "eagle_suffix"
    HostTreeHybrid(TreeProposer(...), SuffixTrees(SuffixProposer()))   # "tree_suffix"

the device part a `TreeGrower` (a proposer that grows a tree on the device), the host part a
`HostTree` (a tree built on the host under the root from the rows' committed tokens). Each step
the host part builds its tree (`host_block`: tokens, parent, depth [B, m], padded to a bucket; a
step program is compiled per bucket met), the device part grows its tree, `tree.merge_nodes`
merges the two (a host token the device also drafted under the same parent is one node) and the
target verifies both. A row the device part leaves undrafted (EAGLE's confidence gate, or a
suffix proposal scoring at least `score_threshold`) offers the host's nodes alone; where no row
drafts on the device, the step verifies the host trees alone (`fallback`). Every draft is a
deterministic function of the context, so greedy output is plain decoding's and sampling stays
lossless (`verify_tree_sampling`'s multi-draft rule). Vocabulary policies apply to the device
part (its `draft_vocab`).
"""

from __future__ import annotations

import abc
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from vocabjax.decoding.pld import check_lookup, trie_block
from vocabjax.decoding.proposer import (Context, Counted, Drafts, Gated, Prefilled, Profiled,
                                        RowHandover, TreeGrower)
from vocabjax.decoding.suffix import SuffixProposer
from vocabjax.decoding.tree import TreeBounds, merge_nodes
from vocabjax.sampling import SamplingParams


class HostTree(abc.ABC):
  """The host part of a hybrid: a tree under the root each step, from the committed tokens."""

  method: str  # its name in the hybrid's method (`eagle_` + this)
  counts: str = "lookup"  # the record's names for its nodes (`lookup_nodes`, `from_lookup`)
  buckets: tuple[int, ...]  # the host block's widths m (a step program per width met)
  children: int  # most children its tree gives a node
  depth: int  # its tree's depth
  nodes: int  # most nodes it adds
  gates: bool = False  # its block's fourth array [B] says which rows draft on the device too

  @abc.abstractmethod
  def key(self):
    """What its blocks' shapes and meaning depend on."""

  @abc.abstractmethod
  def host_block(self, history: Sequence[np.ndarray], active: np.ndarray) -> tuple:
    """((tokens, parent, depth [B, m][, device rows [B]]), per-row node counts)."""

  @abc.abstractmethod
  def host_shapes(self, B: int = 1) -> list:
    """Every block's array shapes, smallest first."""

  def host_begin(self, history) -> None:
    del history

  def host_end(self, history) -> None:
    del history

  def host_swap(self, b: int, ended, started) -> None:
    del b, ended, started

  def record_step(self, stats, active, counts, host_counts, keep) -> None:
    del stats, active, counts, host_counts, keep


class LookupTrie(HostTree):
  """Prompt lookup (Saxena 2023): each step the continuations of earlier occurrences of the
  context's suffix n-grams (`pld.lookup_continuations`: up to `candidates` of them, `gamma`
  tokens each) form a trie under the root, padded to a bucket of 0, gamma, .., candidates x
  gamma nodes. It keeps no row state."""

  method = "pld"

  def __init__(self, *, gamma: int = 4, max_ngram: int = 3, min_ngram: int = 1,
               candidates: int = 1):
    check_lookup(gamma, max_ngram, min_ngram, candidates)
    self.gamma, self.max_ngram, self.min_ngram = gamma, max_ngram, min_ngram
    self.candidates = candidates
    self.nodes = candidates * gamma
    self.buckets = tuple(range(0, self.nodes + 1, gamma))
    self.children, self.depth = candidates, gamma

  def key(self):
    return ("lookup", self.gamma, self.max_ngram, self.min_ngram, self.candidates)

  def host_block(self, history, active):
    tok, parent, depth, nodes = trie_block(history, active, self.gamma, self.max_ngram,
                                           self.min_ngram, self.candidates, self.buckets)
    return (tok, parent, depth), nodes

  def host_shapes(self, B: int = 1):
    return [((B, m), (B, m), (B, m)) for m in self.buckets]


class SuffixTrees(HostTree):
  """SuffixDecoding's proposal (the paper's hybrid with EAGLE): each step the suffix trees
  (`suffix.SuffixProposer`: the request's and the global one over earlier outputs) propose on
  the host. With `score_threshold`, a row whose proposal scores at least that (the sum of its
  tokens' estimated probabilities) takes it alone, without the device tree (the paper's rule:
  the suffix tree where it is confident, else the model)."""

  method = "suffix"
  counts = "suffix"

  def __init__(self, suffix: SuffixProposer | None = None,
               score_threshold: float | None = None):
    if score_threshold is not None and not score_threshold >= 0:
      raise ValueError(f"score_threshold must be >= 0 (a sum of probabilities), got "
                       f"{score_threshold}")
    self.suffix = suffix if suffix is not None else SuffixProposer()
    self.score_threshold = score_threshold
    self.gates = score_threshold is not None
    # a suffix tree's node may have up to n children, and it reaches depth n
    n = self.suffix.gamma
    self.buckets, self.children, self.depth, self.nodes = self.suffix.buckets, n, n, n

  def key(self):
    return ("suffix", self.suffix.key(), self.gates)

  def host_begin(self, history) -> None:
    self.suffix.host_begin(history)

  def host_end(self, history) -> None:
    self.suffix.host_end(history)

  def host_swap(self, b: int, ended, started) -> None:
    self.suffix.host_swap(b, ended, started)

  def host_block(self, history, active):
    proposals = self.suffix.proposals(history, active)
    arrays, counts = self.suffix.tree_block(proposals)
    if self.gates:  # rows that take the device tree too
      device = np.array([float(p.score) < self.score_threshold for p in proposals], np.int32)
      arrays = (*arrays, device)
    return arrays, counts

  def host_shapes(self, B: int = 1):
    extra = ((B,),) if self.gates else ()
    return [((B, m),) * 3 + extra for m in self.buckets]

  def record_step(self, stats, active, counts, host_counts, keep) -> None:
    self.suffix.record_step(stats, active, counts, host_counts, keep)


class HostTreeHybrid(RowHandover, Gated, Counted, Profiled):
  """A device tree (`device`, a `TreeGrower`) with a host tree (`host`, a `HostTree`) merged
  into it (module doc). One device: the host part's state is the host's."""

  def __init__(self, device: TreeGrower, host: HostTree):
    if not isinstance(device, TreeGrower) or device.gamma is not None:
      raise TypeError(f"a hybrid merges a host tree into a device tree; "
                      f"{type(device).__name__} ({device.method}) does not grow one")
    self.host = host
    self.method = f"{device.method}_{host.method}"
    tree = device.tree
    self.bounds = TreeBounds(top_k=tree.top_k + host.children, depth=max(tree.depth, host.depth))
    self.device = device.pending(self.bounds.depth + 1)  # the merged tree's accepted + next
    self.tree = tree
    self.gated = device.gated or host.gates
    self.drafted_per_step = tree.total_tokens + host.nodes
    self.extra_slots = tree.total_tokens + host.nodes + tree.draft_slots + self.bounds.depth + 2
    self.feature_layers = device.feature_layers
    self.draft_block_calls = device.draft_block_calls

  # --- the device part's weights, caches and state --------------------------------------------

  @property
  def params(self):
    return self.device.params

  @params.setter
  def params(self, value):
    self.device.params = value

  @property
  def draft_vocab(self):
    return self.device.draft_vocab

  def key(self):
    return ("hybrid", self.device.key(), self.host.key(), self.bounds)

  def caches(self) -> dict:
    return self.device.caches()

  def prepare(self, *, layout: str, lowering, mesh=None) -> None:
    self.device.prepare(layout=layout, lowering=lowering, mesh=mesh)

  def prefill_lowering(self, target, base):
    return self.device.prefill_lowering(target, base)

  def place(self, mesh, target_config) -> None:
    raise ValueError(f"{self.method} runs on one device (its {self.host.method} drafts are the "
                     f"host's): mesh is not supported")

  def prefill(self, params, target_params, pre: Prefilled):
    return self.device.prefill(params, target_params, pre)

  # --- a step ---------------------------------------------------------------------------------

  def gate(self, params, state, ctx: Context):
    keep, pre = self.device.gate(params, state, ctx)
    if self.host.gates:
      use = ctx.host[3] > 0
      keep = use if keep is None else keep & use
    return keep, pre

  def propose(self, params, pre, ctx: Context, key, *, sampling: SamplingParams, keep=None):
    del key, sampling  # deterministic drafts
    tok, parent, depth, carry = self.device.grow(params, pre, keep)
    n_device = tok.shape[1]
    tok, parent, depth = merge_nodes(tok, parent, depth, *ctx.host[:3])
    return (Drafts(tokens=tok, parent=parent, depth=depth, bounds=self.bounds,
                   host_from=n_device), carry)

  def fallback(self, params, pre, ctx: Context):
    """No row drafts on the device: the host trees alone (a tree of merge_nodes's form already;
    the roots alone where there is none)."""
    tok, parent, depth = ctx.host[:3]
    return (Drafts(tokens=tok, parent=parent, depth=depth, host_from=0,
                   bounds=TreeBounds(min(self.bounds.top_k, tok.shape[1] + 1),
                                     self.bounds.depth)), self.device.skip(pre))

  def commit(self, params, carry, ctx: Context, drafts: Drafts, verdict):
    return self.device.commit(params, carry, ctx, drafts, verdict)

  # --- the host part --------------------------------------------------------------------------

  def host_block(self, history, active):
    return self.host.host_block(history, active)

  def host_shapes(self, B: int = 1, sampling=None):
    return self.host.host_shapes(B)

  def host_begin(self, history) -> None:
    self.host.host_begin(history)

  def host_end(self, history) -> None:
    self.host.host_end(history)

  def host_swap(self, b: int, ended, started) -> None:
    self.host.host_swap(b, ended, started)

  # --- counts ---------------------------------------------------------------------------------

  def step_count_names(self):
    return ("from_lookup",)

  def step_counts(self, drafts: Drafts, verdict) -> tuple:
    # path: node + 1, 0-padded; nodes from host_from on came from the host block
    return ((verdict.path > drafts.host_from).sum(axis=1).astype(jnp.int32),)

  def drafted_counts(self, active, counts, host_counts, keep):
    device = keep if keep is not None else [True] * len(active)
    return [self.tree.total_tokens * bool(h) + int(x) if a else 0
            for x, a, h in zip(host_counts, active, device)]

  def record_step(self, stats, active, counts, host_counts, keep) -> None:
    device = keep if keep is not None else [True] * len(active)
    stats.add("lookup_nodes", [int(x) if a else 0 for x, a in zip(host_counts, active)])
    stats.add("from_lookup", [int(x) if a else 0 for x, a in zip(counts["from_lookup"], active)])
    stats.add("head", [bool(h) if a else False for h, a in zip(device, active)])
    self.host.record_step(stats, active, counts, host_counts, keep)

  def record(self, stats) -> dict:
    """Totals for an eval record: steps with host nodes, tokens accepted from them, steps where
    the device part drafted, all verifications (named after the host part's `counts`)."""
    c, name = stats.counts, self.host.counts
    return {f"{name}_steps": sum(1 for row in c["lookup_nodes"] for x in row if x),
            f"{name}_nodes": sum(map(sum, c["lookup_nodes"])),
            f"accepted_from_{name}": sum(map(sum, c["from_lookup"])),
            "accepted": sum(map(sum, stats.accepted)),
            "head_steps": sum(map(sum, c["head"])), "verifications": len(stats.drafted)}

  # --- the device part's time split (`Profiled`) ---------------------------------------------

  @property
  def head_rows(self) -> int:
    return self.device.head_rows

  @property
  def head_policy(self):
    return self.device.head_policy

  def drafter_calls(self):
    return self.device.drafter_calls()

  def drafter_body(self):
    return self.device.drafter_body()

  def draft_width(self) -> int:
    return self.device.draft_width()
