"""Drafts without a drafter model: prompt lookup (`pld`, Saxena 2023) and a fixed n-gram
table fit on a corpus (`ngram`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vocabjax.decoding.ngram import NgramProposer, table_from
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import MAX_TREE_NODES
from vocabjax.errors import ConfigError
from vocabjax.methods import model_blocks, register


@dataclasses.dataclass(frozen=True)
class PldParams:
  gamma: int = 4  # most drafts per step (per branch)
  max_ngram: int = 3  # longest context n-gram matched
  min_ngram: int = 1  # shortest
  candidates: int = 1  # continuations of that many matches merged into a tree (1: a chain)
  self_sizing: bool = False  # each step's draft length from step costs and acceptance

  def check(self, where: str) -> None:
    if (not 1 <= self.gamma <= MAX_TREE_NODES or not 1 <= self.min_ngram <= self.max_ngram
        or not 1 <= self.candidates <= MAX_TREE_NODES):
      raise ConfigError(f"{where}: pld needs 1 <= gamma <= {MAX_TREE_NODES}, 1 <= min_ngram <= "
                        f"max_ngram and 1 <= candidates <= {MAX_TREE_NODES}, got "
                        f"gamma={self.gamma}, min_ngram={self.min_ngram}, "
                        f"max_ngram={self.max_ngram}, candidates={self.candidates}")


@register("pld", PldParams, needs_draft=False, drafter_passes=lambda p: 0, timed=False)
def _pld(target, draft, p: PldParams, mesh=None):
  """Prompt lookup decoding (Saxena 2023): drafts copied from the context, no drafter; a
  chain, or a tree of several matches' continuations (`candidates` > 1)."""
  del draft
  return SpeculativeEngine(
      model_blocks(target, mesh), target.config,
      LookupProposer(gamma=p.gamma, max_ngram=p.max_ngram, min_ngram=p.min_ngram,
                     candidates=p.candidates), mesh=mesh, self_sizing=p.self_sizing)


@dataclasses.dataclass(frozen=True)
class NgramParams:
  corpus: str  # a text file the table is fit on (one document per line; .jsonl: its "text")
  n: int = 3  # contexts of up to n - 1 tokens
  gamma: int = 4  # most drafts per step
  self_sizing: bool = False  # each step's draft length from step costs and acceptance

  def check(self, where: str) -> None:
    if self.n < 2 or not 1 <= self.gamma <= MAX_TREE_NODES:
      raise ConfigError(f"{where}: ngram needs n >= 2 and 1 <= gamma <= {MAX_TREE_NODES}, got "
                        f"n={self.n}, gamma={self.gamma}")
    if not Path(self.corpus).is_file():
      raise ConfigError(f"{where}: ngram.corpus={self.corpus!r}: no such file (a text file, "
                        f"one document per line, or a .jsonl with a \"text\" field)")


@register("ngram", NgramParams, needs_draft=False, drafter_passes=lambda p: 0, timed=False)
def _ngram(target, draft, p: NgramParams, mesh=None):
  """Drafts walked from an n-gram table fit on a corpus (`decoding.ngram`), no drafter."""
  del draft
  if target.tokenizer is None:
    raise ValueError(f"{target.source} has no tokenizer to encode the ngram corpus with")
  table = table_from(p.corpus, target.tokenizer, n=p.n)
  return SpeculativeEngine(model_blocks(target, mesh), target.config,
                           NgramProposer(table, gamma=p.gamma), mesh=mesh,
                           self_sizing=p.self_sizing)
