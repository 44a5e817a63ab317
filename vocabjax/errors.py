"""Error types shared across layers (a leaf module: nothing of vocabjax imported here)."""

from __future__ import annotations

import errno
import os
import shutil


class ConfigError(ValueError):
  """A suite, method or run configuration that cannot be run; the message names the field and
  the value. Raised by the eval suites, the method registry, calibration and the trainers'
  dataset specs; the command lines print it as one `error:` line (exit 2)."""


def disk_full(e: BaseException) -> OSError | None:
  """The "no space left on device" error in `e`'s chain (orbax and thread pools wrap it), or
  None."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return e
    e = e.__cause__ or e.__context__
  return None


def disk_full_message(e: OSError, where: str | os.PathLike | None = None) -> str:
  """One line saying the disk is full: which file (or `where`), how much is free there, and
  that what was finished is kept."""
  path = e.filename or where or "?"
  try:
    probe = os.path.dirname(os.path.abspath(str(path))) or "."
    while not os.path.exists(probe):
      probe = os.path.dirname(probe)
    free = f"{shutil.disk_usage(probe).free / 2**20:,.0f} MB free there"
  except OSError:
    free = "free space unknown"
  return (f"the disk is full: writing {path} failed ({free}); free some space and run the "
          f"same command again: what was finished is kept")


def clip(text: str, n: int = 300) -> str:
  """`text` on one line, at most about `n` characters, cut between words ("...")."""
  one = " ".join(str(text).split())
  if len(one) <= n:
    return one
  return one[:n].rsplit(" ", 1)[0] + " ..."
