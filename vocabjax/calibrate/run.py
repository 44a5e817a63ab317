"""`python -m vocabjax.calibrate count`: count target-vocabulary tokens of a calibration source.

Sources (one kind per run):
  text       raw text: files and directories (searched recursively with `glob`), `.jsonl`
             files (one document per line, `field`), or a local `datasets` dataset (`dataset`,
             tokenized with `datasets.map(num_proc=...)`). FR-Spec counts a raw corpus.
  generated  a model's completions (`generator`: the target, VocabTrim's best choice, or the
             drafter) of eval prompts (`prompts`: "spec_bench", "humaneval", "gsm8k" or a
             Spec-Bench-format .jsonl) minus those of `exclude_suites`, chat template, batched
             (`rows`: continuous batching); only generated tokens count, and the completions are
             kept in `generated.jsonl` (EAGLE training data). `backend: torch` generates with
             transformers (`torch_dtype`, bf16 by default: faster on a CPU with AMX,
             docs/eagle.md, 'Generating the target's answers fast'); its answers may part from
             f32's after a near tie.

Units (batches of documents or prompts) run in a fixed order; after each, the counts are saved
atomically to `counts.partial.npz`: a rerun of the same job resumes, a finished one is not redone,
another job in the same directory is refused. Multi-host: process i takes units i, i + P, ...;
the counts are reduced across processes; process 0 writes the files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import sys
import time
import warnings
from pathlib import Path

import jax
import numpy as np

from vocabjax.calibrate.corpora import resolve_corpus
from vocabjax.calibrate.counting import TokenCounter
from vocabjax.calibrate.counts import CalibrationError, Counts, KINDS, plot, tokenizer_identity
from vocabjax.checkpoints import hub
from vocabjax.checkpoints.loader import eos_ids, load_model, load_tokenizer_and_vocab
from vocabjax.checkpoints.torch_model import TORCH_DTYPES, load_torch_model
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.drafter import block_layout
from vocabjax.io import atomic_write_bytes, atomic_write_text, read_utf8
from vocabjax.prompts import (DatasetSpec, LOADERS, encode_prompts, in_suites, load_prompts,
                              suite_questions)

FINAL, PARTIAL, GENERATED = "counts.npz", "counts.partial.npz", "generated.jsonl"
BACKENDS = ("vocabjax", "torch")


@dataclasses.dataclass(frozen=True)
class CountJob:
  model: str  # the tokenizer (and vocabulary size) counts are made for: the target
  out: str
  kind: str = "text"  # "text" | "generated"
  # text sources
  text: tuple[str, ...] = ()  # files or directories
  jsonl: tuple[str, ...] = ()
  dataset: str | None = None  # a `datasets.save_to_disk` directory or a local data file
  field: str = "text"  # jsonl / dataset column holding the text
  glob: tuple[str, ...] = ("*.py", "*.txt", "*.md", "*.rst")
  skip_dirs: tuple[str, ...] = ("site-packages", "dist-packages", "__pycache__", ".git")
  docs_per_unit: int = 256
  num_proc: int = 1  # datasets.map worker processes (1: none; more fork this process)
  # generated sources
  generator: str | None = None  # model that writes the completions (default: `model`)
  prompts: tuple[str, ...] = ("spec_bench",)
  exclude_suites: tuple[str, ...] = ("default", "spec_bench", "humaneval", "compare_torch")
  max_new_tokens: int = 128
  batch_size: int = 8  # prompts per unit (one batch, unless `rows`)
  rows: int | None = None  # continuous batching: decode each unit with this many rows
  backend: str = "vocabjax"  # "vocabjax" | "torch" (transformers' generate)
  torch_dtype: str = "bfloat16"  # the torch backend's weights and activations
  temperature: float = 0.0
  seed: int = 0
  max_len: int = 1024
  limit: int | None = None  # at most this many documents / prompts

  def __post_init__(self):
    if self.kind not in KINDS:
      raise CalibrationError(f"unknown source kind {self.kind!r}; choose one of {KINDS}")
    has_text = bool(self.text or self.jsonl or self.dataset)
    if self.kind == "text" and not has_text:
      raise CalibrationError("a text calibration needs --text, --jsonl or --dataset")
    if self.kind == "generated" and has_text:
      raise CalibrationError("--generate counts model completions; drop --text/--jsonl/--dataset")
    if self.batch_size < 1 or self.docs_per_unit < 1 or self.max_new_tokens < 1:
      raise CalibrationError(f"batch_size, docs_per_unit and max_new_tokens must be >= 1, got "
                             f"{self.batch_size}, {self.docs_per_unit}, {self.max_new_tokens}")
    if self.rows is not None and not 1 <= self.rows <= self.batch_size:
      raise CalibrationError(f"rows={self.rows} must be in [1, batch_size={self.batch_size}] "
                             f"(a unit's prompts share its rows)")
    if self.limit is not None and self.limit < 1:
      raise CalibrationError(f"limit must be >= 1, got {self.limit}")
    if self.backend not in BACKENDS:
      raise CalibrationError(f"unknown backend {self.backend!r}; choose one of {BACKENDS}")
    if self.backend == "torch":
      if self.kind != "generated":
        raise CalibrationError("backend='torch' generates completions: it needs --generate")
      if self.rows is not None:
        raise CalibrationError(f"rows={self.rows} (continuous batching) is vocabjax's; the torch "
                               f"backend decodes each unit of batch_size prompts as one batch")
      if self.torch_dtype not in TORCH_DTYPES:
        raise CalibrationError(f"torch_dtype={self.torch_dtype!r} is not one of {TORCH_DTYPES}")

  def as_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d.pop("out")
    if d["rows"] is None:  # jobs from before continuous batching keep their fingerprints
      d.pop("rows")
    if d["backend"] == "vocabjax":  # and jobs from before the torch backend theirs
      d.pop("backend")
      d.pop("torch_dtype")
    return d

  def fingerprint(self) -> str:
    d = self.as_dict()
    for k in ("num_proc", "docs_per_unit"):  # how, not what, is counted
      d.pop(k)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

  @property
  def source(self) -> str:
    if self.kind == "generated":
      return (f"{self.generator or self.model} completions (max {self.max_new_tokens} tokens, "
              f"T={self.temperature}) on {'+'.join(self.prompts)}"
              + (f" minus suites {'+'.join(self.exclude_suites)}" if self.exclude_suites else ""))
    return " + ".join([*self.text, *self.jsonl, *([self.dataset] if self.dataset else [])])


def _log(msg: str) -> None:
  print(f"[vocabjax.calibrate] {msg}", file=sys.stderr, flush=True)


# --- sources ----------------------------------------------------------------------------------


def text_files(paths, patterns, skip_dirs=()) -> list[Path]:
  """Files of `paths` (directories searched for `patterns`); `corpus:NAME` names a corpus of
  `vocabjax.calibrate.corpora`."""
  out = []
  for p in paths:
    p = resolve_corpus(p[len("corpus:"):]) if str(p).startswith("corpus:") else Path(p)
    if p.is_dir():
      out += sorted({f for pat in patterns for f in p.rglob(pat)
                     if f.is_file() and not set(f.relative_to(p).parts[:-1]) & set(skip_dirs)})
    elif p.is_file():
      out.append(p)
    else:
      raise CalibrationError(f"calibration source not found: {p}")
  return out


def _doc_text(row, field: str, where: str) -> str:
  if isinstance(row, str):
    return row
  if not isinstance(row, dict) or field not in row:
    raise CalibrationError(f"{where}: no field {field!r} (set --field)")
  v = row[field]
  return "\n".join(v) if isinstance(v, list) else str(v)


def _read_text(path: Path) -> tuple[str, str]:
  """(text, "text" | "patched" | "binary"): a file with NUL bytes or over 1% of characters
  that are not UTF-8 is binary; one with a few bad bytes is read with U+FFFD for them."""
  raw = path.read_bytes()
  if b"\0" in raw:
    return "", "binary"
  try:
    return raw.decode("utf-8"), "text"
  except UnicodeDecodeError:
    text = raw.decode("utf-8", errors="replace")
    return text, "binary" if text.count("\ufffd") > 0.01 * len(text) else "patched"


def text_documents(job: CountJob) -> list[str]:
  """Every document of a text job, in a fixed order (files, then jsonl lines)."""
  docs, binary, patched = [], [], []
  for f in text_files(job.text, job.glob, job.skip_dirs):
    text, kind = _read_text(f)
    if kind == "binary":
      binary.append(f)
      continue
    if kind == "patched":
      patched.append(f)
    docs.append(text)
  if binary:
    warnings.warn(f"skipped {len(binary)} binary files (NUL bytes or mostly not UTF-8), not "
                  f"counted as text: {[str(f) for f in binary[:5]]}", RuntimeWarning,
                  stacklevel=2)
  if patched:
    warnings.warn(f"{len(patched)} files hold bytes that are not UTF-8, counted with U+FFFD "
                  f"in their place: {[str(f) for f in patched[:5]]}", RuntimeWarning,
                  stacklevel=2)
  for path in map(Path, job.jsonl):
    if not path.is_file():
      raise CalibrationError(f"calibration source not found: {path}")
    for n, line in enumerate(read_utf8(path, CalibrationError).splitlines(), 1):
      if line.strip():
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise CalibrationError(f"{path}:{n}: not JSON: {e}") from None
        docs.append(_doc_text(row, job.field, f"{path}:{n}"))
  return docs[:job.limit] if job.limit else docs


def load_dataset_source(job: CountJob):
  import datasets

  p = Path(job.dataset)
  if p.is_dir() and ((p / "dataset_info.json").exists() or (p / "state.json").exists()):
    ds = datasets.load_from_disk(str(p))
  elif p.is_file():
    fmt = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet",
           ".txt": "text"}.get(p.suffix)
    if fmt is None:
      raise CalibrationError(f"{p}: unsupported dataset file type {p.suffix!r}")
    ds = datasets.load_dataset(fmt, data_files=str(p), split="train")
  else:
    raise CalibrationError(f"no local dataset at {p} (a save_to_disk directory or a data file)")
  if isinstance(ds, datasets.DatasetDict):
    ds = ds["train"] if "train" in ds else next(iter(ds.values()))
  if job.field not in ds.column_names:
    raise CalibrationError(f"dataset {p} has no column {job.field!r}; it has {ds.column_names}")
  return ds.select(range(min(job.limit, len(ds)))) if job.limit else ds


def calibration_prompts(job: CountJob, tokenizer) -> list[list[int]]:
  """Chat-encoded prompts for a generated job, minus the excluded eval suites' questions."""
  specs = [DatasetSpec(kind=p) if p in LOADERS else DatasetSpec(kind="spec_bench", path=p)
           for p in job.prompts]
  prompts = load_prompts(specs)
  # matched by normalized text, either way round: GSM8K's test problems are Spec-Bench's math
  # questions with another wrapper (exact matching missed 2 of the 12 in the suites)
  used = suite_questions(job.exclude_suites) if job.exclude_suites else []
  prompts = [p for p in prompts if not in_suites(p.text, used)]
  random.Random(job.seed).shuffle(prompts)  # a limit then samples every source alike
  prompts = prompts[:job.limit] if job.limit else prompts
  ids = encode_prompts(tokenizer, [p.text for p in prompts], chat=True)
  fits = [x for x in ids if len(x) + job.max_new_tokens <= job.max_len]
  if len(fits) < len(ids):
    _log(f"skipping {len(ids) - len(fits)} prompts longer than max_len - max_new_tokens = "
         f"{job.max_len - job.max_new_tokens}")
  return sorted(fits, key=len)  # similar lengths batch together (fewer compiled shapes)


