"""Registry of decoding methods the eval suite can run; later vocabulary methods register here.

A method builds a decoder (anything with `generate(prompts, **kw) -> GenerationResult`) from
the loaded target and drafter, validates its YAML parameters, and says how many drafter forward
passes a block takes and how many LM-head rows its drafter uses (for MBSU).

    @register("my_method", params={"gamma": int}, needs_draft=True)
    def build(target, draft, gamma): ...
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.pld import PromptLookupDecoder
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
  head_rows: Callable[[dict], int] | None = None  # params -> drafter LM-head rows (None: V)
  validate: Callable[[dict, str], None] | None = None  # extra checks of the values
  drafter_params: Callable[[dict], int] | None = None  # params -> drafter params read per
  #   token, for MBSU (None: the draft model's, with head_rows LM-head rows)

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
    if self.validate is not None:
      self.validate({**self.defaults, **params}, where)

  def make(self, target, draft, params: dict):
    return self.build(target, draft, **{**self.defaults, **params})


METHODS: dict[str, Method] = {}


def register(name: str, *, params: dict | None = None, defaults: dict | None = None,
             needs_draft: bool = True, drafter_passes=None, head_rows=None, validate=None,
             drafter_params=None):
  def deco(fn):
    METHODS[name] = Method(name, fn, params or {}, defaults or {}, needs_draft, drafter_passes,
                           head_rows, validate, drafter_params)
    return fn
  return deco


@register("ar", needs_draft=False)
def _ar(target, draft):
  del draft
  return Decoder(target.params, target.config)


def _check_chain(p: dict, where: str) -> None:
  from vocabjax.eval.config import ConfigError

  if p["gamma"] < 1:
    raise ConfigError(f"{where}: chain needs gamma >= 1, got gamma={p['gamma']}")


def _check_tree(p: dict, where: str) -> None:
  from vocabjax.eval.config import ConfigError

  try:
    TreeParams(top_k=p["top_k"], depth=p["depth"], total_tokens=p["total_tokens"])
  except ValueError as e:
    raise ConfigError(f"{where}: {e}") from None


@register("chain", params={"gamma": int}, drafter_passes=lambda p: p["gamma"],
          validate=_check_chain)
def _chain(target, draft, gamma, draft_vocab=None):
  # layouts converted once per model and shared by every method of the run
  return ChainDecoder(target.in_layout(block_layout()), target.config, draft.params,
                      draft.config, gamma=gamma, draft_vocab=draft_vocab)


@register("tree", params={"top_k": int, "depth": int, "total_tokens": int},
          drafter_passes=lambda p: p["depth"], validate=_check_tree)
def _tree(target, draft, top_k, depth, total_tokens, draft_vocab=None):
  return TreeDecoder(target.in_layout(block_layout()), target.config,
                     draft.in_layout(block_layout()), draft.config,
                     tree=TreeParams(top_k=top_k, depth=depth, total_tokens=total_tokens),
                     draft_vocab=draft_vocab)


def _check_pld(p: dict, where: str) -> None:
  from vocabjax.eval.config import ConfigError

  if p["gamma"] < 1 or not 1 <= p["min_ngram"] <= p["max_ngram"]:
    raise ConfigError(f"{where}: pld needs gamma >= 1 and 1 <= min_ngram <= max_ngram, got "
                      f"gamma={p['gamma']}, min_ngram={p['min_ngram']}, "
                      f"max_ngram={p['max_ngram']}")


@register("pld", params={"gamma": int, "max_ngram": int, "min_ngram": int},
          defaults={"gamma": 4, "max_ngram": 3, "min_ngram": 1}, needs_draft=False,
          drafter_passes=lambda p: 0, validate=_check_pld)
def _pld(target, draft, gamma, max_ngram, min_ngram):
  """Prompt lookup decoding (Saxena 2023): drafts copied from the context, no drafter."""
  del draft
  return PromptLookupDecoder(target.in_layout(block_layout()), target.config, gamma=gamma,
                             max_ngram=max_ngram, min_ngram=min_ngram)


# --- static drafter vocabularies (VocabTrim, FR-Spec) ---------------------------------------
# Both draft with a trimmed LM head over the top-k tokens of a counts file made by
# `python -m vocabjax.calibrate count`; they differ in what was counted: VocabTrim counts
# completions generated by a model (the target, its best choice), FR-Spec a raw corpus. The
# subset is saved beside the counts (`subset-k{k}.npz`) on first use and reloaded after.

_DRAFT = {"k": int, "gamma": int, "top_k": int, "depth": int, "total_tokens": int}
_STATIC = {"counts": str, **_DRAFT}
_STATIC_DEFAULTS = {"gamma": 3, "top_k": 0, "depth": 0, "total_tokens": 0}  # depth 0: chain


def _static_passes(p: dict) -> int:
  return p["depth"] or p["gamma"]


def _check_draft_params(p: dict, where: str, method: str) -> None:
  """k and gamma positive; a tree's parameters valid and its top_k within the k candidates."""
  from vocabjax.eval.config import ConfigError

  if p["k"] < 1 or p["gamma"] < 1:
    raise ConfigError(f"{where}: {method} needs k >= 1 and gamma >= 1, got k={p['k']}, "
                      f"gamma={p['gamma']}")
  if p["depth"]:
    try:
      TreeParams(top_k=p["top_k"], depth=p["depth"], total_tokens=p["total_tokens"])
    except ValueError as e:
      raise ConfigError(f"{where}: {method}: {e}") from None
    if p["top_k"] > p["k"]:
      raise ConfigError(f"{where}: {method}.top_k={p['top_k']} exceeds k={p['k']}")


