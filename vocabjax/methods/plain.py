"""Plain autoregressive decoding (`ar`): every method's reference."""

from __future__ import annotations

import dataclasses

from vocabjax.decoding.autoregressive import Decoder
from vocabjax.methods import register


@dataclasses.dataclass(frozen=True)
class ArParams:
  def check(self, where: str) -> None:
    del where


@register("ar", ArParams, needs_draft=False, timed=False)
def _ar(target, draft, p: ArParams, mesh=None):
  del draft, p
  return Decoder(target.params, target.config, mesh=mesh)