# --- the job ----------------------------------------------------------------------------------


def _save_partial(out: Path, job: CountJob, counter: TokenCounter, done: int, timing: dict):
  import io

  buf = io.BytesIO()
  np.savez(buf, counts=counter.counts, state=np.asarray(json.dumps(
      {"fingerprint": job.fingerprint(), "done": done, "timing": timing})))
  atomic_write_bytes(out / PARTIAL, buf.getvalue())


def _drop_empty(out: Path, created: bool, *, start_state: bool) -> None:
  """After a job that counted nothing: remove its partial state (and generations), and `out`
  itself when this run created it and nothing else is there."""
  if start_state:
    for name in (PARTIAL, GENERATED):
      (out / name).unlink(missing_ok=True)
  if created and out.is_dir() and not any(out.iterdir()):
    out.rmdir()


def _load_partial(out: Path, job: CountJob, V: int):
  path = out / PARTIAL
  if not path.exists():
    return None
  try:
    with np.load(path, allow_pickle=False) as z:
      counts, state = np.asarray(z["counts"]), json.loads(str(z["state"]))
  except Exception as e:  # noqa: BLE001 - a torn partial file only costs a restart
    _log(f"ignoring unreadable {path} ({type(e).__name__}: {e}); starting over")
    return None
  if state.get("fingerprint") != job.fingerprint():
    raise CalibrationError(f"{path} belongs to another calibration job (fingerprint "
                           f"{state.get('fingerprint')} vs {job.fingerprint()}); use another "
                           f"--out or --overwrite")
  if counts.shape != (V,):
    raise CalibrationError(f"{path}: counts of shape {counts.shape}, expected ({V},)")
  return counts, state


