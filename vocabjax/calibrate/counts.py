"""Calibration counts on disk, the tokenizer identity they are tied to, and their plots.

A counts file (`.npz`, written atomically) holds `counts` [V] int64 and `meta` (JSON):
vocab_size, tokenizer_id, kind ("text" for a raw corpus, "generated" for model completions),
source (what was counted), token_total, documents, and the run's throughput. Subsets are
selected from it with `vocabjax.vocab.select` (`python -m vocabjax.calibrate select`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np

from vocabjax.io import atomic_write_bytes
from vocabjax.plots import save_png, subplots

KINDS = ("text", "generated")


class CalibrationError(ValueError):
  """Bad calibration input or file; the message names the value."""


def tokenizer_identity(tokenizer) -> str:
  """A short, stable id of a tokenizer's vocabulary (token -> id map, specials included):
  equal ids mean counts made with one can be used with the other."""
  vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
  h = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
  return f"vocab{len(vocab)}-sha256:{h[:16]}"


def special_ids(tokenizer, eos_token_ids=()) -> list[int]:
  """EOS and every special / added control token of the tokenizer (chat-template markers such
  as Qwen's <|im_start|>, <|im_end|>): kept in every subset."""
  ids = set(int(i) for i in eos_token_ids)
  ids |= set(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
  for i, tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
    if getattr(tok, "special", False):
      ids.add(int(i))
  return sorted(ids)


@dataclasses.dataclass(frozen=True)
class Counts:
  counts: np.ndarray  # [V] int64
  meta: dict

  @property
  def vocab_size(self) -> int:
    return int(self.counts.size)

  @property
  def total(self) -> int:
    return int(self.counts.sum())

  def save(self, path: str | Path) -> Path:
    path = Path(path)
    buf = io.BytesIO()
    meta = {**self.meta, "vocab_size": self.vocab_size, "token_total": self.total}
    np.savez_compressed(buf, counts=np.asarray(self.counts, np.int64),
                        meta=np.asarray(json.dumps(meta)))
    atomic_write_bytes(path, buf.getvalue())
    return path

  @classmethod
  def load(cls, path: str | Path, *, tokenizer_id: str | None = None,
           vocab_size: int | None = None) -> "Counts":
    """Read a counts file; with `tokenizer_id` / `vocab_size`, refuse counts of another
    tokenizer or vocabulary."""
    path = Path(path)
    if not path.is_file():
      raise CalibrationError(f"no counts file at {path} (run `python -m vocabjax.calibrate "
                             f"count` first)")
    try:
      with np.load(path, allow_pickle=False) as z:
        counts, meta = np.asarray(z["counts"]), json.loads(str(z["meta"]))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
      raise CalibrationError(f"{path} is not a readable counts file (truncated or corrupt?): "
                             f"{type(e).__name__}: {e}") from None
    if counts.ndim != 1 or counts.dtype != np.int64 or meta.get("vocab_size") != counts.size:
      raise CalibrationError(f"{path}: counts of shape {counts.shape} {counts.dtype} do not "
                             f"match its metadata (vocab_size={meta.get('vocab_size')})")
    if tokenizer_id is not None and meta.get("tokenizer_id") != tokenizer_id:
      raise CalibrationError(f"{path} was counted with tokenizer {meta.get('tokenizer_id')!r}, "
                             f"but this model's tokenizer is {tokenizer_id!r}")
    if vocab_size is not None and counts.size != vocab_size:
      raise CalibrationError(f"{path} counts a vocabulary of {counts.size} tokens, this model "
                             f"has V={vocab_size}")
    return cls(counts=counts, meta=meta)


def coverage(counts: np.ndarray) -> np.ndarray:
  """[V] share of all occurrences held by the top-K tokens, K = 1 .. V."""
  c = np.sort(np.asarray(counts, np.float64))[::-1]
  return np.cumsum(c) / max(c.sum(), 1.0)


def plot(named: dict[str, Counts], out_dir: str | Path, marks=(8192, 16384, 32768, 65536)):
  """rank_frequency.png (log-log, VocabTrim fig. 1) and coverage.png (share of occurrences
  held by the top-K tokens, FR-Spec fig. 2) for one or more counts, overlaid."""
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  fig, ax = subplots(figsize=(6, 4))
  for name, c in named.items():
    f = np.sort(c.counts)[::-1]
    f = f[f > 0]
    ax.loglog(np.arange(1, f.size + 1), f / c.total, label=f"{name} ({c.total:,} tokens)")
  paths = [_finish(fig, ax, "token rank", "frequency", "rank-frequency of calibration tokens",
                   out_dir / "rank_frequency.png")]
  fig, ax = subplots(figsize=(6, 4))
  for name, c in named.items():
    cov = coverage(c.counts)
    ax.semilogx(np.arange(1, cov.size + 1), cov, label=name)
  for k in marks:
    ax.axvline(k, color="grey", lw=0.5, ls=":")
  paths.append(_finish(fig, ax, "K (top-K tokens by count)", "share of occurrences covered",
                       "coverage of the top-K tokens", out_dir / "coverage.png"))
  return paths


def _finish(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
  """Label, lay out and atomically save one plot as PNG."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize=7)
  save_png(fig, path, dpi=120)
  return path
