"""The library's registry of decoding methods: one place that turns a method name and its
parameters into a decoder, used by the eval suites (`methods:` entries of a YAML suite) and by
`python -m vocabjax.generate` (its flags) alike.

Methods: ar, chain, tree, pld, ngram, suffix, tree_suffix, vocabtrim, frspec, specvocab, eagle,
eagle_pld, eagle_suffix, medusa, crossvocab. Each has a frozen parameter dataclass (field types
are checked, then the dataclass's `check` validates the values, naming the field and the
value), a builder `(target Model, draft Model | None, params) -> decoder` (anything with
`generate(prompts, **kw) -> GenerationResult`), and what the reports need for MBSU: drafter
forwards per block and the drafter's LM-head rows.

    method = METHODS["chain"]
    params = method.parse({"gamma": 3}, where="my suite")   # ChainParams(gamma=3, subset="")
    decoder = method.make(target, draft, params)

Drafter vocabularies: `subset` (chain, tree, eagle) is a saved static subset (`python -m
vocabjax.calibrate select`, VocabTrim / FR-Spec); `vocabtrim` / `frspec` select one from a
counts file on first use; `specvocab` (and eagle's `ranker`) drafts over a trained ranker's
per-step candidates.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Callable

from safetensors import SafetensorError, safe_open

from vocabjax.calibrate.counts import CalibrationError, Counts, tokenizer_identity
from vocabjax.calibrate.select import load_or_select
from vocabjax.checkpoints import hub
from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.distilled import load_distilled
from vocabjax.checkpoints.eagle2 import load_head, load_head_config
from vocabjax.checkpoints.medusa import load_medusa
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.crossvocab import RULES as CROSSVOCAB_RULES
from vocabjax.decoding.crossvocab import CrossVocabDecoder
from vocabjax.decoding.eagle import EagleDecoder, EagleLookupDecoder, EagleSuffixDecoder
from vocabjax.decoding.hybrid import TreeSuffixDecoder
from vocabjax.decoding.medusa import MedusaDecoder, medusa_choices_for
from vocabjax.decoding.ngram import NgramProposer, table_from
from vocabjax.decoding.pld import PromptLookupDecoder
from vocabjax.decoding.speculative import (ChainDecoder, SpeculativeEngine, TreeDecoder,
                                           block_layout)
from vocabjax.decoding.suffix import SuffixProposer, check_suffix
from vocabjax.decoding.tree import MAX_TREE_NODES, TreeParams
from vocabjax.errors import ConfigError
from vocabjax.models.medusa import medusa_tree
from vocabjax.vocab.ranked import (Ranker, RankerError, SpeculativeVocab, ranked_head_rows,
                                   read_metadata)
from vocabjax.vocab.subset import SubsetError, VocabSubset


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  params: type  # the frozen parameter dataclass (fields without a default are required)
  build: Callable[..., Any]  # (target Model, draft Model | None, params, mesh) -> decoder
  needs_draft: bool
  drafter_passes: Callable[[Any], int] | None  # params -> drafter forwards per block (MBSU)
  head_rows: Callable[[Any], int] | None = None  # params -> drafter LM-head rows (None: V)
  drafter_params: Callable[[Any], int] | None = None  # params -> drafter params read per
  #   token, for MBSU (None: the draft model's, with head_rows LM-head rows)
  timed: bool = False  # its decoders time their step's parts (`DecodingMethod.times_step_parts`:
  #   a compiled drafter step, `vocabjax.decoding.profile.step_split`); checked in tests

  @property
  def fields(self) -> dict[str, type]:
    """Parameter name -> type."""
    hints = typing.get_type_hints(self.params)
    return {f.name: hints[f.name] for f in dataclasses.fields(self.params)}

  @property
  def defaults(self) -> dict:
    return {f.name: f.default for f in dataclasses.fields(self.params)
            if f.default is not dataclasses.MISSING}

  def parse(self, raw: dict, where: str, *, check_files: bool = True):
    """The parameter dataclass from a mapping (YAML, flags); unknown, missing or mistyped
    parameters and bad values are ConfigErrors naming the field and the value. With
    `check_files=False` the parameters' own checks (`params.check`: values, and the files they
    name: heads, rankers, subsets) are left out, only names and types checked (a report
    written from recorded records, `vocabjax.eval --report-only`, whose files may be gone)."""
    fields = self.fields
    unknown = sorted(set(raw) - set(fields))
    if unknown:
      raise ConfigError(f"{where}: method {self.name!r} has no parameters {unknown}; "
                        f"it takes {sorted(fields)}")
    for k, typ in fields.items():
      if k not in raw and k not in self.defaults:
        raise ConfigError(f"{where}: method {self.name!r} needs parameter {k!r}")
      if k in raw and not _is(raw[k], typ):
        raise ConfigError(f"{where}: {self.name}.{k} must be {typ.__name__}, got {raw[k]!r}")
    params = self.params(**raw)
    if check_files:
      params = _local_files(params, self.name, where)
      params.check(where)
    return params

  def check(self, raw: dict, where: str, *, check_files: bool = True) -> None:
    """`parse`, for validation only."""
    self.parse(raw, where, check_files=check_files)

  def make(self, target, draft, params, mesh=None):
    """The decoder; `params` is this method's dataclass or a mapping (parsed first). `mesh`:
    a ("data", "model") mesh (`vocabjax.sharding.make_mesh`) the decoder runs on."""
    if isinstance(params, dict):
      params = self.parse(params, f"method {self.name}")
    return self.build(target, draft, params, mesh)


# the parameters that name files, and what a hub id in them fetches (`checkpoints.hub`)
HUB_FIELDS = {"head": "eagle", "heads": "medusa", "ranker": "file", "subset": "file",
              "counts": "file", "drafter": "folder"}


def _local(value: str, kind: str, where: str = "", label: str = "", progress: bool = False) -> str:
  """A file parameter's local path: itself when it exists (or is no hub id), else the hub id
  fetched (from the cache when it is there). `label` (`method.field`) names the parameter in
  the error."""
  if not value or Path(value).expanduser().exists() or hub.parse_hub_id(value) is None:
    return value
  try:
    return str(hub.fetch(value, kind, progress=progress))
  except hub.HubError as e:
    name = f"{label}=" if label else ""
    raise ConfigError(f"{where or 'method'}: {name}{value!r}: no such local path, and as a hub "
                      f"id: {e}") from None


def _local_files(params, method: str, where: str):
  """`params` with each hub id among its file parameters (`HUB_FIELDS`) replaced by the local
  path it is downloaded to (with progress); a local path that exists is kept as it is."""
  changes = {}
  for field, kind in HUB_FIELDS.items():
    value = getattr(params, field, "")
    local = _local(value, kind, where, f"{method}.{field}", progress=True)
    if local != value:
      changes[field] = local
  return dataclasses.replace(params, **changes) if changes else params


def _is(value, typ: type) -> bool:
  """`value` fits a parameter of type `typ` (a bool is not an int here; an int is a float)."""
  if typ is bool or isinstance(value, bool):
    return typ is bool and isinstance(value, bool)
  return isinstance(value, (int, float) if typ is float else typ)


METHODS: dict[str, Method] = {}


def register(name: str, params: type, *, needs_draft: bool = True, drafter_passes=None,
             head_rows=None, drafter_params=None, timed: bool = True):
  def deco(fn):
    METHODS[name] = Method(name, params, fn, needs_draft, drafter_passes, head_rows,
                           drafter_params, timed)
    return fn
  return deco


# --- shared checks ----------------------------------------------------------------------------

def _tree(where: str, what: str, top_k: int, depth: int, total_tokens: int) -> TreeParams:
  try:
    return TreeParams(top_k=top_k, depth=depth, total_tokens=total_tokens)
  except ValueError as e:
    raise ConfigError(f"{where}: {what}: {e}") from None


def _check_subset_file(where: str, what: str, path: str) -> None:
  if path and not Path(path).is_file():
    raise ConfigError(f"{where}: {what}.subset={path!r}: no such file (make one with `python "
                      f"-m vocabjax.calibrate select`)")


def _load_subset(path: str, target) -> VocabSubset | None:
  """A saved subset, refused when counted with another tokenizer than the target's; or
  FR-Spec's released token list (`.pt`: no tokenizer recorded, its ids checked against V)."""
  if not path:
    return None
  if Path(path).suffix in (".pt", ".pth"):
    return VocabSubset.load(path, vocab_size=target.config.vocab_size)
  if target.tokenizer is None:
    raise ValueError(f"{target.source} has no tokenizer: the subset's tokenizer identity "
                     f"cannot be checked")
  return VocabSubset.load(path, tokenizer_id=tokenizer_identity(target.tokenizer))


