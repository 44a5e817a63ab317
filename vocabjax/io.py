"""Atomic file writes: a crash or Ctrl-C never leaves half a file, and readers see the old or
the new content. Every writer of results, checkpoints, records and reports uses these.

A leaf module (standard library only), so any layer can import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path



class OutputPathError(ValueError):
  """An output path that cannot take what a command would write there (checked up front)."""


def check_output_dir(path: str | os.PathLike, what: str = "--out") -> None:
  """Refuse, before any work (before models load), a result directory that cannot be one: an
  existing file, a path under a file, or a place where it cannot be created or written."""
  path = Path(path)
  if path.exists() and not path.is_dir():
    raise OutputPathError(f"{what} {path} is a file, not a directory")
  probe = path
  while not probe.exists():  # the nearest existing ancestor decides whether it can be made
    probe = probe.parent
  if not probe.is_dir():
    raise OutputPathError(f"{what} {path}: {probe} is a file, so the directory cannot be made")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise OutputPathError(f"{what} {path}: cannot write in {probe}")


def check_output_file(path: str | os.PathLike, what: str = "output") -> None:
  """Refuse, before any work, an output path that cannot take a new file: a directory, a
  parent that is missing or not a directory, or an existing file without write permission
  (its mode bits: replacing it atomically would silently drop them, even for root)."""
  import stat

  path = Path(path)
  if path.is_dir():
    raise OutputPathError(f"{what} {path} is a directory; give a file path")
  parent = path.parent if str(path.parent) else Path(".")
  if not parent.is_dir():
    raise OutputPathError(f"{what} {path}: its directory {parent} does not exist"
                          + (" (it is a file)" if parent.exists() else ""))
  if path.exists() and not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
    raise OutputPathError(f"{what} {path} is read-only; remove it or make it writable first")
  if not os.access(parent, os.W_OK):
    raise OutputPathError(f"{what} {path}: cannot write in {parent}")


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


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
  """Append one JSON line and fsync: a record once written survives a crash. A file whose last
  line is unterminated (an interrupted write) is repaired first (`read_jsonl`), so a record is
  never glued onto torn bytes."""
  path = Path(path)
  if path.exists() and path.stat().st_size:
    with open(path, "rb") as f:
      f.seek(-1, os.SEEK_END)
      if f.read(1) != b"\n":
        read_jsonl(path)
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def read_utf8(path: str | os.PathLike, error: type[Exception] = ValueError) -> str:
  """A text file's content; bytes that are not UTF-8 are `error` naming the file, the line
  and column and the byte (not the codec's message, which names neither file nor line)."""
  raw = Path(path).read_bytes()
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    line = raw.count(b"\n", 0, e.start) + 1
    col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
    raise error(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {col}: "
                f"{e.reason}); save the file as UTF-8") from None


def read_jsonl(path: str | os.PathLike, error: type[Exception] = ValueError, *,
               repair: bool = True) -> list[dict]:
  """The records of a JSON-lines file written by `append_jsonl` ([] when absent). Only an
  unterminated last line that does not parse is a torn write (an interrupted append): it is
  dropped and, with `repair`, the file rewritten without it (also when it was the only line);
  an unterminated but whole last record gets its newline. A complete (newline-terminated) line
  that does not parse, the last one included, was written whole and corrupted since: `error`
  naming the file and line, and nothing rewritten. `repair=False` only reads (a report of
  recorded runs, a file another process may still be appending to)."""
  path = Path(path)
  if not path.exists():
    return []
  out = []
  text = read_utf8(path, error)
  lines = text.splitlines()
  terminated = text.endswith("\n")
  torn = False
  for i, line in enumerate(lines):
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      if i != len(lines) - 1 or terminated:
        where = ("not the last line" if i != len(lines) - 1 else
                 "the last line, but complete (newline-terminated)")
        raise error(f"{path}:{i + 1} is corrupt ({where}, so not an interrupted write); move "
                    f"the file away to rerun") from None
      torn = True
      print(f"[vocabjax] dropping a torn last line of {path}", file=sys.stderr)
  if repair and (torn or (text and not terminated)):
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in out))
  return out
