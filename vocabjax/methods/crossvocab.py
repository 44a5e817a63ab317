"""A drafter with another tokenizer (`crossvocab`, OmniDraft: Ramakrishnan et al. 2025)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vocabjax.checkpoints.distilled import load_distilled
from vocabjax.decoding.crossvocab import RULES as CROSSVOCAB_RULES
from vocabjax.decoding.crossvocab import CrossVocabProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.errors import ConfigError
from vocabjax.methods import model_blocks, register


# A drafter with another tokenizer (e.g. SmolLM2-135M for a Qwen target): direct mapping
# through the vocabulary intersection (ngram: false is the UAG baseline), the online n-gram
# cache (it persists across a suite's questions, as it would for one user), a drafter
# distilled by `python -m vocabjax.train.distill` (`drafter`: its output directory, full
# fine-tuning or LoRA), and an acceptance head for adaptive draft length (`adaptive: true` with
# that directory's head, stop when P(a rejection) > `threshold`).

@dataclasses.dataclass(frozen=True)
class CrossVocabParams:
  gamma: int = 4
  ngram: bool = True
  drafter: str = ""  # a `train.distill` output's drafter/ directory
  adaptive: bool = False
  threshold: float = 0.5
  rule: str = "exact"  # sampling with n-gram merges: "exact" or "omnidraft" (approximate)

  def check(self, where: str) -> None:
    if self.gamma < 1:
      raise ConfigError(f"{where}: crossvocab.gamma must be >= 1, got {self.gamma}")
    if self.rule not in CROSSVOCAB_RULES:
      raise ConfigError(f"{where}: crossvocab.rule must be one of {CROSSVOCAB_RULES}, got "
                        f"{self.rule!r}")
    if not 0 < self.threshold < 1:
      raise ConfigError(f"{where}: crossvocab.threshold must be in (0, 1), got "
                        f"{self.threshold}")
    if self.drafter and not (Path(self.drafter) / "distill.json").is_file():
      raise ConfigError(f"{where}: crossvocab.drafter={self.drafter!r} is not a directory made "
                        f"by `python -m vocabjax.train.distill` (no distill.json)")
    if self.adaptive and not self.drafter:
      raise ConfigError(f"{where}: crossvocab.adaptive needs a `drafter` directory holding a "
                        f"trained acceptance head")


@register("crossvocab", CrossVocabParams, drafter_passes=lambda p: p.gamma, timed=False)
def _crossvocab(target, draft, p: CrossVocabParams, mesh=None):
  if target.tokenizer is None or draft.tokenizer is None:
    raise ValueError("crossvocab needs both tokenizers (the target's and the drafter's)")
  params, head = draft.params, None
  if p.drafter:
    params, head = load_distilled(p.drafter, draft.params, draft.config)
    if p.adaptive and head is None:
      raise ValueError(f"{p.drafter} holds no acceptance head (train with acceptance: joint "
                       f"or interleaved)")
  return SpeculativeEngine(
      model_blocks(target, mesh), target.config,
      CrossVocabProposer(params, draft.config, target.config, target_tokenizer=target.tokenizer,
                         draft_tokenizer=draft.tokenizer, gamma=p.gamma, ngram=p.ngram,
                         acceptance_head=head if p.adaptive else None,
                         stop_threshold=p.threshold, rule=p.rule), mesh=mesh)