def _static_validator(kind: str, method: str):
  def validate(p: dict, where: str) -> None:
    from vocabjax.calibrate.counts import CalibrationError, Counts
    from vocabjax.eval.config import ConfigError

    _check_draft_params(p, where, method)
    try:
      counts = Counts.load(p["counts"])
    except CalibrationError as e:
      raise ConfigError(f"{where}: {e}") from None
    meta = counts.meta
    if p["k"] > counts.vocab_size:
      raise ConfigError(f"{where}: {method}.k={p['k']} exceeds the vocabulary of "
                        f"{counts.vocab_size} tokens in {p['counts']}")
    if meta.get("kind") != kind:
      raise ConfigError(f"{where}: {method} uses counts of {kind} data, but {p['counts']} "
                        f"counts {meta.get('kind')} data ({meta.get('source')}); use "
                        f"{'frspec' if method == 'vocabtrim' else 'vocabtrim'} for it")
  return validate


def _static_vocab(target, draft, counts, k, gamma, top_k, depth, total_tokens):
  """Chain drafting (depth 0) or an EAGLE-2 tree (depth > 0) with the trimmed drafter head."""
  from vocabjax.calibrate.select import load_or_select

  if target.tokenizer is None:
    raise ValueError(f"{target.source} has no tokenizer: the counts' tokenizer identity "
                     f"cannot be checked")
  sub = load_or_select(counts, target.tokenizer, target.config.vocab_size,
                       target.eos_token_ids, k=k)
  return _chain_or_tree(target, draft, gamma, top_k, depth, total_tokens, sub)


def _chain_or_tree(target, draft, gamma, top_k, depth, total_tokens, draft_vocab):
  """Chain drafting (depth 0) or an EAGLE-2 tree (depth > 0) with `draft_vocab`."""
  if depth:
    return _tree(target, draft, top_k, depth, total_tokens, draft_vocab=draft_vocab)
  return _chain(target, draft, gamma, draft_vocab=draft_vocab)


register("vocabtrim", params=_STATIC, defaults=_STATIC_DEFAULTS,
         drafter_passes=_static_passes, head_rows=lambda p: p["k"],
         validate=_static_validator("generated", "vocabtrim"))(_static_vocab)
register("frspec", params=_STATIC, defaults=_STATIC_DEFAULTS,
         drafter_passes=_static_passes, head_rows=lambda p: p["k"],
         validate=_static_validator("text", "frspec"))(_static_vocab)


