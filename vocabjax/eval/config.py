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
  seeds: tuple[int, ...] = (0,)
  chat: bool = True
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
    blob = json.dumps(d, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

  def as_dict(self) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(self), default=str))


_TOP = {f.name for f in dataclasses.fields(EvalConfig)}


def config_from_dict(raw: dict, *, name: str = "custom") -> EvalConfig:
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
    params = {k: v for k, v in m.items() if k not in ("name", "method")}
    METHODS[m["method"]].check(params, where)
    methods.append(MethodSpec(name=label, method=m["method"], params=tuple(sorted(params.items()))))
  if not methods:
    raise ConfigError(f"config {name}: 'methods' is empty")
  if "ar" not in [m.method for m in methods]:
    raise ConfigError(f"config {name}: methods need an 'ar' baseline (speedup and output "
                      f"match are measured against it in the same run)")
  if any(METHODS[m.method].needs_draft for m in methods) and not raw.get("draft"):
    raise ConfigError(f"config {name}: a speculative method needs 'draft'")
  check_positive(f"config {name}", "max_new_tokens", raw.get("max_new_tokens", 1))
  check_positive(f"config {name}", "max_len", raw.get("max_len"))
  temp = float(raw.get("temperature", 0.0))
  if temp < 0:
    raise ConfigError(f"config {name}: temperature must be >= 0, got {temp}")
  seeds = raw.get("seeds", [0])
  if not seeds or not all(isinstance(s, int) for s in seeds):
    raise ConfigError(f"config {name}: seeds must be a non-empty list of integers, got {seeds!r}")
  return EvalConfig(
      target=str(raw["target"]), draft=raw.get("draft"), datasets=datasets,
      methods=tuple(methods), max_new_tokens=raw.get("max_new_tokens", 128), temperature=temp,
      top_k=int(raw.get("top_k", 0)), top_p=float(raw.get("top_p", 1.0)), seeds=tuple(seeds),
      chat=bool(raw.get("chat", True)), max_len=raw.get("max_len"), dtype=raw.get("dtype"),
      draft_dtype=raw.get("draft_dtype"), time_split=bool(raw.get("time_split", True)),
      name=raw.get("name", name), mesh=_mesh(raw.get("mesh"), name))


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


def load_config(name_or_path: str | Path) -> EvalConfig:
  """A shipped suite by name (`configs/eval/<name>.yaml`) or a YAML file by path."""
  path = suite_path(name_or_path)
  if not path.is_file():
    raise ConfigError(f"no eval config at {path}; shipped suites: {shipped_suites()}")
  return config_from_dict(read_suite(path), name=path.stem)