# --- plain decoding ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ArParams:
  def check(self, where: str) -> None:
    del where


@register("ar", ArParams, needs_draft=False, timed=False)
def _ar(target, draft, p: ArParams, mesh=None):
  del draft, p
  return Decoder(target.params, target.config, mesh=mesh)


# --- an independent drafter of the same vocabulary --------------------------------------------

@dataclasses.dataclass(frozen=True)
class ChainParams:
  gamma: int = 3  # drafts per step (the default suite's)
  subset: str = ""  # a saved static vocabulary subset (.npz) for a trimmed drafter head
  self_sizing: bool = False  # each step's length (1..gamma) from step costs and acceptance

  def check(self, where: str) -> None:
    if not 1 <= self.gamma <= MAX_TREE_NODES:
      raise ConfigError(f"{where}: chain needs 1 <= gamma <= {MAX_TREE_NODES} (a step verifies "
                        f"gamma + 1 tokens as one block), got gamma={self.gamma}")
    _check_subset_file(where, "chain", self.subset)


def _blocks(model, mesh):
  """A model's params in the layout its block programs run best in (converted once per model
  and shared by every method of a run); on a mesh the sharding rules' [out, in] layout."""
  return model.params if mesh is not None else model.in_layout(block_layout())


def _chain_decoder(target, draft, gamma, draft_vocab, mesh=None, self_sizing=False):
  return ChainDecoder(_blocks(target, mesh), target.config, draft.params,
                      draft.config, gamma=gamma, draft_vocab=draft_vocab, mesh=mesh,
                      self_sizing=self_sizing)


