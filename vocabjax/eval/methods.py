"""Registry of decoding methods the eval suite can run; later vocabulary methods register here.

A method builds a decoder (anything with `generate(prompts, **kw) -> GenerationResult`) from
the loaded target and drafter, validates its YAML parameters, and says how many drafter forward
passes a block takes and how many LM-head rows its drafter uses (for MBSU).

    @register("my_method", params={"gamma": int}, needs_draft=True)
    def build(target, draft, gamma): ...
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.speculative import ChainDecoder, TreeDecoder, block_layout
from vocabjax.decoding.tree import TreeParams


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  build: Callable[..., Any]  # (target Model, draft Model | None, **params) -> decoder
  params: dict  # parameter name -> type (all required unless in `defaults`)
  defaults: dict
  needs_draft: bool
  drafter_passes: Callable[[dict], int] | None  # params -> drafter forwards per block (MBSU)

  def check(self, params: dict, where: str) -> None:
    from vocabjax.eval.config import ConfigError

    unknown = sorted(set(params) - set(self.params))
    if unknown:
      raise ConfigError(f"{where}: method {self.name!r} has no parameters {unknown}; "
                        f"it takes {sorted(self.params)}")
    for k, typ in self.params.items():
      if k not in params and k not in self.defaults:
        raise ConfigError(f"{where}: method {self.name!r} needs parameter {k!r}")
      if k in params and not isinstance(params[k], typ):
        raise ConfigError(f"{where}: {self.name}.{k} must be {typ.__name__}, got {params[k]!r}")

  def make(self, target, draft, params: dict):
    return self.build(target, draft, **{**self.defaults, **params})


METHODS: dict[str, Method] = {}


def register(name: str, *, params: dict | None = None, defaults: dict | None = None,
             needs_draft: bool = True, drafter_passes=None):
  def deco(fn):
    METHODS[name] = Method(name, fn, params or {}, defaults or {}, needs_draft, drafter_passes)
    return fn
  return deco


@register("ar", needs_draft=False)
def _ar(target, draft):
  del draft
  return Decoder(target.params, target.config)


@register("chain", params={"gamma": int}, drafter_passes=lambda p: p["gamma"])
def _chain(target, draft, gamma):
  # layouts converted once per model and shared by every method of the run
  return ChainDecoder(target.in_layout(block_layout()), target.config, draft.params,
                      draft.config, gamma=gamma)


@register("tree", params={"top_k": int, "depth": int, "total_tokens": int},
          drafter_passes=lambda p: p["depth"])
def _tree(target, draft, top_k, depth, total_tokens):
  return TreeDecoder(target.in_layout(block_layout()), target.config,
                     draft.in_layout(block_layout()), draft.config, tree=TreeParams(top_k=top_k, depth=depth, total_tokens=total_tokens))
