"""Hybrids: a device tree (an EAGLE head's, a drafter model's) with a host tree merged into it
(prompt lookup's trie, SuffixDecoding's proposal) and verified in one target forward.

Letters: B rows, n device-tree nodes, m host-block nodes (a bucket of `buckets`).

Each step the host hook builds its tree under the root (`host_block`: tokens, parent, depth
[B, m], padded to a bucket; a step program is compiled per bucket met), the device proposer
grows its tree, `tree.merge_nodes` merges the two (a host token the device also drafted under
the same parent is one node) and the target verifies both. A row the device proposer leaves
undrafted (EAGLE's confidence gate, or a suffix proposal scoring at least `score_threshold`)
offers the host's nodes alone; where no row drafts on the device, the step verifies the host
trees alone (`fallback`). Every draft is a deterministic function of the context, so greedy
output is plain decoding's and sampling stays lossless (`verify_tree_sampling`'s multi-draft
rule). Vocabulary policies apply to the device part (its proposer's `draft_vocab`).

A hybrid is a mixin before its device proposer in the bases:

    class EagleSuffixProposer(SuffixHybrid, EagleProposer): ...
    class TreeSuffixProposer(SuffixHybrid, TreeProposer): ...

The device proposer supplies `tree` (TreeParams), `pend_width` (the pending block its state
holds: the merged tree's depth + 1), `gate`, `_grow(params, pre, keep) -> (tokens, parent,
depth, its state for `commit`)` and `_skip(pre) -> its state when it grew nothing`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from vocabjax.decoding.drafter import DraftVocab, TreeProposer
from vocabjax.decoding.pld import check_lookup, trie_block
from vocabjax.decoding.proposer import Context, Counted, Drafts, RowHandover
from vocabjax.decoding.suffix import SuffixProposer
from vocabjax.decoding.tree import TreeBounds, TreeParams, merge_nodes
from vocabjax.sampling import SamplingParams


class HostTreeHybrid(RowHandover, Counted):
  """A device tree with the host block's tree merged in (module doc); counts named `lookup`."""

  # continuous batching: a lookup trie keeps no row state; the suffix trees hand rows over

  def _host_tree(self, buckets, *, children: int, depth: int, nodes: int) -> None:
    """The merged tree's sizes when the host block adds up to `nodes` nodes, `children` under a
    node and `depth` levels to the device tree (padded to one of `buckets`)."""
    tree = self.tree
    self.buckets = buckets
    self.bounds = TreeBounds(top_k=tree.top_k + children, depth=max(tree.depth, depth))
    self.pend_width = self.bounds.depth + 1
    self.drafted_per_step = tree.total_tokens + nodes
    self.extra_slots = tree.total_tokens + nodes + tree.draft_slots + self.bounds.depth + 2

  def propose(self, params, pre, ctx: Context, key, *, sampling: SamplingParams, keep=None):
    del key, sampling  # deterministic drafts
    tok, parent, depth, carry = self._grow(params, pre, keep)
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
                                     self.bounds.depth)), self._skip(pre))

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

  def record(self, stats) -> dict:
    """Totals for an eval record: steps with host nodes, tokens accepted from them, steps where
    the device proposer drafted, all verifications."""
    c = stats.counts
    return {"lookup_steps": sum(1 for row in c["lookup_nodes"] for x in row if x),
            "lookup_nodes": sum(map(sum, c["lookup_nodes"])),
            "accepted_from_lookup": sum(map(sum, c["from_lookup"])),
            "accepted": sum(map(sum, stats.accepted)),
            "head_steps": sum(map(sum, c["head"])), "verifications": len(stats.drafted)}


class LookupHybrid(HostTreeHybrid):
  """Prompt lookup (Saxena 2023) merged into the device tree: each step, on the host, the
  continuations of earlier occurrences of the context's suffix n-grams
  (`pld.lookup_continuations`: up to `candidates` of them, `gamma` tokens each) form a trie
  under the root, padded to a bucket of 0, gamma, .., candidates x gamma nodes."""

  def _lookup(self, *, gamma: int, max_ngram: int, min_ngram: int, candidates: int) -> None:
    check_lookup(gamma, max_ngram, min_ngram, candidates)
    self.gamma, self.max_ngram, self.min_ngram = gamma, max_ngram, min_ngram
    self.candidates = candidates
    m = candidates * gamma
    self._host_tree(tuple(range(0, m + 1, gamma)), children=candidates, depth=gamma, nodes=m)

  def key(self):
    return (super().key(), "lookup", self.bounds)

  def host_block(self, history, active):
    tok, parent, depth, nodes = trie_block(history, active, self.gamma, self.max_ngram,
                                           self.min_ngram, self.candidates, self.buckets)
    return (tok, parent, depth), nodes

  def host_shapes(self, B: int = 1, sampling=None):
    return [((B, m), (B, m), (B, m)) for m in self.buckets]


