"""The registry of decoding methods: a method name and its parameters into a decoder, for the
eval suites (`methods:` entries of a YAML suite), `python -m vocabjax.generate` (its flags) and
the Python API alike.

A method is registered beside its parameter dataclass, in one file (`register`): the
dataclass's fields are its parameters (types checked, defaults shown by `--help`; its `check`
validates the values, naming the field and the value), the decorated builder turns (target
Model, draft Model | None, params, mesh) into a decoder (a `SpeculativeEngine` running the
method's proposer, or plain decoding), and the registration says what the reports need for
MBSU (drafter forwards per block, the drafter's LM-head rows and params).

    method = METHODS["chain"]
    params = method.parse({"gamma": 3}, where="my suite")   # ChainParams(gamma=3, ...)
    decoder = method.make(target, draft, params)

The library's own methods, one module each beside this one (every module of this package is
imported with it): `plain` (ar), `drafter` (chain, tree), `lookup` (pld), `ngram` (the whole
method in one file: docs/extending.md's worked example), `suffix` (suffix, tree_suffix),
`vocab` (vocabtrim, frspec, specvocab), `eagle` (eagle, eagle_pld, eagle_suffix), `medusa`,
`crossvocab`. A method of your own registers itself the same way when its file is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from pathlib import Path
from typing import Any, Callable

from vocabjax.calibrate.counts import tokenizer_identity
from vocabjax.checkpoints import hub
from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.decoding.drafter import block_layout
from vocabjax.decoding.sizing import parse_table
from vocabjax.decoding.tree import TreeParams
from vocabjax.errors import ConfigError
from vocabjax.vocab.subset import VocabSubset


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
      params = local_files(params, self.name, where)
      params.check(where)
    return params

  def check(self, raw: dict, where: str, *, check_files: bool = True) -> None:
    """`parse`, for validation only."""
    self.parse(raw, where, check_files=check_files)

  def make(self, target, draft, params, mesh=None, *, allow_bin: bool | None = None,
           progress: bool | None = None):
    """The decoder; `params` is this method's dataclass or a mapping (parsed first). `mesh`:
    a ("data", "model") mesh (`vocabjax.sharding.make_mesh`) the decoder runs on. A draft
    model given to a method that takes none, or none to one that needs it, is a ConfigError
    (as the command line refuses `--draft`), not silently left out. `allow_bin`: read pickled
    weights of the heads and files it names (`--allow-bin`; None: `VOCABJAX_ALLOW_BIN`).
    `progress`: the bars of the downloads of heads and files named by hub id (None: shown,
    unless within `hub.showing_progress(False)`)."""
    if draft is not None and not self.needs_draft:
      raise ConfigError(f"method {self.name!r} takes no draft model (its drafter is its own "
                        f"head or the context); pass draft=None")
    if draft is None and self.needs_draft:
      raise ConfigError(f"method {self.name!r} needs a draft model; pass one")
    if not isinstance(params, (dict, self.params)):
      raise ConfigError(f"method {self.name!r}: params must be a mapping or a "
                        f"{self.params.__name__}, got {params!r} ({type(params).__name__})")
    with hub.allowing_bin(allow_bin), hub.showing_progress(progress):
      if isinstance(params, dict):
        params = self.parse(params, f"method {self.name}")
      return self.build(target, draft, params, mesh)


METHODS: dict[str, Method] = {}


def register(name: str, params: type, *, needs_draft: bool = True, drafter_passes=None,
             head_rows=None, drafter_params=None, timed: bool = True):
  """`@register(name, Params, ...)` on a builder `(target, draft, params, mesh=None) ->
  decoder`: the method `name` with the frozen dataclass `Params` as its parameters (it needs a
  `check(where)` method). `needs_draft`: whether it takes a draft model; `drafter_passes`,
  `head_rows`, `drafter_params`: params -> its drafter forwards per block, LM-head rows and
  params read per token (MBSU); `timed`: its decoders time their step's parts."""
  if not dataclasses.is_dataclass(params) or not params.__dataclass_params__.frozen:
    raise TypeError(f"method {name!r}: its parameters must be a frozen dataclass, got "
                    f"{params!r}")
  if not callable(getattr(params, "check", None)):
    raise TypeError(f"method {name!r}: {params.__name__} needs a check(where) method")

  def deco(fn):
    METHODS[name] = Method(name, params, fn, needs_draft, drafter_passes, head_rows,
                           drafter_params, timed)
    return fn
  return deco


