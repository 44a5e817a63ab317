"""Eval suite configuration: frozen dataclasses, built from YAML only here, at the edge.

A suite names the target and drafter, the datasets and how many prompts of each, the decoding
settings and the methods with their parameters. `configs/eval/*.yaml` holds the shipped suites
(the training recipes are in `configs/train/`); `load_config("default")` reads
`configs/eval/default.yaml`, any other argument is a path.

    target: qwen2.5-coder-1.5b-instruct       # registry name, HF dir or .gguf
    draft: qwen2.5-coder-0.5b-instruct
    datasets:
      - {kind: spec_bench, per_group: 1}      # path: any Spec-Bench-format jsonl
      - {kind: humaneval, limit: 1}
    max_new_tokens: 128
    methods:
      - {name: ar, method: ar}
      - {name: chain_g3, method: chain, gamma: 3}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from vocabjax.errors import ConfigError
from vocabjax.methods import METHODS
from vocabjax.prompts import (EVAL_CONFIG_DIR, DatasetSpec, check_positive, parse_datasets,
                              read_suite, suite_path)
from vocabjax.sharding import parse_mesh


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  name: str  # label in tables and files (unique)
  method: str  # registered method (vocabjax.methods.METHODS)
  params: tuple[tuple[str, Any], ...] = ()  # method parameters, e.g. (("gamma", 3),)
  draft: str | None = None  # this method's own drafter (the suite's `draft` otherwise): a
  #   drafter of another tokenizer (OmniDraft's `crossvocab`) beside same-vocabulary methods

  @property
  def kwargs(self) -> dict:
    return dict(self.params)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  target: str
  draft: str | None
  datasets: tuple[DatasetSpec, ...]
  methods: tuple[MethodSpec, ...]
  max_new_tokens: int = 128
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  draft_in_set: bool = True  # drafts within the request's top-k / top-p (`SamplingParams`)
  seeds: tuple[int, ...] = (0,)
  chat: bool = True
  # the chat template's variables, e.g. (("enable_thinking", False),) for Qwen3
  chat_template_kwargs: tuple[tuple[str, Any], ...] = ()
  max_len: int | None = None  # cache slots; None = sized per prompt
  dtype: str | None = None  # None = the backend default (f32 on CPU, bf16 on GPU/TPU)
  draft_dtype: str | None = None  # the drafter's; None = `dtype` (verification by the target
  #   keeps decoding exact whatever the drafter computes in)
  time_split: bool = True  # time drafter / LM head / verification per method
  name: str = "custom"
  mesh: str | None = None  # "data=D,model=M": every method on a device mesh (`sharding`)

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  def fingerprint(self) -> str:
    """Hash of everything that changes results (a result directory is tied to one)."""
    d = dataclasses.asdict(self)
    if d["mesh"] is None:  # one device: the fingerprint of suites recorded before meshes
      d.pop("mesh")
    if not d["chat_template_kwargs"]:  # and before chat template variables
      d.pop("chat_template_kwargs")
    if d["draft_in_set"]:  # and before drafting outside the request's set could be asked
      d.pop("draft_in_set")
    for m in d["methods"]:  # and before a method could name its own drafter
      if m.get("draft") is None:
        m.pop("draft", None)
    for ds in d["datasets"]:  # and before SPEED-Bench's configurations
      if ds.get("config") is None:
        ds.pop("config", None)
    blob = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

  def as_dict(self) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(self), default=str))


_TOP = {f.name for f in dataclasses.fields(EvalConfig)}


def config_from_dict(raw: dict, *, name: str = "custom", check_files: bool = True) -> EvalConfig:
  """Validate a parsed YAML mapping and build the config; errors name the field and value."""
  if not isinstance(raw, dict):
    raise ConfigError(f"config {name}: expected a mapping at the top level, got {type(raw).__name__}")
  unknown = sorted(set(raw) - _TOP)
  if unknown:
    raise ConfigError(f"config {name}: unknown fields {unknown}; known: {sorted(_TOP)}")
  for req in ("target", "datasets", "methods"):
    if req not in raw:
      raise ConfigError(f"config {name}: missing required field {req!r}")
  datasets = parse_datasets(raw["datasets"], f"config {name}")
  methods, seen = [], set()
  for i, m in enumerate(raw["methods"] or []):
    where = f"config {name}: methods[{i}]"
    if not isinstance(m, dict) or "method" not in m:
      raise ConfigError(f"{where}: expected a mapping with a 'method', got {m!r}")
    if m["method"] not in METHODS:
      raise ConfigError(f"{where}: unknown method {m['method']!r}; registered: {sorted(METHODS)}")
    label = m.get("name", m["method"])
    if label in seen:
      raise ConfigError(f"{where}: duplicate method name {label!r}")
    seen.add(label)
    params = {k: v for k, v in m.items() if k not in ("name", "method", "draft")}
    own = m.get("draft")
    if own is not None and (not isinstance(own, str) or not own):
      raise ConfigError(f"{where}: draft must name a drafter (registry name, HF directory, "
                        f".gguf file or hub id), got {own!r}")
    if own is not None and not METHODS[m["method"]].needs_draft:
      raise ConfigError(f"{where}: method {m['method']!r} drafts without a drafter model; "
                        f"draft={own!r} does not apply to it")
    METHODS[m["method"]].check(params, where, check_files=check_files)
    methods.append(MethodSpec(name=label, method=m["method"],
                              params=tuple(sorted(params.items())), draft=own))
  if not methods:
    raise ConfigError(f"config {name}: 'methods' is empty")
  if "ar" not in [m.method for m in methods]:
    raise ConfigError(f"config {name}: methods need an 'ar' baseline (speedup and output "
                      f"match are measured against it in the same run)")
  orphans = [m.name for m in methods if METHODS[m.method].needs_draft and not m.draft]
  if orphans and not raw.get("draft"):
    raise ConfigError(f"config {name}: a speculative method needs 'draft' (the suite's, or "
                      f"its own `draft:`): {orphans}")
  where = f"config {name}"
  check_positive(where, "max_new_tokens", raw.get("max_new_tokens", 1))
  check_positive(where, "max_len", raw.get("max_len"))
  temp = _number(raw, "temperature", 0.0, where)
  if temp < 0:
    raise ConfigError(f"{where}: temperature must be >= 0, got {temp}")
  top_k = raw.get("top_k", 0)
  if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
    raise ConfigError(f"{where}: top_k must be an integer >= 0 (0: off), got {top_k!r}")
  top_p = _number(raw, "top_p", 1.0, where)
  if not 0 < top_p <= 1:
    raise ConfigError(f"{where}: top_p must be in (0, 1], got {top_p}")
  seeds = raw.get("seeds", [0])
  if (not isinstance(seeds, list) or not seeds
      or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
    raise ConfigError(f"{where}: seeds must be a non-empty list of integers, got {seeds!r}")
  if not all(0 <= s < 2 ** 32 for s in seeds):  # jax.random.key takes 32 bits: 2**32 is 0
    raise ConfigError(f"{where}: seeds must lie in [0, 2**32), got {seeds!r}")
  if len(set(seeds)) != len(seeds):
    raise ConfigError(f"{where}: seeds repeat ({seeds!r}): every run would be done twice")
  for key in ("dtype", "draft_dtype"):
    value = raw.get(key)
    if value is not None and value not in WEIGHT_DTYPES:
      raise ConfigError(f"{where}: {key} must be one of {WEIGHT_DTYPES} (or absent: the "
                        f"backend's default), got {value!r}")
  for key in ("target", "draft", "name"):
    if raw.get(key) is not None and not isinstance(raw[key], str):
      raise ConfigError(f"{where}: {key} must be a string, got {raw[key]!r}")
  suite_name = raw.get("name", name)
  if not SUITE_NAME.fullmatch(str(suite_name)) or suite_name in (".", ".."):
    raise ConfigError(f"{where}: name={suite_name!r} must be a name (letters, digits, '.', '_', "
                      f"'-'; not a path): it names the result directory runs/<name>")
  return EvalConfig(
      target=str(raw["target"]), draft=raw.get("draft"), datasets=datasets,
      methods=tuple(methods), max_new_tokens=raw.get("max_new_tokens", 128), temperature=temp,
      top_k=top_k, top_p=top_p, draft_in_set=_flag(raw, "draft_in_set", True, where),
      seeds=tuple(seeds), chat=_flag(raw, "chat", True, where),
      chat_template_kwargs=_template_kwargs(raw, where),
      max_len=raw.get("max_len"), dtype=raw.get("dtype"), draft_dtype=raw.get("draft_dtype"),
      time_split=_flag(raw, "time_split", True, where), name=raw.get("name", name),
      mesh=_mesh(raw.get("mesh"), name))


SUITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# the dtypes a suite may ask of `load_model` (`parse_dtype` accepts these and their short names;
# "gguf" keeps a GGUF file's own quantized blocks, "gguf-q8" multiplies them as llama.cpp does)
WEIGHT_DTYPES = ("float32", "bfloat16", "float16", "int8", "int4", "gguf", "gguf-q8")


def _template_kwargs(raw: dict, where: str) -> tuple[tuple[str, Any], ...]:
  """`chat_template_kwargs`: a mapping of the chat template's variables to YAML scalars, only
  with `chat` on."""
  value = raw.get("chat_template_kwargs") or {}
  if not isinstance(value, dict) or not all(
      isinstance(k, str) and (v is None or isinstance(v, (bool, int, float, str)))
      for k, v in value.items()):
    raise ConfigError(f"{where}: chat_template_kwargs must map variable names to scalars "
                      f"(e.g. {{enable_thinking: false}}), got {value!r}")
  if value and not raw.get("chat", True):
    raise ConfigError(f"{where}: chat_template_kwargs {sorted(value)} with chat: false (the "
                      f"template is not applied)")
  return tuple(sorted(value.items()))


def _flag(raw: dict, key: str, default: bool, where: str) -> bool:
  """A YAML boolean; a quoted "false" (a string, which bool() reads as True) is refused."""
  value = raw.get(key, default)
  if not isinstance(value, bool):
    raise ConfigError(f"{where}: {key} must be true or false (unquoted), got {value!r}")
  return value


def _number(raw: dict, key: str, default: float, where: str) -> float:
  """A finite real number (ints accepted); strings, booleans, .nan and .inf refused."""
  import math

  value = raw.get(key, default)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
  return float(value)


def _mesh(value, name: str) -> str | None:
  """A suite's `mesh:` ("data=D,model=M"), checked for syntax."""
  if value is None:
    return None

  try:
    parse_mesh(str(value))
  except ValueError as e:
    raise ConfigError(f"config {name}: {e}") from None
  return str(value)


def shipped_suites() -> list[str]:
  """Names of the eval suites under configs/eval/."""
  return sorted(p.stem for p in EVAL_CONFIG_DIR.glob("*.yaml"))


def load_config(name_or_path: str | Path, *, check_files: bool = True) -> EvalConfig:
  """A shipped suite by name (`configs/eval/<name>.yaml`) or a YAML file by path.
  `check_files=False`: the methods' parameter values and files are not checked
  (`Method.parse`), for reports of recorded runs."""
  path = suite_path(name_or_path)
  if not path.is_file():
    raise ConfigError(f"no eval config at {path}; shipped suites: {shipped_suites()}")
  return config_from_dict(read_suite(path), name=path.stem, check_files=check_files)
