"""Medusa-1 heads (`medusa`, Cai et al. 2024) drafting a static tree of top-k ranks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vocabjax.calibrate.select import load_or_select
from vocabjax.checkpoints.medusa import load_medusa
from vocabjax.decoding.medusa import MedusaProposer, medusa_choices_for
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.errors import ConfigError
from vocabjax.methods import check_subset_file, load_subset, local_path, model_blocks, register
from vocabjax.models.medusa import medusa_tree
from vocabjax.vocab.subset import VocabSubset


# Medusa-1 heads trained for the target (`python -m vocabjax.train.medusa`, or Medusa's own
# checkpoints) draft a static tree of top-k ranks (`choices`: Medusa's `medusa_choices` as JSON,
# or every path of ranks < top_k down to `depth`); `subset` / `counts` + `k` restrict every
# head's projection to K tokens (FR-Spec / VocabTrim on Medusa).

def _medusa_meta(path: str, where: str) -> dict:
  import json

  path = local_path(path, "medusa", where)
  try:
    raw = json.loads((Path(path) / "config.json").read_text())
    return {"heads": int(raw["medusa_num_heads"]), "vocab": raw.get("vocab_size"),
            "hidden": raw.get("hidden_size")}
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"{where}: medusa.heads={path!r} is not a Medusa head directory "
                      f"(config.json with medusa_num_heads): {e}") from None


@dataclasses.dataclass(frozen=True)
class MedusaParams:
  heads: str  # a Medusa head directory
  choices: str = ""  # JSON list of rank paths, e.g. "[[0], [1], [0, 0]]"; "" builds a full tree
  top_k: int = 1  # the full tree's ranks per head ("" choices)
  depth: int = 0  # the full tree's depth (0: every head)
  subset: str = ""  # a saved static subset restricting every head's projection
  counts: str = ""  # or a counts file: its k most frequent tokens (+ special tokens)
  k: int = 0

  def tree_choices(self, num_heads: int) -> list:
    import json

    if self.choices:
      return json.loads(self.choices)
    return medusa_choices_for(self.depth or num_heads, self.top_k)

  def check(self, where: str) -> None:
    meta = _medusa_meta(self.heads, where)
    if self.top_k < 1 or self.depth < 0:
      raise ConfigError(f"{where}: medusa needs top_k >= 1 and depth >= 0, got top_k="
                        f"{self.top_k}, depth={self.depth}")
    try:
      tree = medusa_tree(self.tree_choices(meta["heads"]), meta["heads"])
    except (ValueError, TypeError) as e:  # MedusaError and malformed JSON are ValueErrors
      raise ConfigError(f"{where}: medusa.choices: {e}") from None
    if self.subset and self.counts:
      raise ConfigError(f"{where}: medusa takes a subset or counts + k, not both")
    check_subset_file(where, "medusa", self.subset)
    if self.counts:
      V = meta["vocab"] or 0
      if not 1 <= self.k <= (V or self.k):
        raise ConfigError(f"{where}: medusa.k={self.k} must be in [1, V={V}] with counts")
      if self.k < tree.top_k:
        raise ConfigError(f"{where}: medusa.k={self.k} is smaller than the tree's top_k="
                          f"{tree.top_k}")
      if not Path(self.counts).is_file():
        raise ConfigError(f"{where}: medusa.counts={self.counts!r}: no such file")
    elif self.k:
      raise ConfigError(f"{where}: medusa.k={self.k} needs counts (a subset file has its own K)")


def _medusa_rows(p: MedusaParams) -> int:
  meta = _medusa_meta(p.heads, "medusa")
  K = p.k if p.counts else (VocabSubset.load(local_path(p.subset, "file")).size if p.subset
                            else meta["vocab"])
  return meta["heads"] * int(K or 0)


def _medusa_params(p: MedusaParams) -> int:
  meta = _medusa_meta(p.heads, "medusa")
  D = int(meta["hidden"] or 0)
  return meta["heads"] * (D * D + D) + _medusa_rows(p) * D


@register("medusa", MedusaParams, needs_draft=False, drafter_passes=lambda p: 1,
          head_rows=_medusa_rows, drafter_params=_medusa_params)
def _medusa(target, draft, p: MedusaParams, mesh=None):
  """Medusa-1 heads trained for `target` (refused otherwise) drafting a static tree."""
  del draft
  mc, heads, _ = load_medusa(p.heads, target_config=target.config, target_params=target.params)
  if p.counts:
    if target.tokenizer is None:
      raise ValueError(f"{target.source} has no tokenizer: the counts' tokenizer identity "
                       f"cannot be checked")
    vocab = load_or_select(p.counts, target.tokenizer, target.config.vocab_size,
                           target.eos_token_ids, k=p.k)
  else:
    vocab = load_subset(p.subset, target)
  blocks = model_blocks(target, mesh)
  return SpeculativeEngine(blocks, target.config, MedusaProposer(
      blocks, target.config, heads, mc, choices=p.tree_choices(mc.num_heads),
      draft_vocab=vocab), mesh=mesh)