def _tree_decoder(target, draft, tree: TreeParams, draft_vocab, mesh=None, self_sizing=False):
  return TreeDecoder(_blocks(target, mesh), target.config, _blocks(draft, mesh), draft.config,
                     tree=tree, draft_vocab=draft_vocab, mesh=mesh, self_sizing=self_sizing)


@register("chain", ChainParams, drafter_passes=lambda p: p.gamma)
def _chain(target, draft, p: ChainParams, mesh=None):
  return _chain_decoder(target, draft, p.gamma, _load_subset(p.subset, target), mesh,
                        p.self_sizing)


@dataclasses.dataclass(frozen=True)
class TreeMethodParams:
  top_k: int = 2  # children per expanded node (the default suite's tree: 2, 4, 8)
  depth: int = 4  # levels below the root
  total_tokens: int = 8  # nodes verified besides the root
  subset: str = ""  # a saved static vocabulary subset (.npz)
  self_sizing: bool = False  # each step's tree (0, 1, 2, 4, .. nodes) from step costs and
  #   acceptance (tree_suffix: the suffix proposal's length; the drafter's tree kept)

  def check(self, where: str) -> None:
    _tree(where, "tree", self.top_k, self.depth, self.total_tokens)
    _check_subset_file(where, "tree", self.subset)


@register("tree", TreeMethodParams, drafter_passes=lambda p: p.depth)
def _tree_method(target, draft, p: TreeMethodParams, mesh=None):
  return _tree_decoder(target, draft, TreeParams(p.top_k, p.depth, p.total_tokens),
                       _load_subset(p.subset, target), mesh, p.self_sizing)


# --- prompt lookup ----------------------------------------------------------------------------

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
  return PromptLookupDecoder(_blocks(target, mesh), target.config, gamma=p.gamma,
                             max_ngram=p.max_ngram, min_ngram=p.min_ngram,
                             candidates=p.candidates, mesh=mesh, self_sizing=p.self_sizing)


# --- a fixed n-gram table (the worked example of docs/extending.md) --------------------------

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
  return SpeculativeEngine(_blocks(target, mesh), target.config,
                           NgramProposer(table, gamma=p.gamma), mesh=mesh,
                           self_sizing=p.self_sizing)


