"""P-EAGLE (`peagle`): a parallel EAGLE-3 head (vLLM's `speculators` format) drafts `gamma`
tokens in one pass from the target's features, verified as a chain; over the head's own
vocabulary (d2t) or the target's LM head, optionally restricted by a static subset or a
SpecVocab ranker, as EAGLE's."""

from __future__ import annotations

import dataclasses

from vocabjax.decoding.peagle import PEagleProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.errors import ConfigError
from vocabjax.methods import model_blocks, register
from vocabjax.methods.eagle import _eagle_config, _eagle_head, _eagle_rows, _eagle_vocab
from vocabjax.methods.vocab import check_head_policy


@dataclasses.dataclass(frozen=True)
class PEagleParams:
  head: str  # a P-EAGLE head directory (speculators' layout) or hub id
  gamma: int = 8  # drafts per pass (speculators trains 8 depths by default)
  lm_head: str = "own"  # own: the head's rows (d2t); target: the target's LM head
  subset: str = ""  # a saved static subset for the drafting vocabulary
  ranker: str = ""  # or a SpecVocab ranker's per-position candidates (with k)
  k: int = 2048
  vocab: str = ""  # or a newer policy: "NAME:key=value,..." (microspec, evospec, dynaspec,
  #   slimspec, covtrim with their method's parameters: `methods.vocab.parse_vocab`)

  def check(self, where: str) -> None:
    if self.lm_head not in ("own", "target"):
      raise ConfigError(f"{where}: peagle.lm_head={self.lm_head!r} must be 'own' or 'target'")
    if self.gamma < 1:
      raise ConfigError(f"{where}: peagle.gamma={self.gamma} must be at least 1")
    hc = _eagle_config(self.head, where)
    if not hc.parallel:
      raise ConfigError(f"{where}: peagle.head={self.head!r} is an EAGLE head without a "
                        f"mask_token_id, not a P-EAGLE one: draft with it by method eagle")
    check_head_policy(where, "peagle", self.subset, self.ranker, self.k, self.vocab)


def _rows(p: PEagleParams) -> int:
  return _eagle_rows(p, "peagle")


@register("peagle", PEagleParams, needs_draft=False, drafter_passes=lambda p: 2,
          head_rows=_rows,
          drafter_params=lambda p: _eagle_config(p.head, "peagle").num_params(_rows(p)))
def _peagle(target, draft, p: PEagleParams, mesh=None):
  """P-EAGLE parallel drafting with a head trained for `target` (refused otherwise)."""
  del draft
  blocks = model_blocks(target, mesh)
  return SpeculativeEngine(blocks, target.config, PEagleProposer(
      blocks, target.config, *_eagle_head(target, p), drafts=p.gamma, lm_head=p.lm_head,
      draft_vocab=_eagle_vocab(target, p)), mesh=mesh)
