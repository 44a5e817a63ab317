"""An independent drafter of the target's vocabulary: a chain (`chain`, Leviathan et al. 2023)
or an EAGLE-2 dynamic tree (`tree`, Li et al. 2024), optionally over a saved static subset of
the vocabulary (`subset`: VocabTrim / FR-Spec's file)."""

from __future__ import annotations

import dataclasses

from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import MAX_TREE_NODES, TreeParams
from vocabjax.errors import ConfigError
from vocabjax.methods import (check_sizing_table, check_subset_file, load_subset, model_blocks,
                              register, sizing_table_of, tree_params)


@dataclasses.dataclass(frozen=True)
class ChainParams:
  gamma: int = 3  # drafts per step (the default suite's)
  subset: str = ""  # a saved static vocabulary subset (.npz) for a trimmed drafter head
  self_sizing: bool = False  # each step's length (1..gamma) from step costs and acceptance
  sizing_table: str = ""  # per batch size, "1:4,8:0": B rows take the length of the largest
  #   batch size <= B every step (0: plain decoding's programs); others keep the rule

  def check(self, where: str) -> None:
    if not 1 <= self.gamma <= MAX_TREE_NODES:
      raise ConfigError(f"{where}: chain needs 1 <= gamma <= {MAX_TREE_NODES} (a step verifies "
                        f"gamma + 1 tokens as one block), got gamma={self.gamma}")
    check_subset_file(where, "chain", self.subset)
    check_sizing_table(where, "chain", self.sizing_table)


def chain_decoder(target, draft, gamma: int, draft_vocab, mesh=None, self_sizing=False,
                  sizing_table=None):
  """The engine with a chain drafter of `draft` (Models) under `draft_vocab`."""
  return SpeculativeEngine(
      model_blocks(target, mesh), target.config,
      ChainProposer(draft.params, draft.config, target.config, gamma=gamma,
                    draft_vocab=draft_vocab), mesh=mesh, self_sizing=self_sizing,
      sizing_table=sizing_table)


def tree_decoder(target, draft, tree: TreeParams, draft_vocab, mesh=None, self_sizing=False,
                 sizing_table=None):
  """The engine with an EAGLE-2 tree drafter of `draft` (Models) under `draft_vocab`."""
  return SpeculativeEngine(
      model_blocks(target, mesh), target.config,
      TreeProposer(model_blocks(draft, mesh), draft.config, target.config, tree=tree,
                   draft_vocab=draft_vocab), mesh=mesh, self_sizing=self_sizing,
      sizing_table=sizing_table)


@register("chain", ChainParams, drafter_passes=lambda p: p.gamma)
def _chain(target, draft, p: ChainParams, mesh=None):
  return chain_decoder(target, draft, p.gamma, load_subset(p.subset, target), mesh,
                       p.self_sizing, sizing_table_of(p.sizing_table))


@dataclasses.dataclass(frozen=True)
class TreeMethodParams:
  top_k: int = 2  # children per expanded node (the default suite's tree: 2, 4, 8)
  depth: int = 4  # levels below the root
  total_tokens: int = 8  # nodes verified besides the root
  subset: str = ""  # a saved static vocabulary subset (.npz)
  self_sizing: bool = False  # each step's tree (0, 1, 2, 4, .. nodes) from step costs and
  #   acceptance (tree_suffix: the suffix proposal's length; the drafter's tree kept)
  sizing_table: str = ""  # per batch size, "1:4,8:0": B rows take the length of the largest
  #   batch size <= B every step (0: plain decoding's programs); others keep the rule

  def check(self, where: str) -> None:
    tree_params(where, "tree", self.top_k, self.depth, self.total_tokens)
    check_subset_file(where, "tree", self.subset)
    check_sizing_table(where, "tree", self.sizing_table)


@register("tree", TreeMethodParams, drafter_passes=lambda p: p.depth)
def _tree_method(target, draft, p: TreeMethodParams, mesh=None):
  return tree_decoder(target, draft, TreeParams(p.top_k, p.depth, p.total_tokens),
                      load_subset(p.subset, target), mesh, p.self_sizing,
                      sizing_table_of(p.sizing_table))
