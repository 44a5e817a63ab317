"""Which implementation of the indexed LM head `impl="auto"` runs on a GPU: the Triton kernel
or XLA's gather + einsum, from a table of timings per device kind and shape bucket.

The table (`dispatch_table.json`, shipped with the package, written by
`kernels/bench_indexed_lm_head.py --update-table`) holds per (device kind, dtype, B, K, D) both
implementations' timings and the kernel's blocks. A call's bucket is B and K rounded up to
powers of two, the nearest recorded D within 25%, the same dtype and device kind; the kernel
runs only where it beat XLA by `MARGIN` in every recorded run of that bucket (`history`), by
device time and, where recorded, by host time; XLA everywhere else, so the dispatcher is never
slower than XLA where timed and never guesses where not. Why both timings and a history:
docs/engine.md, 'The indexed LM head's GPU and TPU kernels'.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from vocabjax.io import atomic_write_text

TABLE = Path(__file__).with_name("dispatch_table.json")
MARGIN = 1.03  # the kernel must beat XLA by 3% (run-to-run noise) to be chosen
FORMAT = "vocabjax.indexed_lm_head.dispatch/1"
HISTORY = 8  # earlier runs kept per entry
_TIMES = ("kernel_s", "xla_s", "kernel_host_s", "xla_host_s", "commit", "date")


def gpu_device_kind() -> str | None:
  """The device kind of this process's GPUs (None without GPUs, or with GPUs of several kinds)."""
  import jax

  try:
    kinds = {d.device_kind for d in jax.devices() if d.platform == "gpu"}
  except RuntimeError:  # no backend to ask
    return None
  return kinds.pop() if len(kinds) == 1 else None


def bucket(n: int) -> int:
  """n rounded up to a power of two."""
  return 1 << max(0, (int(n) - 1).bit_length())


def load_table(path: str | Path | None = None) -> tuple[dict, ...]:
  """The table's entries (empty when the file is absent); ValueError names a malformed file.
  The package's table is read once per process."""
  return _read(Path(path)) if path else _package_table()


@functools.lru_cache(maxsize=1)
def _package_table() -> tuple[dict, ...]:
  return _read(TABLE)


def _read(p: Path) -> tuple[dict, ...]:
  if not p.is_file():
    return ()
  try:
    raw = json.loads(p.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{p}: the indexed-LM-head dispatch table is not JSON ({e})") from e
  if raw.get("format") != FORMAT or not isinstance(raw.get("entries"), list):
    raise ValueError(f"{p}: not a dispatch table of format {FORMAT!r}")
  return tuple(raw["entries"])


def choose(device_kind: str, dtype: str, B: int, K: int, D: int,
           entries: tuple[dict, ...] | None = None) -> dict | None:
  """The kernel's block configuration where the table says the kernel wins this bucket, else
  None (run XLA's gather)."""
  entries = load_table() if entries is None else entries
  best = None
  for e in entries:
    if (e["device_kind"] != device_kind or e["dtype"] != dtype or bucket(e["B"]) != bucket(B)
        or bucket(e["K"]) != bucket(K) or abs(e["D"] - D) > 0.25 * D):
      continue
    if best is None or abs(e["D"] - D) < abs(best["D"] - D):
      best = e
  if best is None or not all(_kernel_won(run) for run in (best, *best.get("history", ()))):
    return None
  return dict(best["config"])


def _kernel_won(run: dict) -> bool:
  """Faster than XLA by `MARGIN` in device time, and (where host-timed single calls were
  recorded) not slower by those."""
  if run["kernel_s"] * MARGIN > run["xla_s"]:
    return False
  return run.get("kernel_host_s", 0) <= run.get("xla_host_s", float("inf"))


def merge(entries: list[dict], path: str | Path | None = None, *, history: bool = True) -> Path:
  """Add measured entries to the table at `path` (default: the package's), replacing those of
  the same (device kind, dtype, B, K, D); written atomically. With `history` (the default) a
  replaced entry's timings move into the new entry's `history` (newest first, at most
  `HISTORY`), and `choose` requires the kernel to have won each of them too; `history=False`
  drops them (after a change to the kernel, say)."""
  p = Path(path) if path else TABLE
  old = list(_read(p))
  key = lambda e: (e["device_kind"], e["dtype"], e["B"], e["K"], e["D"])  # noqa: E731
  new = {key(e): e for e in old}
  for e in entries:
    for f in ("device_kind", "dtype", "B", "K", "D", "kernel_s", "xla_s", "config"):
      if f not in e:
        raise ValueError(f"dispatch entry {e} lacks {f!r}")
    e = dict(e)
    runs = list(e.pop("history", ())) if history else []
    prev = new.get(key(e))
    if history and prev is not None:
      runs += [{f: prev[f] for f in _TIMES if f in prev}, *prev.get("history", ())]
    if runs:
      e["history"] = runs[:HISTORY]
    new[key(e)] = e
  atomic_write_text(p, json.dumps({"format": FORMAT, "entries": sorted(new.values(), key=key)},
                                  indent=1) + "\n")
  _package_table.cache_clear()
  return p