# --- what the methods share -----------------------------------------------------------------

# the parameters that name files, and what a hub id in them fetches (`checkpoints.hub`)
HUB_FIELDS = {"head": "eagle", "heads": "medusa", "ranker": "file", "subset": "file",
              "counts": "file", "drafter": "folder"}


def local_path(value: str, kind: str, where: str = "", label: str = "",
               progress: bool | None = None) -> str:
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


def local_files(params, method: str, where: str):
  """`params` with each hub id among its file parameters (`HUB_FIELDS`) replaced by the local
  path it is downloaded to (with progress unless within `hub.showing_progress(False)`); a
  local path that exists is kept as it is."""
  changes = {}
  for field, kind in HUB_FIELDS.items():
    value = getattr(params, field, "")
    local = local_path(value, kind, where, f"{method}.{field}")
    if local != value:
      changes[field] = local
  return dataclasses.replace(params, **changes) if changes else params


def read_head_config(value: str, where: str, label: str, load: Callable):
  """`load(path)` of a head directory named by path or hub id (fetched, as the kind "eagle": its
  config.json and weights); a CheckpointError becomes a ConfigError naming the parameter
  (`label`, e.g. eagle.head) and the path."""
  path = local_path(value, "eagle", where)
  try:
    return load(path)
  except CheckpointError as e:
    raise ConfigError(f"{where}: {label}={path!r}: {e}") from None


def _is(value, typ: type) -> bool:
  """`value` fits a parameter of type `typ` (a bool is not an int here; an int is a float)."""
  if typ is bool or isinstance(value, bool):
    return typ is bool and isinstance(value, bool)
  return isinstance(value, (int, float) if typ is float else typ)


def tree_params(where: str, what: str, top_k: int, depth: int, total_tokens: int) -> TreeParams:
  """TreeParams, a bad one a ConfigError naming the method."""
  try:
    return TreeParams(top_k=top_k, depth=depth, total_tokens=total_tokens)
  except ValueError as e:
    raise ConfigError(f"{where}: {what}: {e}") from None


def check_sizing_table(where: str, what: str, spec: str) -> None:
  """A method's `sizing_table` text ("1:4,8:0": `decoding.sizing.parse_table`), refused by
  entry where it does not parse."""
  if spec:
    try:
      parse_table(spec)
    except ValueError as e:
      raise ConfigError(f"{where}: {what}.sizing_table={spec!r}: {e}") from None


def sizing_table_of(spec: str):
  """A method's `sizing_table` text as the engine takes it (None when empty)."""
  return spec or None


def check_subset_file(where: str, what: str, path: str) -> None:
  if path and not Path(path).is_file():
    raise ConfigError(f"{where}: {what}.subset={path!r}: no such file (make one with `python "
                      f"-m vocabjax.calibrate select`)")


def load_subset(path: str, target) -> VocabSubset | None:
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


def model_blocks(model, mesh):
  """A model's params in the layout its block programs run best in (converted once per model
  and shared by every method of a run); on a mesh the sharding rules' [out, in] layout."""
  return model.params if mesh is not None else model.in_layout(block_layout())


def _import_builtins() -> None:
  """Import every module of this package: each registers its methods. The known ones first,
  in the registry's order (how methods are listed); a module added here later registers itself
  with no edit to this file."""
  order = ("plain", "drafter", "lookup", "ngram", "suffix", "vocab", "eagle", "medusa",
           "crossvocab")
  found = {m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")}
  for name in [*[n for n in order if n in found], *sorted(found - set(order))]:
    importlib.import_module(f"{__name__}.{name}")


_import_builtins()

__all__ = ["METHODS", "Method", "register", "HUB_FIELDS", "local_path", "local_files",
           "read_head_config",
           "tree_params", "check_subset_file", "load_subset", "model_blocks"]