def run_count(job: CountJob, *, overwrite: bool = False, max_units: int | None = None,
              finish: bool = False, progress: bool = True, mesh=None) -> Counts | None:
  """Run (or resume) a counting job. Returns the final Counts, or None when `max_units`
  stopped it early (the partial state is on disk; rerun to continue). `finish`: write the
  final counts from the units done so far without running more (meta records how many of the
  units were counted). `progress` False: no bars, the models' downloads and checksums too."""
  with hub.showing_progress(None if progress else False):
    return _run_count(job, overwrite=overwrite, max_units=max_units, finish=finish,
                      progress=progress, mesh=mesh)


def _run_count(job: CountJob, *, overwrite: bool, max_units: int | None, finish: bool,
               progress: bool, mesh) -> Counts | None:
  out = Path(job.out)
  created = not out.exists()
  out.mkdir(parents=True, exist_ok=True)
  final = out / FINAL
  if final.exists():
    done = Counts.load(final)
    if done.meta.get("fingerprint") == job.fingerprint() and not overwrite:
      _log(f"{final} already holds this job's counts ({done.total:,} tokens); nothing to do")
      return done
    if not overwrite:
      raise CalibrationError(f"{final} holds counts of another job (fingerprint "
                             f"{done.meta.get('fingerprint')} vs {job.fingerprint()}); use "
                             f"another --out or --overwrite")
    for name in (FINAL, PARTIAL, GENERATED):
      (out / name).unlink(missing_ok=True)
  elif overwrite:
    for name in (PARTIAL, GENERATED):
      (out / name).unlink(missing_ok=True)

  tokenizer, V = load_tokenizer_and_vocab(job.model)
  tok_id = tokenizer_identity(tokenizer)
  timing = {"tokenize_s": 0.0, "count_s": 0.0, "generate_s": 0.0, "tokens": 0, "documents": 0}
  pid, nproc = jax.process_index(), jax.process_count()

  gen = None
  if job.kind == "generated":
    units, gen = _generated_units(job, tokenizer, tok_id)
  elif job.dataset:
    units = _dataset_units(job, tokenizer, timing)
  else:
    docs = text_documents(job)
    units = [docs[i:i + job.docs_per_unit] for i in range(0, len(docs), job.docs_per_unit)]
  if not units:
    _drop_empty(out, created, start_state=False)
    raise CalibrationError(f"empty calibration source: no documents or prompts in {job.source}")
  counter = TokenCounter(V, mesh=mesh)  # after datasets.map forked its workers

  start = 0
  state = _load_partial(out, job, V)
  if state is not None:
    counter.counts[:] = state[0]
    start, timing = state[1]["done"], state[1]["timing"]
    _log(f"resuming {out} at unit {start}/{len(units)} ({counter.total:,} tokens so far)")
  elif gen is not None:
    (out / GENERATED).unlink(missing_ok=True)
  if gen is not None:
    _truncate_lines(out / GENERATED, start * job.batch_size)

  if finish and state is None:
    raise CalibrationError(f"--finish: {out} holds no partial counts of this job to finish")
  from tqdm.auto import tqdm

  rounds = range(start, len(units), nproc)
  bar = tqdm(total=len(units), initial=start, disable=not progress or pid != 0,
             desc=f"calibrate {job.kind}", unit="unit")
  ran = 0
  for r in rounds:
    if finish:
      _log(f"finishing early: {r} of {len(units)} units counted")
      break
    if max_units is not None and ran >= max_units:
      bar.close()
      _log(f"stopped after {ran} units ({r}/{len(units)} done); rerun to resume")
      return None
    i = r + pid
    ids = []
    if i < len(units):
      if gen is not None:
        t = time.perf_counter()
        ids, texts = gen(i, units[i])
        timing["generate_s"] += time.perf_counter() - t
        if pid == 0:
          _append_lines(out / GENERATED, texts)
      else:
        t = time.perf_counter()
        ids = units[i] if job.dataset else tokenizer(units[i], add_special_tokens=False)[
            "input_ids"]
        if not job.dataset:
          timing["tokenize_s"] += time.perf_counter() - t
      timing["documents"] += len(units[i])
    flat = np.concatenate([np.asarray(x, np.int64) for x in ids]) if len(ids) else \
        np.zeros(0, np.int64)
    t = time.perf_counter()
    counter.add(flat)
    timing["count_s"] += time.perf_counter() - t
    timing["tokens"] = counter.total
    ran += 1
    done = min(r + nproc, len(units))
    bar.update(done - bar.n)
    bar.set_postfix(tokens=f"{counter.total:,}")
    if pid == 0:
      _save_partial(out, job, counter, done, timing)
  bar.close()
  if counter.total == 0:
    # nothing counted: leave no partial state behind to block the corrected rerun
    if pid == 0:
      _drop_empty(out, created, start_state=True)
    raise CalibrationError(f"empty calibration source: {job.source} produced no tokens")

  meta = {"tokenizer_id": tok_id, "kind": job.kind, "source": job.source, "model": job.model,
          "fingerprint": job.fingerprint(), "job": job.as_dict(),
          "documents": timing["documents"], "units_done": bar.n, "units_total": len(units),
          "devices": counter.mesh.devices.size,
          "processes": nproc, "timing": _throughput(timing)}
  counts = Counts(counts=counter.counts.copy(), meta=meta)
  if pid == 0:
    counts.save(final)
    (out / PARTIAL).unlink(missing_ok=True)
    plot({Path(job.out).name: counts}, out)
    atomic_write_text(out / "calibration.json", json.dumps(
        {**{k: v for k, v in meta.items() if k != "job"}, "token_total": counts.total,
         "vocab_size": V, "nonzero_tokens": int((counts.counts > 0).sum())}, indent=2))
    _log(f"{final}: {counts.total:,} tokens, {int((counts.counts > 0).sum()):,} distinct "
         f"of V={V}; {_throughput(timing)}")
  return counts


