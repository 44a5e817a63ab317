"""Feature shards for training on generated completions (SpecVocab's ranker; reusable).

Letters: X label positions (rows), D drafter hidden size, Kt teacher top tokens, B and T the
sequences and their tokens in teacher forcing.

Input: jsonl files of completions (`prompt` text + `completion_ids`, as written by
`python -m vocabjax.calibrate count --generate`). The rows are the positions that predict a
completion token. Per row, computed once and stored in shards of 16 records
(`shard-00000.npz`, written atomically; an interrupted build resumes at the first missing
shard; `meta.json` names the models and data, and features of other models or data in the same
directory are refused):
  hidden [X, D]         the drafter's final (normed) hidden state
  label [X]             the target's teacher-forced argmax there, or the text's next token when
                        no target is given
  top_ids/top_p [X, Kt] the target's top-Kt next-token distribution
  draft_argmax [X]      the drafter's own greedy token
  record [X]            the completion the row belongs to; and per record its token sequence
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import time
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.engine import prompt_bucket
from vocabjax.io import atomic_write_bytes, atomic_write_json, read_utf8
from vocabjax.models.cache import KVCache
from vocabjax.models.llamalike import forward, lm_head
from vocabjax.train.loop import TrainError, progress
from vocabjax.models.identity import drafter_identity


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  drafter: str  # registry name or path
  data: tuple[str, ...]  # completion jsonl files
  directory: str  # where the shards go
  target: str | None = None  # teacher (None: the text's next tokens are the labels)
  teacher_top: int = 32
  max_records: int | None = None

  def fingerprint(self) -> str:
    return job_fingerprint(self.drafter, self.target, files_key(self.data), self.teacher_top,
                           self.max_records)


def files_key(paths) -> list:
  """(absolute path, size) of each data file: what a feature fingerprint remembers of them."""
  return [(str(Path(p).resolve()), Path(p).stat().st_size) for p in paths]


def job_fingerprint(*parts) -> str:
  """A short sha256 of JSON-serializable `parts` (features and training jobs)."""
  return hashlib.sha256(json.dumps(list(parts), sort_keys=True).encode()).hexdigest()[:16]


def read_records(paths, max_records=None, vocab_size: int | None = None) -> list[dict]:
  """Completion records (`prompt`, `completion_ids`) from jsonl files, in file order. Ids must
  be integers, and in [0, vocab_size) when it is given (the model they are for): an id past the
  vocabulary would train on garbage rows until a NaN loss blamed the learning rate."""
  out = []
  for p in paths:
    p = Path(p)
    if not p.is_file():
      raise TrainError(f"no data file at {p}")
    for i, line in enumerate(read_utf8(p, TrainError).splitlines()):
      if not line.strip():
        continue
      try:
        r = json.loads(line)
        ids = r["completion_ids"]
        if not isinstance(r["prompt"], str):
          raise TypeError(f"prompt must be a string, got {r['prompt']!r:.60}")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                for t in ids):
          raise TypeError(f"completion_ids must be a list of integers, got {ids!r:.60}")
        out.append({"prompt": r["prompt"], "completion_ids": ids})
      except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise TrainError(f"{p}:{i + 1} is not a completion record ({e!r})") from None
      if vocab_size is not None:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
          raise TrainError(f"{p}:{i + 1}: completion_ids {bad[:5]} lie outside the "
                           f"vocabulary [0, {vocab_size}) of the model they are for")
  if not out:
    raise TrainError(f"no completion records in {list(map(str, paths))}")
  return out[:max_records] if max_records else out


def model_identity(model) -> dict:
  return {"source": Path(model.source).name, **drafter_identity(model.params, model.config)}


def sequence_hidden(params, tokens, *, config):
  """Final hidden states [B, T, D] of whole sequences tokens [B, T] (positions 0..T-1, a fresh
  cache of T slots): teacher forcing for features and training."""
  B, T = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  # a throwaway cache: linear (no sliding layers' ring, `models.cache`)
  hidden, _ = forward(params, tokens, pos, KVCache.init(config, B, T, ring_slack=T),
                      config=config, fresh=True)
  return hidden


FORWARD_STEP = 64  # teacher-forced sequences above this many tokens pad to a multiple of it


def forward_len(n: int) -> int:
  """The padded length of one teacher-forced sequence of `n` tokens: a power of two up to
  FORWARD_STEP, then the next multiple of it, which pads far less than powers of two throughout
  for a few more compiled shapes (docs/eagle.md, 'Packed windows'). Padding sits after the
  sequence, so causal attention leaves the real positions' values unchanged."""
  return prompt_bucket(n, FORWARD_STEP)