# --- SuffixDecoding ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SuffixParams:
  max_spec_tokens: int = 8  # most drafts per step
  max_spec_factor: float = 1.0  # drafts per matched context token
  max_spec_offset: float = 0.0  # drafts added to that
  min_token_prob: float = 0.1  # a draft's estimated probability must reach it
  max_tree_depth: int = 64  # the trees' n-grams: at most this long
  max_cached_requests: int = 10_000  # earlier outputs the global tree keeps (-1: all)
  use_tree: bool = False  # a tree of continuations (best first) instead of one chain
  self_sizing: bool = False  # each step's draft length from step costs and acceptance

  def check(self, where: str) -> None:
    try:
      check_suffix(self.max_tree_depth, self.max_spec_tokens, self.max_spec_factor,
                   self.max_spec_offset, self.min_token_prob, self.max_cached_requests)
    except ValueError as e:
      raise ConfigError(f"{where}: suffix: {e}") from None

  def proposer(self) -> SuffixProposer:
    """The SuffixProposer of these settings (`self_sizing` is the engine's, not its)."""
    return SuffixProposer(**{k: v for k, v in dataclasses.asdict(self).items()
                             if k != "self_sizing"})


@register("suffix", SuffixParams, needs_draft=False, drafter_passes=lambda p: 0, timed=False)
def _suffix(target, draft, p: SuffixParams, mesh=None):
  """SuffixDecoding (`decoding.suffix`): drafts from suffix trees over the request and over
  earlier outputs (kept across the decoder's requests), no drafter."""
  del draft
  return SpeculativeEngine(_blocks(target, mesh), target.config, p.proposer(), mesh=mesh,
                           self_sizing=p.self_sizing)


@dataclasses.dataclass(frozen=True)
class SuffixHybridParams:
  """SuffixDecoding's settings in a hybrid with a device tree (a drafter model's, an EAGLE
  head's), after the device tree's own fields (a mixin before them in the bases)."""

  max_spec_tokens: int = 8  # SuffixDecoding's most drafts per step
  max_spec_factor: float = 1.0
  max_spec_offset: float = 0.0
  min_token_prob: float = 0.1
  max_tree_depth: int = 64
  max_cached_requests: int = 10_000
  score_threshold: float = -1.0  # >= 0: a suffix proposal scoring that much drafts alone

  def _suffix_params(self) -> SuffixParams:
    return SuffixParams(self.max_spec_tokens, self.max_spec_factor, self.max_spec_offset,
                        self.min_token_prob, self.max_tree_depth, self.max_cached_requests)

  def check(self, where: str) -> None:
    super().check(where)
    self._suffix_params().check(where)

  def suffix(self) -> SuffixProposer:
    return self._suffix_params().proposer()

  @property
  def threshold(self) -> float | None:
    return None if self.score_threshold < 0 else self.score_threshold


@dataclasses.dataclass(frozen=True)
class TreeSuffixParams(SuffixHybridParams, TreeMethodParams):
  """The drafter's tree's fields, then SuffixDecoding's (`SuffixHybridParams`)."""


@register("tree_suffix", TreeSuffixParams, drafter_passes=lambda p: p.depth)
def _tree_suffix(target, draft, p: TreeSuffixParams, mesh=None):
  """The drafter model's EAGLE-2 tree with SuffixDecoding's proposal merged into it (or, with
  `score_threshold`, alone where it scores that much), one verification
  (`hybrid.TreeSuffixDecoder`); one device."""
  if mesh is not None:
    raise ValueError("tree_suffix runs on one device (its suffix trees are the host's)")
  return TreeSuffixDecoder(_blocks(target, mesh), target.config, _blocks(draft, mesh),
                           draft.config, tree=TreeParams(p.top_k, p.depth, p.total_tokens),
                           draft_vocab=_load_subset(p.subset, target), suffix=p.suffix(),
                           score_threshold=p.threshold, self_sizing=p.self_sizing)


