"""Prompt lookup (`pld`, Saxena 2023): drafts copied from the context, no drafter model."""

from __future__ import annotations

import dataclasses

from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import MAX_TREE_NODES
from vocabjax.errors import ConfigError
from vocabjax.methods import check_sizing_table, model_blocks, register, sizing_table_of


@dataclasses.dataclass(frozen=True)
class PldParams:
  gamma: int = 4  # most drafts per step (per branch)
  max_ngram: int = 3  # longest context n-gram matched
  min_ngram: int = 1  # shortest
  candidates: int = 1  # continuations of that many matches merged into a tree (1: a chain)
  self_sizing: bool = False  # each step's draft length from step costs and acceptance
  sizing_table: str = ""  # per batch size, "1:4,8:0": B rows take the length of the largest
  #   batch size <= B every step (0: plain decoding's programs); others keep the rule

  def check(self, where: str) -> None:
    if (not 1 <= self.gamma <= MAX_TREE_NODES or not 1 <= self.min_ngram <= self.max_ngram
        or not 1 <= self.candidates <= MAX_TREE_NODES):
      raise ConfigError(f"{where}: pld needs 1 <= gamma <= {MAX_TREE_NODES}, 1 <= min_ngram <= "
                        f"max_ngram and 1 <= candidates <= {MAX_TREE_NODES}, got "
                        f"gamma={self.gamma}, min_ngram={self.min_ngram}, "
                        f"max_ngram={self.max_ngram}, candidates={self.candidates}")
    check_sizing_table(where, "pld", self.sizing_table)


@register("pld", PldParams, needs_draft=False, drafter_passes=lambda p: 0, timed=False)
def _pld(target, draft, p: PldParams, mesh=None):
  """Prompt lookup decoding (Saxena 2023): drafts copied from the context, no drafter; a
  chain, or a tree of several matches' continuations (`candidates` > 1)."""
  del draft
  return SpeculativeEngine(
      model_blocks(target, mesh), target.config,
      LookupProposer(gamma=p.gamma, max_ngram=p.max_ngram, min_ngram=p.min_ngram,
                     candidates=p.candidates), mesh=mesh, self_sizing=p.self_sizing,
      sizing_table=sizing_table_of(p.sizing_table))