# --- speculative vocabulary (SpecVocab) -----------------------------------------------------
# The drafter's LM head is replaced per step by the top-k candidates of a trained ranker
# (`python -m vocabjax.train.ranker`), exact logits for those only (the indexed LM head).

_RANKED = {"ranker": str, **_DRAFT}


def _ranker_shapes(path: str, where: str) -> tuple[int, int, int]:
  """(V, d', d) of a ranker file, from its header."""
  from safetensors import SafetensorError, safe_open

  from vocabjax.eval.config import ConfigError
  from vocabjax.vocab.ranked import RankerError, read_metadata

  if not Path(path).is_file():
    raise ConfigError(f"{where}: specvocab.ranker={path!r} is not a readable ranker file (no "
                      f"such file; train one with `python -m vocabjax.train.ranker --config "
                      f"configs/ranker_*.yaml`)")
  try:
    read_metadata(path)
    with safe_open(path, framework="numpy") as f:
      V, R = f.get_slice("vocab").get_shape()
      _, D = f.get_slice("down").get_shape()
  except (RankerError, OSError, SafetensorError) as e:
    raise ConfigError(f"{where}: specvocab.ranker={path!r} is not a readable ranker file "
                      f"({e})") from None
  return int(V), int(R), int(D)


def _ranked_validate(p: dict, where: str) -> None:
  from vocabjax.eval.config import ConfigError

  _check_draft_params(p, where, "specvocab")
  V, _, _ = _ranker_shapes(p["ranker"], where)
  if p["k"] > V:
    raise ConfigError(f"{where}: specvocab.k={p['k']} exceeds the ranker's vocabulary of {V} "
                      f"tokens")


def _ranked_rows(p: dict) -> int:
  from vocabjax.vocab.ranked import ranked_head_rows

  return ranked_head_rows(p["k"], *_ranker_shapes(p["ranker"], "specvocab"))


@register("specvocab", params=_RANKED, defaults=_STATIC_DEFAULTS, drafter_passes=_static_passes,
          head_rows=_ranked_rows, validate=_ranked_validate)
def _specvocab(target, draft, ranker, k, gamma, top_k, depth, total_tokens):
  """Chain drafting (depth 0) or an EAGLE-2 tree (depth > 0) over the ranker's candidates."""
  from vocabjax.vocab.ranked import Ranker, SpeculativeVocab

  return _chain_or_tree(target, draft, gamma, top_k, depth, total_tokens,
                        SpeculativeVocab(Ranker.load(ranker), k=k))


# --- EAGLE head (EAGLE-3 checkpoints) -------------------------------------------------------
# An EAGLE-3 head directory (`python -m vocabjax.train.eagle`, or one exported by SpecForge for
# SGLang / vLLM) drafts an EAGLE-2 tree from the target's own features; no separate drafter.

_EAGLE = {"head": str, "top_k": int, "depth": int, "total_tokens": int, "lm_head": str}
_EAGLE_DEFAULTS = {"lm_head": "own"}


def _eagle_config(path: str, where: str):
  from vocabjax.checkpoints.convert import CheckpointError
  from vocabjax.checkpoints.eagle3 import load_eagle3_config
  from vocabjax.eval.config import ConfigError

  try:
    return load_eagle3_config(path)
  except CheckpointError as e:
    raise ConfigError(f"{where}: eagle.head={path!r}: {e}") from None


def _eagle_validate(p: dict, where: str) -> None:
  from vocabjax.eval.config import ConfigError

  if p["lm_head"] not in ("own", "target"):
    raise ConfigError(f"{where}: eagle.lm_head={p['lm_head']!r} must be 'own' or 'target'")
  try:
    TreeParams(top_k=p["top_k"], depth=p["depth"], total_tokens=p["total_tokens"])
  except ValueError as e:
    raise ConfigError(f"{where}: eagle: {e}") from None
  hc = _eagle_config(p["head"], where)
  if p["lm_head"] == "own" and p["top_k"] > hc.draft_vocab_size:
    raise ConfigError(f"{where}: eagle.top_k={p['top_k']} exceeds the head's vocabulary of "
                      f"{hc.draft_vocab_size} tokens")


