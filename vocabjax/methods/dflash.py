"""DFlash and DFlash 2 (`dflash`): a block-diffusion drafter conditioned on the target's layers
drafts block_size - 1 tokens per pass through the target's LM head, verified as a chain;
optionally over a static subset (VocabTrim / FR-Spec) or a SpecVocab ranker's per-position
candidates. A DFlash 2 drafter (its checkpoint says which) drafts through its candidate
selector, or (`selector=false`) by the head's argmax as DFlash does."""

from __future__ import annotations

import dataclasses
import json

from vocabjax.checkpoints.dflash import load_dflash, load_dflash_config
from vocabjax.decoding.dflash import DFlashProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.errors import ConfigError
from vocabjax.methods import model_blocks, read_head_config, register
from vocabjax.methods.vocab import check_head_policy, head_policy, head_policy_rows
from vocabjax.models.llamalike import compute_dtype
from vocabjax.models.medusa import MedusaError, medusa_tree


def _config(path: str, where: str):
  return read_head_config(path, where, "dflash.head", load_dflash_config)


@dataclasses.dataclass(frozen=True)
class DFlashParams:
  head: str  # a DFlash drafter directory (z-lab's layout) or hub id
  subset: str = ""  # a saved static subset of the target's LM head to draft over
  ranker: str = ""  # or a SpecVocab ranker's per-position candidates (with k)
  k: int = 2048
  vocab: str = ""  # or a newer policy: "NAME:key=value,..." (microspec, evospec, dynaspec,
  #   slimspec, covtrim with their method's parameters: `methods.vocab.parse_vocab`)
  selector: bool = True  # a DFlash 2 drafter's candidate selector (no effect on DFlash)
  choices: str = ""  # a tree over the positions' top-k: Medusa-style paths of ranks (JSON)

  def check(self, where: str) -> None:
    config = _config(self.head, where)
    check_head_policy(where, "dflash", self.subset, self.ranker, self.k, self.vocab)
    if config.draft_vocab_size is not None and (self.subset or self.ranker or self.vocab):
      raise ConfigError(f"{where}: dflash.head={self.head!r} drafts over a head of its own "
                        f"({config.draft_vocab_size} rows, draft_vocab_size); a subset or a "
                        f"ranker on top of it is not supported")
    if self.choices:
      try:
        medusa_tree(_choices(self), config.gamma)
      except (MedusaError, ValueError) as e:
        raise ConfigError(f"{where}: dflash.choices: {e}") from None
      if config.dflash2 and self.selector:
        raise ConfigError(f"{where}: dflash.choices: DFlash 2's selector drafts one path; a "
                          f"tree over the positions' top-k needs selector=false")


def _choices(p: DFlashParams):
  return json.loads(p.choices) if p.choices else None


def _rows(p: DFlashParams) -> int:
  """LM-head rows drafted over per position: the policy's, else the target's V."""
  rows = head_policy_rows("dflash", p.subset, p.ranker, p.k, p.vocab)
  if rows is not None:
    return rows
  config = _config(p.head, "dflash")
  return config.draft_vocab_size or config.layer.vocab_size


@register("dflash", DFlashParams, needs_draft=False, drafter_passes=lambda p: 1,
          head_rows=_rows, drafter_params=lambda p: _config(p.head, "dflash").num_params(_rows(p)))
def _dflash(target, draft, p: DFlashParams, mesh=None):
  """DFlash block drafting with a drafter made for `target` (refused otherwise)."""
  del draft
  blocks = model_blocks(target, mesh)
  config, params = load_dflash(p.head, target_config=target.config,
                               dtype=compute_dtype(target.params))
  return SpeculativeEngine(blocks, target.config, DFlashProposer(
      blocks, target.config, params, config,
      draft_vocab=head_policy(target, p.subset, p.ranker, p.k, p.vocab), selector=p.selector,
      tree=_choices(p)), mesh=mesh)