def _throughput(t: dict) -> dict:
  rate = lambda s: round(t["tokens"] / s) if s > 0 else None  # noqa: E731
  return {**{k: (round(v, 3) if isinstance(v, float) else v) for k, v in t.items()},
          "tokenize_tokens_per_s": rate(t["tokenize_s"]), "count_tokens_per_s": rate(t["count_s"]),
          "generate_tokens_per_s": rate(t["generate_s"])}


def _dataset_units(job: CountJob, tokenizer, timing: dict) -> list:
  ds = load_dataset_source(job)
  t = time.perf_counter()
  field = job.field
  tok = ds.map(lambda b: {"_ids": tokenizer([_doc_text(x, field, "dataset") if not
                                              isinstance(x, str) else x for x in b[field]],
                                             add_special_tokens=False)["input_ids"]},
               batched=True,
               num_proc=job.num_proc if job.num_proc > 1 and len(ds) >= 2 * job.num_proc else None,
               remove_columns=ds.column_names, desc="tokenize")
  ids = tok["_ids"]
  timing["tokenize_s"] += time.perf_counter() - t
  return [ids[i:i + job.docs_per_unit] for i in range(0, len(ids), job.docs_per_unit)]


def _generated_units(job: CountJob, tokenizer, tok_id: str):
  """(units of prompts, gen(i, batch) -> (completions, generated.jsonl lines)), the completions
  written by the job's backend."""
  decode = (_torch_decoder if job.backend == "torch" else _vocabjax_decoder)(job, tokenizer, tok_id)
  prompts = calibration_prompts(job, tokenizer)
  units = [prompts[i:i + job.batch_size] for i in range(0, len(prompts), job.batch_size)]

  def gen(i, batch):
    tokens = decode(i, batch)
    texts = [json.dumps({"prompt": tokenizer.decode(p), "completion_ids": t,
                         "completion": tokenizer.decode(t, skip_special_tokens=False)})
             for p, t in zip(batch, tokens)]
    return tokens, texts

  return units, gen