# --- static drafter vocabularies (VocabTrim, FR-Spec) ---------------------------------------
# Both draft with a trimmed LM head over the top-k tokens of a counts file made by
# `python -m vocabjax.calibrate count`; they differ in what was counted: VocabTrim counts
# completions generated by a model (the target, its best choice), FR-Spec a raw corpus. The
# subset is saved beside the counts (`subset-k{k}.npz`) on first use and reloaded after.
# depth 0 drafts a chain of gamma tokens, depth > 0 an EAGLE-2 tree.

def _check_draft(where: str, method: str, k: int, gamma: int, top_k: int, depth: int,
                 total_tokens: int) -> None:
  """k and gamma positive; a tree's parameters valid and its top_k within the k candidates."""
  if k < 1 or not 1 <= gamma <= MAX_TREE_NODES:
    raise ConfigError(f"{where}: {method} needs k >= 1 and 1 <= gamma <= {MAX_TREE_NODES}, got "
                      f"k={k}, gamma={gamma}")
  if depth:
    _tree(where, method, top_k, depth, total_tokens)
    if top_k > k:
      raise ConfigError(f"{where}: {method}.top_k={top_k} exceeds k={k}")


def _chain_or_tree(target, draft, p, draft_vocab, mesh=None):
  if p.depth:
    return _tree_decoder(target, draft, TreeParams(p.top_k, p.depth, p.total_tokens),
                         draft_vocab, mesh)
  return _chain_decoder(target, draft, p.gamma, draft_vocab, mesh)


def _passes(p) -> int:
  return p.depth or p.gamma


@dataclasses.dataclass(frozen=True)
class StaticVocabParams:
  counts: str  # a counts file (`python -m vocabjax.calibrate count`)
  k: int  # subset size: the most frequent k tokens (+ special tokens)
  gamma: int = 3
  top_k: int = 0
  depth: int = 0  # 0: chain drafting
  total_tokens: int = 0

  KIND: typing.ClassVar[str] = ""  # the counts' kind this method takes
  METHOD: typing.ClassVar[str] = ""

  def check(self, where: str) -> None:
    _check_draft(where, self.METHOD, self.k, self.gamma, self.top_k, self.depth,
                 self.total_tokens)
    try:
      counts = Counts.load(self.counts)
    except CalibrationError as e:
      raise ConfigError(f"{where}: {e}") from None
    meta = counts.meta
    if self.k > counts.vocab_size:
      raise ConfigError(f"{where}: {self.METHOD}.k={self.k} exceeds the vocabulary of "
                        f"{counts.vocab_size} tokens in {self.counts}")
    if meta.get("kind") != self.KIND:
      other = "frspec" if self.METHOD == "vocabtrim" else "vocabtrim"
      raise ConfigError(f"{where}: {self.METHOD} uses counts of {self.KIND} data, but "
                        f"{self.counts} counts {meta.get('kind')} data ({meta.get('source')}); "
                        f"use {other} for it")


@dataclasses.dataclass(frozen=True)
class VocabTrimParams(StaticVocabParams):
  KIND: typing.ClassVar[str] = "generated"
  METHOD: typing.ClassVar[str] = "vocabtrim"


@dataclasses.dataclass(frozen=True)
class FrSpecParams(StaticVocabParams):
  KIND: typing.ClassVar[str] = "text"
  METHOD: typing.ClassVar[str] = "frspec"


def _static_vocab(target, draft, p: StaticVocabParams, mesh=None):
  """Chain drafting (depth 0) or an EAGLE-2 tree (depth > 0) with the trimmed drafter head."""
  if target.tokenizer is None:
    raise ValueError(f"{target.source} has no tokenizer: the counts' tokenizer identity "
                     f"cannot be checked")
  sub = load_or_select(p.counts, target.tokenizer, target.config.vocab_size,
                       target.eos_token_ids, k=p.k)
  return _chain_or_tree(target, draft, p, sub, mesh)


register("vocabtrim", VocabTrimParams, drafter_passes=_passes,
         head_rows=lambda p: p.k)(_static_vocab)
register("frspec", FrSpecParams, drafter_passes=_passes, head_rows=lambda p: p.k)(_static_vocab)


# --- speculative vocabulary (SpecVocab) -----------------------------------------------------
# The drafter's LM head is replaced per step by the top-k candidates of a trained ranker
# (`python -m vocabjax.train.ranker`), exact logits for those only (the indexed LM head).

