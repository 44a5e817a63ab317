"""SuffixDecoding (`suffix`, Oliaro et al. 2025), and merged into a drafter's tree
(`tree_suffix`)."""

from __future__ import annotations

import dataclasses

from vocabjax.decoding.drafter import TreeProposer
from vocabjax.decoding.hybrid import HostTreeHybrid, SuffixTrees
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.suffix import SuffixProposer, check_suffix
from vocabjax.decoding.tree import TreeParams
from vocabjax.errors import ConfigError
from vocabjax.methods import (check_sizing_table, load_subset, model_blocks, register,
                              sizing_table_of)
from vocabjax.methods.drafter import TreeMethodParams


@dataclasses.dataclass(frozen=True)
class SuffixParams:
  max_spec_tokens: int = 8  # most drafts per step
  max_spec_factor: float = 1.0  # drafts per matched context token
  max_spec_offset: float = 0.0  # drafts added to that
  min_token_prob: float = 0.1  # a draft's estimated probability must reach it
  max_tree_depth: int = 64  # the trees' n-grams: at most this long
  max_cached_requests: int = 10_000  # earlier outputs the global tree keeps (-1: all)
  use_tree: bool = False  # a tree of continuations (best first) instead of one chain
  self_sizing: bool = False  # each step's draft length from step costs and acceptance
  sizing_table: str = ""  # per batch size, "1:4,8:0": B rows take the length of the largest
  #   batch size <= B every step (0: plain decoding's programs); others keep the rule

  def check(self, where: str) -> None:
    check_sizing_table(where, "suffix", self.sizing_table)
    try:
      check_suffix(self.max_tree_depth, self.max_spec_tokens, self.max_spec_factor,
                   self.max_spec_offset, self.min_token_prob, self.max_cached_requests)
    except ValueError as e:
      raise ConfigError(f"{where}: suffix: {e}") from None

  def proposer(self) -> SuffixProposer:
    """The SuffixProposer of these settings (`self_sizing` is the engine's, not its)."""
    return SuffixProposer(**{k: v for k, v in dataclasses.asdict(self).items()
                             if k not in ("self_sizing", "sizing_table")})


@register("suffix", SuffixParams, needs_draft=False, drafter_passes=lambda p: 0, timed=False)
def _suffix(target, draft, p: SuffixParams, mesh=None):
  """SuffixDecoding (`decoding.suffix`): drafts from suffix trees over the request and over
  earlier outputs (kept across the decoder's requests), no drafter."""
  del draft
  return SpeculativeEngine(model_blocks(target, mesh), target.config, p.proposer(), mesh=mesh,
                           self_sizing=p.self_sizing, sizing_table=sizing_table_of(p.sizing_table))


@dataclasses.dataclass(frozen=True)
class SuffixHybridParams:
  """SuffixDecoding's settings in a hybrid with a device tree (a drafter model's, an EAGLE
  head's), after the device tree's own fields (a mixin before them in the bases)."""

  max_spec_tokens: int = 8  # SuffixDecoding's most drafts per step
  max_spec_factor: float = 1.0
  max_spec_offset: float = 0.0
  min_token_prob: float = 0.1
  max_tree_depth: int = 64
  max_cached_requests: int = 10_000
  score_threshold: float = -1.0  # >= 0: a suffix proposal scoring that much drafts alone

  def _suffix_params(self) -> SuffixParams:
    return SuffixParams(self.max_spec_tokens, self.max_spec_factor, self.max_spec_offset,
                        self.min_token_prob, self.max_tree_depth, self.max_cached_requests)

  def check(self, where: str) -> None:
    super().check(where)
    self._suffix_params().check(where)

  def suffix(self) -> SuffixProposer:
    return self._suffix_params().proposer()

  def host_tree(self) -> SuffixTrees:
    """The hybrid's host part: these suffix trees, with the score threshold."""
    return SuffixTrees(self.suffix(), self.threshold)

  @property
  def threshold(self) -> float | None:
    return None if self.score_threshold < 0 else self.score_threshold


@dataclasses.dataclass(frozen=True)
class TreeSuffixParams(SuffixHybridParams, TreeMethodParams):
  """The drafter's tree's fields, then SuffixDecoding's (`SuffixHybridParams`)."""


@register("tree_suffix", TreeSuffixParams, drafter_passes=lambda p: p.depth)
def _tree_suffix(target, draft, p: TreeSuffixParams, mesh=None):
  """The drafter model's EAGLE-2 tree with SuffixDecoding's proposal merged into it (or, with
  `score_threshold`, alone where it scores that much), one verification
  (`hybrid.HostTreeHybrid` of a `TreeProposer` and `SuffixTrees`); one device."""
  if mesh is not None:
    raise ValueError("tree_suffix runs on one device (its suffix trees are the host's)")
  return SpeculativeEngine(
      model_blocks(target, mesh), target.config,
      HostTreeHybrid(TreeProposer(model_blocks(draft, mesh), draft.config, target.config,
                                  tree=TreeParams(p.top_k, p.depth, p.total_tokens),
                                  draft_vocab=load_subset(p.subset, target)),
                     p.host_tree()), self_sizing=p.self_sizing,
      sizing_table=sizing_table_of(p.sizing_table))
