"""DFlash (`dflash`): a block-diffusion drafter conditioned on the target's layers drafts
block_size - 1 tokens per pass through the target's LM head, verified as a chain; optionally
over a static subset (VocabTrim / FR-Spec) or a SpecVocab ranker's per-position candidates."""

from __future__ import annotations

import dataclasses

from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.dflash import load_dflash, load_dflash_config
from vocabjax.decoding.dflash import DFlashProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.errors import ConfigError
from vocabjax.methods import (
  check_subset_file,
  load_subset,
  local_path,
  model_blocks,
  register,
)
from vocabjax.methods.vocab import check_ranker_k, ranker_shapes
from vocabjax.models.llamalike import compute_dtype
from vocabjax.vocab.ranked import Ranker, SpeculativeVocab, ranked_head_rows
from vocabjax.vocab.subset import SubsetError, VocabSubset


def _config(path: str, where: str):
  path = local_path(path, "eagle", where)
  try:
    return load_dflash_config(path)
  except CheckpointError as e:
    raise ConfigError(f"{where}: dflash.head={path!r}: {e}") from None


@dataclasses.dataclass(frozen=True)
class DFlashParams:
  head: str  # a DFlash drafter directory (z-lab's layout) or hub id
  subset: str = ""  # a saved static subset of the target's LM head to draft over
  ranker: str = ""  # or a SpecVocab ranker's per-position candidates (with k)
  k: int = 2048

  def check(self, where: str) -> None:
    _config(self.head, where)
    if self.subset and self.ranker:
      raise ConfigError(f"{where}: dflash takes a subset or a ranker, not both")
    check_subset_file(where, "dflash", self.subset)
    if self.ranker:
      check_ranker_k(where, "dflash", self.ranker, self.k)


def _rows(p: DFlashParams) -> int:
  if p.subset:
    try:
      return len(VocabSubset.load(local_path(p.subset, "file")).ids)
    except SubsetError as e:
      raise ConfigError(f"dflash.subset={p.subset!r}: {e}") from None
  if p.ranker:
    return ranked_head_rows(p.k, *ranker_shapes(p.ranker, "dflash"))
  return _config(p.head, "dflash").layer.vocab_size


@register("dflash", DFlashParams, needs_draft=False, drafter_passes=lambda p: 1,
          head_rows=_rows, drafter_params=lambda p: _config(p.head, "dflash").num_params(_rows(p)))
def _dflash(target, draft, p: DFlashParams, mesh=None):
  """DFlash block drafting with a drafter made for `target` (refused otherwise)."""
  del draft
  blocks = model_blocks(target, mesh)
  config, params = load_dflash(p.head, target_config=target.config,
                               dtype=compute_dtype(target.params))
  vocab = (SpeculativeVocab(Ranker.load(p.ranker), k=p.k) if p.ranker
           else load_subset(p.subset, target))
  return SpeculativeEngine(blocks, target.config, DFlashProposer(
      blocks, target.config, params, config, draft_vocab=vocab), mesh=mesh)