def ranker_shapes(path: str, where: str) -> tuple[int, int, int]:
  """(V, d', d) of a ranker file, from its header; an unreadable file is a ConfigError."""
  path = _local(path, "file", where)
  if not Path(path).is_file():
    raise ConfigError(f"{where}: ranker={path!r} is not a readable ranker file (no such file; "
                      f"train one with `python -m vocabjax.train.ranker --config "
                      f"configs/train/ranker_*.yaml`)")
  try:
    read_metadata(path)
    with safe_open(path, framework="numpy") as f:
      V, R = f.get_slice("vocab").get_shape()
      _, D = f.get_slice("down").get_shape()
  except (RankerError, OSError, SafetensorError) as e:
    raise ConfigError(f"{where}: ranker={path!r} is not a readable ranker file ({e})") from None
  return int(V), int(R), int(D)


def _check_ranker_k(where: str, method: str, ranker: str, k: int) -> None:
  V, _, _ = ranker_shapes(ranker, where)
  if k > V:
    raise ConfigError(f"{where}: {method}.k={k} exceeds the ranker's vocabulary of {V} tokens")


@dataclasses.dataclass(frozen=True)
class SpecVocabParams:
  ranker: str  # a ranker file (`python -m vocabjax.train.ranker`)
  k: int  # candidates per step
  gamma: int = 3
  top_k: int = 0
  depth: int = 0  # 0: chain drafting
  total_tokens: int = 0

  def check(self, where: str) -> None:
    _check_draft(where, "specvocab", self.k, self.gamma, self.top_k, self.depth,
                 self.total_tokens)
    _check_ranker_k(where, "specvocab", self.ranker, self.k)


def _ranked_rows(p) -> int:
  return ranked_head_rows(p.k, *ranker_shapes(p.ranker, "specvocab"))


@register("specvocab", SpecVocabParams, drafter_passes=_passes, head_rows=_ranked_rows)
def _specvocab(target, draft, p: SpecVocabParams, mesh=None):
  """Chain drafting (depth 0) or an EAGLE-2 tree (depth > 0) over the ranker's candidates."""
  return _chain_or_tree(target, draft, p, SpeculativeVocab(Ranker.load(p.ranker), k=p.k), mesh)


# --- EAGLE head (EAGLE-3 and EAGLE-1/2 checkpoints) --------------------------------------------
# An EAGLE-3 head directory (`python -m vocabjax.train.eagle`, the authors' `yuhuili/EAGLE3-*`,
# or one exported by SpecForge for SGLang / vLLM) or an EAGLE-1/2 head (`yuhuili/EAGLE-*`, over
# the target's own LM head: FR-Spec's and VocabTrim's setting) drafts an EAGLE-2 tree from the
# target's own features; no separate drafter.

def _eagle_config(path: str, where: str):
  path = _local(path, "eagle", where)
  try:
    return load_head_config(path)
  except CheckpointError as e:
    raise ConfigError(f"{where}: eagle.head={path!r}: {e}") from None


@dataclasses.dataclass(frozen=True)
class EagleParams:
  head: str  # an EAGLE head directory (EAGLE-3 or EAGLE-1/2) or hub id
  top_k: int = 4  # the tree (EAGLE's own evaluation defaults are 10, 6, 59: for GPUs)
  depth: int = 4
  total_tokens: int = 16
  lm_head: str = "own"  # own: the head's rows (d2t); target: the target's LM head (an
  #   EAGLE-1/2 head's own is the target's: both the same)
  subset: str = ""  # a saved static subset for the head's drafting vocabulary
  ranker: str = ""  # or a SpecVocab ranker's per-step candidates (with k)
  k: int = 2048
  min_confidence: float = 0.0  # draft only when the head's top probability reaches it

  def check(self, where: str) -> None:
    if self.lm_head not in ("own", "target"):
      raise ConfigError(f"{where}: eagle.lm_head={self.lm_head!r} must be 'own' or 'target'")
    if not 0.0 <= self.min_confidence < 1.0:
      raise ConfigError(f"{where}: eagle.min_confidence={self.min_confidence} must lie in "
                        f"[0, 1) (the head's top probability at the root; 0 drafts always)")
    _tree(where, "eagle", self.top_k, self.depth, self.total_tokens)
    hc = _eagle_config(self.head, where)
    if self.lm_head == "own" and self.top_k > hc.draft_vocab_size:
      raise ConfigError(f"{where}: eagle.top_k={self.top_k} exceeds the head's vocabulary of "
                        f"{hc.draft_vocab_size} tokens")
    if self.subset and self.ranker:
      raise ConfigError(f"{where}: eagle takes a subset or a ranker, not both")
    _check_subset_file(where, "eagle", self.subset)
    if self.ranker:
      _check_ranker_k(where, "eagle", self.ranker, self.k)