def _check_generator_tokenizer(job: CountJob, gen_tok, tok_id: str) -> None:
  if gen_tok is not None and tokenizer_identity(gen_tok) != tok_id:
    raise CalibrationError(f"generator {job.generator} has another tokenizer than {job.model} "
                           f"({tokenizer_identity(gen_tok)} vs {tok_id}); its tokens cannot be "
                           f"counted in the target's vocabulary")


def _vocabjax_decoder(job: CountJob, tokenizer, tok_id: str):
  """decode(i, batch) -> completions by vocabjax's Decoder (continuous batching with `rows`)."""
  del tokenizer  # the generator's own is the one checked
  gen_model = load_model(job.generator or job.model)
  _check_generator_tokenizer(job, gen_model.tokenizer, tok_id)
  # B > 1 rows make every step a GEMM: on XLA:CPU the [in, out] MLP layout is faster there
  params = (gen_model.in_layout(block_layout()) if (job.rows or job.batch_size) > 1
            else gen_model.params)
  dec = Decoder(params, gen_model.config)
  sampling = SamplingParams(temperature=job.temperature)

  def decode(i, batch):
    kw = dict(max_new_tokens=job.max_new_tokens, sampling=sampling, seed=job.seed + i,
              eos_token_ids=gen_model.eos_token_ids, max_len=job.max_len)
    res = (dec.generate_continuous(batch, rows=job.rows, **kw) if job.rows
           else dec.generate(batch, **kw))
    return res.tokens

  return decode


