"""Atomic file writes: a crash or Ctrl-C never leaves half a file, and readers see the old or
the new content. Every writer of results, checkpoints, records and reports uses these.

A leaf module (standard library only), so any layer can import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path



def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Write via a temporary file in the same directory and rename: a crash never leaves half a
  file, and readers see the old or the new content. Permissions follow the umask."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".partial")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  """`atomic_write_bytes` for text (UTF-8)."""
  atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj) -> None:
  """`atomic_write_text` of `obj` as indented JSON."""
  atomic_write_text(path, json.dumps(obj, indent=2))


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike):
  """Yield an empty temporary directory beside `path`; on success it replaces `path` (an old
  directory there is removed first), on error it is removed and `path` is left as it was."""
  path = Path(path)
  tmp = path.with_name(path.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  shutil.rmtree(path, ignore_errors=True)
  tmp.rename(path)