def _eagle_rows(p: EagleParams) -> int:
  """LM-head rows the head drafts over per step: a subset's K, a ranker's k + its cost in rows,
  else the head's own rows or the target's V."""
  if p.subset:
    try:
      return len(VocabSubset.load(_local(p.subset, "file")).ids)
    except SubsetError as e:
      raise ConfigError(f"eagle.subset={p.subset!r}: {e}") from None
  if p.ranker:
    return ranked_head_rows(p.k, *ranker_shapes(p.ranker, "eagle"))
  hc = _eagle_config(p.head, "eagle")
  return hc.draft_vocab_size if p.lm_head == "own" else hc.layer.vocab_size


@register("eagle", EagleParams, needs_draft=False, drafter_passes=lambda p: p.depth,
          head_rows=_eagle_rows,
          drafter_params=lambda p: _eagle_config(p.head, "eagle").num_params(_eagle_rows(p)))
def _eagle(target, draft, p: EagleParams, mesh=None):
  """EAGLE-2 tree drafting with an EAGLE-3 head trained for `target` (refused otherwise)."""
  del draft
  return EagleDecoder(_blocks(target, mesh), target.config, *_eagle_head(target, p), mesh=mesh,
                      tree=TreeParams(p.top_k, p.depth, p.total_tokens), lm_head=p.lm_head,
                      draft_vocab=_eagle_vocab(target, p), min_confidence=p.min_confidence)


_HEADS: list = []  # the last few loaded EAGLE heads: (key, target params, (params, config))
_HEADS_KEPT = 2


def _eagle_head(target, p: EagleParams):
  """(head params, head config) of `p.head`, refused when trained for another target.

  A suite's methods on one head (the papers' suite: 13 on the full-vocabulary head) share one
  loaded copy: the last `_HEADS_KEPT` heads are kept, keyed by the file (path, size, mtime),
  the dtype and whether the head's own LM head is read, for the same target params object.
  With `lm_head: target` the head's own rows (in a full-vocabulary head, a copy of the
  target's head) are not read at all."""
  path = Path(p.head).resolve()
  try:
    weights = path / "model.safetensors"
    st = (weights if weights.exists() else path / "pytorch_model.bin").stat()
    key = (str(path), st.st_size, st.st_mtime_ns, str(target.params["embed"].dtype),
           p.lm_head == "own")
  except OSError:
    key = None  # load_head names the problem
  for k, params_ref, loaded in _HEADS:
    if key is not None and k == key and params_ref is target.params:
      return loaded
  hc, params, _ = load_head(p.head, target_config=target.config, target_params=target.params,
                              dtype=target.params["embed"].dtype, lm_head=p.lm_head == "own")
  if key is not None:
    _HEADS.insert(0, (key, target.params, (params, hc)))
    del _HEADS[_HEADS_KEPT:]
  return params, hc


def release_loaded_heads() -> None:
  """Forget the shared EAGLE heads (`_eagle_head`): they hold the target's params too, so a
  caller that frees its models (the eval before `--compare-torch` loads transformers' copy)
  must drop these references as well, or neither is freed."""
  _HEADS.clear()


def _eagle_vocab(target, p: EagleParams):
  return (SpeculativeVocab(Ranker.load(p.ranker), k=p.k) if p.ranker
          else _load_subset(p.subset, target))