def _torch_decoder(job: CountJob, tokenizer, tok_id: str):
  """decode(i, batch) -> completions by transformers' `generate`: each unit one left-padded
  batch, greedy (or sampled, seeded per unit); a completion ends at its first EOS (kept, as
  vocabjax's)."""
  import torch  # local: torch is needed by this backend only
  import transformers  # local: transformers' import costs seconds

  name = job.generator or job.model
  gen_tok = tokenizer if name == job.model else load_tokenizer_and_vocab(name)[0]
  _check_generator_tokenizer(job, gen_tok, tok_id)
  model = load_torch_model(name, job.torch_dtype)
  eos = eos_ids(model.generation_config.eos_token_id, model.config.eos_token_id,
                getattr(gen_tok, "eos_token_id", None))
  if not eos:
    raise CalibrationError(f"{name}: no EOS token id in its generation config, config or "
                           f"tokenizer; completions would never end")
  pad = gen_tok.pad_token_id if gen_tok.pad_token_id is not None else eos[0]
  # a fresh generation config: the checkpoint's own may sample or penalize repetition
  sample = job.temperature > 0
  config = transformers.GenerationConfig(
      max_new_tokens=job.max_new_tokens, do_sample=sample, eos_token_id=list(eos),
      pad_token_id=pad, **(dict(temperature=job.temperature, top_k=0, top_p=1.0) if sample
                           else dict(temperature=None, top_k=None, top_p=None)))

  def decode(i, batch):
    L = max(map(len, batch))
    ids = torch.tensor([[pad] * (L - len(p)) + list(p) for p in batch])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in batch])
    if sample:
      torch.manual_seed(job.seed + i)
    with torch.inference_mode():
      out = model.generate(ids, attention_mask=mask, generation_config=config)
    tokens = []
    for row in out[:, L:].tolist():
      end = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
      tokens.append(row[:end])
    return tokens

  return decode


def _append_lines(path: Path, lines: list[str]) -> None:
  with open(path, "a", encoding="utf-8") as f:
    f.write("".join(line + "\n" for line in lines))
    f.flush()
    os.fsync(f.fileno())


def _truncate_lines(path: Path, n: int) -> None:
  """Keep the first n complete lines (units done before an interruption)."""
  if not path.exists():
    return
  lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
  keep = [x for x in lines if x.endswith("\n")][:n]
  if len(keep) != len(lines):
    atomic_write_text(path, "".join(keep))