class SuffixHybrid(HostTreeHybrid):
  """SuffixDecoding's proposal merged into the device tree (the paper's hybrid with EAGLE):
  each step the suffix trees (`suffix.SuffixProposer`: the request's and the global one over
  earlier outputs) propose on the host. With `score_threshold`, a row whose suffix proposal
  scores at least that (the sum of its tokens' estimated probabilities) takes the suffix
  proposal alone, without the device tree (the paper's rule: the suffix tree where it is
  confident, else the model)."""

  def place(self, mesh, target_config) -> None:
    raise ValueError(f"{self.method} runs on one device (its suffix trees are the host's): "
                     f"mesh is not supported")

  def _suffix(self, suffix: SuffixProposer | None, score_threshold: float | None) -> None:
    if score_threshold is not None and not score_threshold >= 0:
      raise ValueError(f"score_threshold must be >= 0 (a sum of probabilities), got "
                       f"{score_threshold}")
    self.suffix = suffix if suffix is not None else SuffixProposer()
    n = self.suffix.gamma
    self.score_threshold = score_threshold
    self.gated = self.gated or score_threshold is not None
    # a suffix tree's node may have up to n children, and it reaches depth n
    self._host_tree(self.suffix.buckets, children=n, depth=n, nodes=n)

  def key(self):
    return (super().key(), "suffix", self.bounds, self.suffix.key(),
            self.score_threshold is not None)

  def host_begin(self, history) -> None:
    self.suffix.host_begin(history)

  def host_end(self, history) -> None:
    self.suffix.host_end(history)

  def host_swap(self, b: int, ended, started) -> None:
    self.suffix.host_swap(b, ended, started)

  def host_block(self, history, active):
    proposals = self.suffix.proposals(history, active)
    arrays, counts = self.suffix.tree_block(proposals)
    if self.score_threshold is not None:  # rows that take the device tree too
      device = np.array([float(p.score) < self.score_threshold for p in proposals], np.int32)
      arrays = (*arrays, device)
    return arrays, counts

  def host_shapes(self, B: int = 1, sampling=None):
    extra = ((B,),) if self.score_threshold is not None else ()
    return [((B, m),) * 3 + extra for m in self.buckets]

  def gate(self, params, state, ctx: Context):
    keep, pre = super().gate(params, state, ctx)
    if self.score_threshold is not None:
      use = ctx.host[3] > 0
      keep = use if keep is None else keep & use
    return keep, pre

  def record_step(self, stats, active, counts, host_counts, keep) -> None:
    super().record_step(stats, active, counts, host_counts, keep)
    self.suffix.record_step(stats, active, counts, host_counts, keep)

  def record(self, stats) -> dict:
    out = super().record(stats)
    out["suffix_nodes"] = out.pop("lookup_nodes")
    out["suffix_steps"] = out.pop("lookup_steps")
    out["accepted_from_suffix"] = out.pop("accepted_from_lookup")
    return out


class TreeSuffixProposer(SuffixHybrid, TreeProposer):
  """A drafter model's EAGLE-2 tree (`drafter.TreeProposer`, under its vocabulary policy) with
  SuffixDecoding's proposal merged in (`SuffixHybrid`)."""

  method = "tree_suffix"

  def __init__(self, draft_params, draft_config, target_config, *,
               tree: TreeParams = TreeParams(), suffix: SuffixProposer | None = None,
               score_threshold: float | None = None, draft_vocab: DraftVocab | None = None,
               draft_prefill: str = "bf16"):
    TreeProposer.__init__(self, draft_params, draft_config, target_config, tree=tree,
                          draft_vocab=draft_vocab, draft_prefill=draft_prefill)
    self._suffix(suffix, score_threshold)