@dataclasses.dataclass(frozen=True)
class EaglePldParams(EagleParams):
  gamma: int = 4  # prompt lookup: most tokens per continuation
  max_ngram: int = 3  # longest context n-gram matched
  min_ngram: int = 1  # shortest
  candidates: int = 1  # continuations merged into the head's tree

  def check(self, where: str) -> None:
    super().check(where)
    PldParams(self.gamma, self.max_ngram, self.min_ngram, self.candidates).check(where)


@register("eagle_pld", EaglePldParams, needs_draft=False, drafter_passes=lambda p: p.depth,
          head_rows=_eagle_rows,
          drafter_params=lambda p: _eagle_config(p.head, "eagle").num_params(_eagle_rows(p)))
def _eagle_pld(target, draft, p: EaglePldParams, mesh=None):
  """The EAGLE head's tree with prompt lookup's continuations merged into it, one verification
  (`EagleLookupDecoder`); one device."""
  del draft
  return EagleLookupDecoder(_blocks(target, mesh), target.config, *_eagle_head(target, p),
                            mesh=mesh, tree=TreeParams(p.top_k, p.depth, p.total_tokens),
                            lm_head=p.lm_head, draft_vocab=_eagle_vocab(target, p),
                            gamma=p.gamma, max_ngram=p.max_ngram, min_ngram=p.min_ngram,
                            candidates=p.candidates, min_confidence=p.min_confidence)


@dataclasses.dataclass(frozen=True)
class EagleSuffixParams(SuffixHybridParams, EagleParams):
  """EAGLE's fields, then SuffixDecoding's (`SuffixHybridParams`)."""


@register("eagle_suffix", EagleSuffixParams, needs_draft=False,
          drafter_passes=lambda p: p.depth, head_rows=_eagle_rows,
          drafter_params=lambda p: _eagle_config(p.head, "eagle").num_params(_eagle_rows(p)))
def _eagle_suffix(target, draft, p: EagleSuffixParams, mesh=None):
  """The EAGLE head's tree with SuffixDecoding's proposal merged into it (or, with
  `score_threshold`, alone where it scores that much), one verification
  (`EagleSuffixDecoder`); one device."""
  del draft
  if mesh is not None:
    raise ValueError("eagle_suffix runs on one device (its suffix trees are the host's)")
  return EagleSuffixDecoder(_blocks(target, mesh), target.config, *_eagle_head(target, p),
                            tree=TreeParams(p.top_k, p.depth, p.total_tokens),
                            lm_head=p.lm_head, draft_vocab=_eagle_vocab(target, p),
                            suffix=p.suffix(), min_confidence=p.min_confidence,
                            score_threshold=p.threshold)


# --- Medusa heads ---------------------------------------------------------------------------
# Medusa-1 heads trained for the target (`python -m vocabjax.train.medusa`, or Medusa's own
# checkpoints) draft a static tree of top-k ranks (`choices`: Medusa's `medusa_choices` as JSON,
# or every path of ranks < top_k down to `depth`); `subset` / `counts` + `k` restrict every
# head's projection to K tokens (FR-Spec / VocabTrim on Medusa).

def _medusa_meta(path: str, where: str) -> dict:
  import json

  path = _local(path, "medusa", where)
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
    _check_subset_file(where, "medusa", self.subset)
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
  K = p.k if p.counts else (VocabSubset.load(_local(p.subset, "file")).size if p.subset
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
    vocab = _load_subset(p.subset, target)
  return MedusaDecoder(_blocks(target, mesh), target.config, heads, mc, mesh=mesh,
                       choices=p.tree_choices(mc.num_heads), draft_vocab=vocab)


# --- cross-vocabulary drafting (OmniDraft) --------------------------------------------------
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
  return CrossVocabDecoder(_blocks(target, mesh), target.config, params, draft.config,
                           target_tokenizer=target.tokenizer, draft_tokenizer=draft.tokenizer,
                           gamma=p.gamma, ngram=p.ngram,
                           acceptance_head=head if p.adaptive else None,
                           stop_threshold=p.threshold, rule=p.rule, mesh=mesh)


__all__ = ["METHODS", "Method", "register", "ranker_shapes", "ArParams", "ChainParams",
           "TreeMethodParams", "PldParams", "VocabTrimParams", "FrSpecParams", "SpecVocabParams",
           "EagleParams", "MedusaParams", "CrossVocabParams"]
