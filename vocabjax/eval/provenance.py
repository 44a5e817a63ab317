"""What a suite's records depend on beyond its config: the content of every model and method
file, the questions' text, the library version and the machine.

A result directory resumes only records made from the same inputs (`prepare_dir` compares
them): a drafter directory replaced in place, a question edited under the same id, another
vocabjax version or another machine all start a fresh directory (or, with `--overwrite`, move
the old one aside), so one table never blends two models' drafts or two machines' timings.

    inputs(config, prompts) -> {"models": {...}, "files": {...}, "questions": sha,
                                "vocabjax": version, "machine": {...}}

Content ids: a registry name is its pinned sha256 (`checkpoints.zoo`); a hub id the commit its
revision names; a file its sha256, cached in `<cache>/content_hashes.json` under the stamp
(path, size, mtime, inode, ctime), which no write to the file keeps (mtime alone can be set
back), so a large checkpoint is hashed once, then costs one stat per run (docs/eval.md,
'Outputs'); a directory the hash of its files' relative paths and ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from pathlib import Path

from vocabjax.checkpoints.hub import HubError, commit_of, parse_hub_id
from vocabjax.checkpoints.loader import GGUF, weights_default
from vocabjax.checkpoints.zoo import REGISTRY, cache_dir, sha256_file
from vocabjax.io import atomic_write_json
from vocabjax.kernels.cpu_matmul import cpuinfo, march
from vocabjax.version import __version__

_HASHES = "content_hashes.json"


_ISA = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


def cpu_model() -> str:
  """The CPU's model name and its vector extensions (/proc/cpuinfo, else
  `platform.processor()`), e.g. "AMD EPYC [avx2 avx512f avx512_bf16 avx512_vnni]": hosts of one
  VM type can differ several-fold in speed, and the model name alone does not tell them apart
  (docs/eval.md, 'Outputs')."""
  info = cpuinfo()
  if info.get("model name"):
    flags = set(info.get("flags", "").split())
    isa = " ".join(f for f in _ISA if f in flags)
    name = f"{info['model name']} [{isa}]" if isa else info["model name"]
  else:
    name = platform.processor() or platform.machine()
  return name + isa_cap()


def isa_cap() -> str:
  """"" where the code uses the whole CPU; else what caps it (the CPU kernel built for another
  `-march`, `VOCABJAX_CPU_MARCH`; XLA's `--xla_cpu_max_isa`), e.g. " (code capped: kernel
  -march=x86-64-v3, XLA max ISA AVX2)": an AVX2-only host's code path run on an AVX-512 one is
  labelled so, never as the host it runs on."""
  caps = []
  if march() != "native":
    caps.append(f"kernel -march={march()}")
  m = re.search(r"--xla_cpu_max_isa=(\S+)", os.environ.get("XLA_FLAGS", ""))
  if m:
    caps.append(f"XLA max ISA {m.group(1)}")
  return f" (code capped: {', '.join(caps)})" if caps else ""


def machine_id() -> dict:
  return {"host": platform.node() or platform.machine(), "cpu": cpu_model(),
          "cpus": os.cpu_count()}


def _cache_file() -> Path:
  return cache_dir() / _HASHES


def _stamp(path: Path, st: os.stat_result) -> str:
  """What a cached hash is reused under (module doc): size, mtime, inode and ctime."""
  return f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_ctime_ns}"


def file_sha256(path: Path) -> str:
  """sha256 of a file, remembered under its stamp (`_stamp`: path, size, mtime, inode,
  ctime)."""
  path = Path(path).resolve()
  st = path.stat()
  key = _stamp(path, st)
  cache = _cache_file()
  try:
    known = json.loads(cache.read_text())
  except (OSError, json.JSONDecodeError):
    known = {}
  if key not in known:
    known[key] = sha256_file(path, progress=st.st_size > (1 << 30))
    # forget files that are gone or changed since (temporary directories of earlier runs)
    known = {k: v for k, v in known.items() if k == key or _still_there(k)}
    try:
      cache.parent.mkdir(parents=True, exist_ok=True)
      atomic_write_json(cache, known)
    except OSError:  # a read-only cache only costs re-hashing
      pass
  return known[key]


def _still_there(key: str) -> bool:
  """Whether a cached entry's file is still there unchanged (entries of the older
  (path, size, mtime) form are dropped: they cannot tell a restored mtime)."""
  path = key.rsplit("|", 4)[0]
  try:
    return _stamp(Path(path), Path(path).stat()) == key
  except OSError:
    return False


def content_id(source: str | os.PathLike) -> str:
  """A registry name's pinned sha256, else the content hash of the file or directory, else a
  hub id's commit; a path that does not exist is named as such (loading it fails later with
  its own message)."""
  if isinstance(source, str) and source in REGISTRY:
    return "sha256:" + REGISTRY[source].sha256
  path = Path(source).expanduser()
  if path.is_file():
    return "sha256:" + file_sha256(path)
  if path.is_dir():
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
      h.update(f"{f.relative_to(path)}={file_sha256(f)}\n".encode())
    return "dir-sha256:" + h.hexdigest()
  hid = parse_hub_id(source)
  if hid is not None:  # a hub id: the commit its revision names (its files are checked at it)
    try:
      return f"hub:{hid.repo}@{commit_of(hid)}" + (f"/{hid.path}" if hid.path else "")
    except HubError:
      pass  # loading it fails later with its own message
  return f"missing:{source}"


def _is_path(value) -> bool:
  return isinstance(value, str) and ("/" in value or os.sep in value) and Path(
      value).expanduser().exists()


def questions_hash(prompts) -> str:
  """sha256 of the questions' ids and text, in order (`inputs`' "questions"); a conversation's
  later turns too (a question without them hashes as before they existed)."""
  return hashlib.sha256(json.dumps([[p.qid, p.text, *([list(p.followups)] if p.followups
                                                      else [])]
                                    for p in prompts]).encode()).hexdigest()


def inputs(config, prompts, dtypes: tuple | None = None) -> dict:
  """Everything besides the config that a suite's records depend on (module doc). `dtypes`:
  the (target, drafter) dtypes asked of `load_model` (`runner.suite_dtypes`; default the
  suite's fields)."""
  t_dtype, d_dtype = dtypes or (config.dtype, config.draft_dtype or config.dtype)
  models = {"target": content_id(config.target)}
  if config.draft:
    models["draft"] = content_id(config.draft)
  for m in config.methods:  # a method's own drafter
    if m.draft:
      models[f"{m.name}.draft"] = content_id(m.draft)
  files = {f"{m.name}.{k}": content_id(v) for m in config.methods for k, v in m.params
           if _is_path(v) or (isinstance(v, str) and parse_hub_id(v) is not None)}
  # weights the suite's dtype fields leave to the file (a GGUF file's own blocks, the default
  # since those could be asked): named, so records of the dequantized default are not resumed
  roles = (("target", config.target, t_dtype), ("draft", config.draft, d_dtype),
           *((f"{m.name}.draft", m.draft, d_dtype) for m in config.methods if m.draft))
  weights = {role: "gguf" for role, src, dt in roles
             if src and dt in (None, "auto")
             and weights_default(src, dt, config.mesh) == GGUF}
  return {"models": models, "files": files, "questions": questions_hash(prompts),
          **({"weights": weights} if weights else {}),
          "vocabjax": __version__,
          "machine": machine_id()}


def _weights(inputs: dict) -> str:
  w = (inputs or {}).get("weights") or {}
  return (", ".join(f"the {role}'s {w[role]} blocks" for role in ("target", "draft") if role in w)
          or "the dtype fields' weights")


def describe_change(old: dict | None, new: dict) -> str:
  """Which inputs differ, in words, for the refusal message."""
  if not old:
    return "the directory records no inputs (made before vocabjax recorded them)"
  parts = []
  for kind in ("models", "files"):
    for k in sorted(set(old.get(kind, {})) | set(new.get(kind, {}))):
      if old.get(kind, {}).get(k) != new.get(kind, {}).get(k):
        parts.append(f"{k} changed content")
  if old.get("weights") != new.get("weights"):
    parts.append(f"the weights loaded: {_weights(old)} then, {_weights(new)} now (no dtype "
                 f"loads a GGUF file's own blocks; dtype float32 its values dequantized)")
  if old.get("questions") != new.get("questions"):
    parts.append("the questions' text changed")
  if old.get("vocabjax") != new.get("vocabjax"):
    parts.append(f"vocabjax {old.get('vocabjax')} -> {new.get('vocabjax')}")
  if old.get("machine") != new.get("machine"):
    parts.append(f"made on another machine ({old.get('machine')}; this is "
                 f"{new.get('machine')})")
  return "; ".join(parts) or "unknown"