def _eagle_rows(p: dict) -> int:
  hc = _eagle_config(p["head"], "eagle")
  return hc.draft_vocab_size if p["lm_head"] == "own" else hc.layer.vocab_size


@register("eagle", params=_EAGLE, defaults=_EAGLE_DEFAULTS, needs_draft=False,
          drafter_passes=lambda p: p["depth"], head_rows=_eagle_rows, validate=_eagle_validate,
          drafter_params=lambda p: _eagle_config(p["head"], "eagle").num_params(_eagle_rows(p)))
def _eagle(target, draft, head, top_k, depth, total_tokens, lm_head):
  """EAGLE-2 tree drafting with an EAGLE-3 head trained for `target` (refused otherwise)."""
  from vocabjax.checkpoints.eagle3 import load_eagle3
  from vocabjax.decoding.eagle import EagleDecoder

  del draft
  hc, params, _ = load_eagle3(head, target_config=target.config, target_params=target.params,
                              dtype=target.params["embed"].dtype)
  return EagleDecoder(target.in_layout(block_layout()), target.config, params, hc,
                      tree=TreeParams(top_k=top_k, depth=depth, total_tokens=total_tokens),
                      lm_head=lm_head)


# --- cross-vocabulary drafting (OmniDraft) --------------------------------------------------
# A drafter with another tokenizer (the suite's `draft`, e.g. SmolLM2-135M for a Qwen target):
# direct mapping through the vocabulary intersection (ngram: false is the UAG baseline), the
# online n-gram cache (it persists across the suite's questions, as it would for one user), a
# drafter distilled by `python -m vocabjax.train.distill` (`drafter`: its output directory, full
# fine-tuning or LoRA), and an acceptance head for adaptive draft length (`adaptive: true` with
# that directory's head, stop when P(a rejection) > `threshold`).

_CROSS = {"gamma": int, "ngram": bool, "drafter": str, "adaptive": bool, "threshold": float}
_CROSS_DEFAULTS = {"gamma": 4, "ngram": True, "drafter": "", "adaptive": False,
                   "threshold": 0.5}


def _cross_validate(p: dict, where: str) -> None:
  from vocabjax.eval.config import ConfigError

  if p["gamma"] < 1:
    raise ConfigError(f"{where}: crossvocab.gamma must be >= 1, got {p['gamma']}")
  if not 0 < p["threshold"] < 1:
    raise ConfigError(f"{where}: crossvocab.threshold must be in (0, 1), got {p['threshold']}")
  if p["drafter"] and not (Path(p["drafter"]) / "distill.json").is_file():
    raise ConfigError(f"{where}: crossvocab.drafter={p['drafter']!r} is not a directory made by "
                      f"`python -m vocabjax.train.distill` (no distill.json)")
  if p["adaptive"] and not p["drafter"]:
    raise ConfigError(f"{where}: crossvocab.adaptive needs a `drafter` directory holding a "
                      f"trained acceptance head")


@register("crossvocab", params=_CROSS, defaults=_CROSS_DEFAULTS, validate=_cross_validate,
          drafter_passes=lambda p: p["gamma"])
def _crossvocab(target, draft, gamma, ngram, drafter, adaptive, threshold):
  from vocabjax.decoding.crossvocab import CrossVocabDecoder

  if target.tokenizer is None or draft.tokenizer is None:
    raise ValueError("crossvocab needs both tokenizers (the target's and the drafter's)")
  params, head = draft.params, None
  if drafter:
    from vocabjax.train.distill import load_distilled

    params, head = load_distilled(drafter, draft.params, draft.config)
    if adaptive and head is None:
      raise ValueError(f"{drafter} holds no acceptance head (train with acceptance: joint or "
                       f"interleaved)")
  return CrossVocabDecoder(target.in_layout(block_layout()), target.config, params, draft.config,
                           target_tokenizer=target.tokenizer, draft_tokenizer=draft.tokenizer,
                           gamma=gamma, ngram=ngram,
                           acceptance_head=head if adaptive else None, stop_threshold=threshold)