def _record_features(rec, tokenizer, d_run, draft, t_run, target, T_top):
  prompt = tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"]
  comp = rec["completion_ids"]
  if not prompt or not comp:
    return None
  toks = prompt + comp
  L, P = len(toks), len(prompt)
  padded = np.zeros((1, forward_len(L)), np.int32)
  padded[0, :L] = toks
  rows = np.arange(P - 1, L - 1)  # positions whose next token is a completion token
  h = d_run(draft.params, jnp.asarray(padded))[0, rows]
  d_logits = lm_head(draft.params, h, config=draft.config)
  out = {"hidden": np.asarray(h, np.float32),
         "draft_argmax": np.asarray(jnp.argmax(d_logits, -1), np.int32),
         "tokens": np.asarray(toks, np.int32), "first_row": P - 1}
  if target is None:
    out["label"] = np.asarray(comp, np.int32)
  else:
    th = t_run(target.params, jnp.asarray(padded))[0, rows]
    lp = jax.nn.log_softmax(lm_head(target.params, th, config=target.config), axis=-1)
    top_lp, top_ids = jax.lax.top_k(lp, T_top)
    out.update(label=np.asarray(top_ids[:, 0], np.int32),
               top_ids=np.asarray(top_ids, np.int32),
               top_p=np.asarray(jnp.exp(top_lp), np.float32))
  return out


SHARD_RECORDS = 16
SEQ_KEYS = ("tokens", "first_row")  # per-record values; every other array is per row


def pending_shards(fdir: Path, fingerprint: str, n_records: int) -> list[int]:
  """Shard indices still to compute in `fdir` ([] when complete); TrainError when it holds
  features of another job (other models or data)."""
  meta_path = Path(fdir) / "meta.json"
  if meta_path.exists():
    meta = json.loads(meta_path.read_text())
    if meta.get("fingerprint") != fingerprint:
      raise TrainError(f"{fdir} holds features of other data or models "
                       f"({meta.get('drafter') or meta.get('kind')} / {meta.get('target')} on "
                       f"{meta.get('data')}); use another 'features' directory")
  # a complete build still has its shards checked: one deleted (as the loader's message
  # advises for a corrupt one) is recomputed, not left missing behind `complete: true`
  n_shards = -(-n_records // SHARD_RECORDS)
  return [i for i in range(n_shards) if not (Path(fdir) / f"shard-{i:05d}.npz").exists()]


def write_shards(fdir: Path, meta: dict, records: list, todo: list[int], record_fn, *,
                 desc: str, show_progress: bool = True) -> None:
  """Compute shards `todo` (each SHARD_RECORDS records; `record_fn(record)` -> dict of per-row
  arrays + `tokens` + `first_row`, or None to skip) atomically, then mark `meta` complete.
  `meta` (with `fingerprint`) is written first, so an interrupted build resumes."""
  fdir = Path(fdir)
  meta = {**meta, "records": len(records), "shards": -(-len(records) // SHARD_RECORDS),
          "complete": False}
  atomic_write_json(fdir / "meta.json", meta)
  t0, rows = time.perf_counter(), 0
  for i in progress(todo, desc=desc, enabled=show_progress):
    parts = []
    for r in range(i * SHARD_RECORDS, min(len(records), (i + 1) * SHARD_RECORDS)):
      f = record_fn(records[r])
      if f is not None:
        parts.append((r, f))
    row_keys = [k for k in parts[0][1] if k not in SEQ_KEYS] if parts else []
    arrays = {k: np.concatenate([f[k] for _, f in parts]) for k in row_keys}
    n_rows = [len(f[row_keys[0]]) for _, f in parts] if row_keys else []
    rows += sum(n_rows)
    arrays["record"] = np.concatenate([np.full(n, r, np.int32)
                                       for (r, _), n in zip(parts, n_rows)] or [np.zeros(0)])
    arrays["seq_tokens"] = np.concatenate([f["tokens"] for _, f in parts] or [np.zeros(0)])
    arrays["seq_offsets"] = np.cumsum([0] + [len(f["tokens"]) for _, f in parts])
    arrays["seq_first_row"] = np.asarray([f["first_row"] for _, f in parts], np.int32)
    arrays["seq_record"] = np.asarray([r for r, _ in parts], np.int32)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(fdir / f"shard-{i:05d}.npz", buf.getvalue())
  meta.update(complete=True, seconds=round(time.perf_counter() - t0, 1), new_rows=rows)
  atomic_write_json(fdir / "meta.json", meta)


def read_shards(fdir: Path, keys) -> tuple[dict, list, dict]:
  """(per-row columns `keys` present, [(record, tokens, first_row)], meta) of complete shards."""
  meta_path = Path(fdir) / "meta.json"
  if not meta_path.exists() or not json.loads(meta_path.read_text()).get("complete"):
    raise TrainError(f"{fdir} has no complete features; run the training command (it builds "
                     f"them first)")
  meta = json.loads(meta_path.read_text())
  paths = [Path(fdir) / f"shard-{i:05d}.npz" for i in range(meta["shards"])]

  def load(path, names=None):
    try:
      with np.load(path) as z:  # an npz member is read only when asked for
        return {k: z[k] for k in (z.files if names is None else names) if k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
      raise TrainError(f"feature shard {path} is missing or corrupt ({e}); delete it and rerun "
                       f"to recompute it") from None

  # two passes: the row counts first (the small `record` column), then each shard's columns
  # copied into arrays of the final size, so reading never holds the features twice (the EAGLE
  # chat features are 6.3 GB: a list of shards plus their concatenation ran out of memory)
  sizes = [len(load(path, ("record",)).get("record", ())) for path in paths]
  starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  cat: dict = {}
  seqs = []
  for path, a, b in zip(paths, starts[:-1], starts[1:]):
    z = load(path, (*keys, "record", "seq_offsets", "seq_tokens", "seq_first_row",
                    "seq_record"))  # not the columns no caller asked for
    for k in (*keys, "record"):
      if k in z and (b > a or len(z[k])):  # a shard of empty completions holds no rows
        if len(z[k]) != b - a:
          raise TrainError(f"feature shard {path} holds {len(z[k])} rows of {k!r}, its "
                           f"`record` column {b - a}: delete it and rerun to recompute it")
        if k not in cat:
          cat[k] = np.empty((int(starts[-1]),) + z[k].shape[1:], z[k].dtype)
        cat[k][a:b] = z[k]
    off = z["seq_offsets"]
    for j, r in enumerate(z["seq_record"]):
      seqs.append((int(r), z["seq_tokens"][off[j]:off[j + 1]], int(z["seq_first_row"][j])))
  if not len(cat.get("record", [])):
    raise TrainError(f"{fdir} holds no training rows (empty completions?)")
  return cat, seqs, meta


def build_features(job: FeatureSpec, *, show_progress: bool = True) -> Path:
  """Compute (or finish computing) the feature shards of `job`; returns the directory."""
  fdir = Path(job.directory)
  fdir.mkdir(parents=True, exist_ok=True)
  records = read_records(job.data, job.max_records)
  todo = pending_shards(fdir, job.fingerprint(), len(records))
  if not todo:
    return fdir
  draft = load_model(job.drafter, dtype="float32", progress=show_progress)
  target = (load_model(job.target, dtype="float32", progress=show_progress) if job.target
            else None)
  if target is not None and target.config.vocab_size != draft.config.vocab_size:
    raise TrainError(f"target vocabulary V={target.config.vocab_size} differs from the "
                     f"drafter's V={draft.config.vocab_size}: a ranker needs one tokenizer")
  read_records(job.data, job.max_records, vocab_size=draft.config.vocab_size)  # ids checked
  tok = draft.tokenizer
  if tok is None:
    raise TrainError(f"{draft.source} has no tokenizer: the prompts cannot be encoded")
  meta = {"fingerprint": job.fingerprint(), "drafter": model_identity(draft),
          "target": model_identity(target) if target else None,
          "data": [str(p) for p in job.data], "teacher_top": job.teacher_top}
  d_run = jax.jit(functools.partial(sequence_hidden, config=draft.config))
  t_run = jax.jit(functools.partial(sequence_hidden, config=target.config)) if target else None
  write_shards(fdir, meta, records, todo,
               lambda rec: _record_features(rec, tok, d_run, draft, t_run, target,
                                            job.teacher_top),
               desc="features (shards)", show_progress=show_progress)
  return fdir


@dataclasses.dataclass
class Features:
  hidden: np.ndarray
  label: np.ndarray
  draft_argmax: np.ndarray
  record: np.ndarray
  top_ids: np.ndarray | None
  top_p: np.ndarray | None
  seqs: list  # (record, tokens, first_row) per record
  meta: dict

  def rows(self, mask) -> dict:
    out = {"hidden": self.hidden[mask], "label": self.label[mask],
           "draft_argmax": self.draft_argmax[mask]}
    if self.top_ids is not None:
      out.update(top_ids=self.top_ids[mask], top_p=self.top_p[mask])
    return out


def load_features(fdir: Path) -> Features:
  cat, seqs, meta = read_shards(fdir, ("hidden", "label", "draft_argmax", "top_ids", "top_p"))
  return Features(cat["hidden"], cat["label"], cat["draft_argmax"], cat["record"],
                  cat.get("top_ids"), cat.get("top_p"), seqs, meta)


def prompt_key(toks, first: int) -> tuple:
  """A record's prompt (its tokens up to and including `first`) as a hashable key."""
  return tuple(toks[:first + 1].tolist())


def heldout_records(feats: "Features", heldout: float, split: str = "last",
                    seed: int = 0) -> np.ndarray:
  """Record ids held out: every record of a `heldout` fraction of distinct prompts, so a
  prompt's completions by two models never straddle the split. split="last": the last prompts
  (in order of first appearance); "random": a seeded random sample of them (when the data's
  order is not random: a calibrate job sorts its prompts by length, so its last prompts are
  the longest, all of one or two kinds)."""
  if split not in ("last", "random"):
    raise TrainError(f"heldout split={split!r} is not 'last' or 'random'")
  first_seen: dict = {}
  rec_prompt = {}
  for rec, toks, first in feats.seqs:
    key = prompt_key(toks, first)
    rec_prompt[rec] = first_seen.setdefault(key, len(first_seen))
  n = len(first_seen)
  cut = int(round(n * (1 - heldout)))
  if cut < 1 or cut >= n:
    raise TrainError(f"{n} distinct prompts cannot be split with heldout={heldout} (need at "
                     f"least one prompt on each side)")
  if split == "random":
    held = set(np.random.default_rng(seed).permutation(n)[cut:].tolist())
  else:
    held = set(range(cut, n))
  return np.asarray(sorted(r for r, g in rec_prompt.items() if g in held), np.int64)
