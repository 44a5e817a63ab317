"""Run a suite: every method on every question (methods interleaved per question, so drift of
the machine hits all of them alike), one jsonl record per (method, question, seed) appended and
flushed as it finishes; a rerun with the same config skips what is done.

Result directory:
  run.json          the config and its fingerprint (a directory holds one configuration)
  splits.json       per-method step time split (timed once, reused on resume)
  questions.jsonl   per-question records (`run_suite`; metrics from `metrics.record_metrics`)
  summary.json, summary.md, summary.csv, speedup_by_group.png, tau_vs_vocab.png
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path

import jax
import numpy as np

from vocabjax import distributed, interrupt
from vocabjax.checkpoints import hub, zoo
from vocabjax.checkpoints.known import ShapeError, resolve_config
from vocabjax.checkpoints.loader import Model, load_model, parse_dtype, weights_default
from vocabjax.decoding.engine import prompt_bucket
from vocabjax.decoding.profile import StepSplit, run_split, skipped_drafting, step_split
from vocabjax.sampling import SamplingParams
from vocabjax.eval import provenance, report
from vocabjax.eval.config import ConfigError, EvalConfig
from vocabjax.eval.metrics import record_metrics
from vocabjax.eval.reuse import reusable
from vocabjax.eval.torch_compare import TorchRunner
from vocabjax.io import append_jsonl, atomic_write_json, read_jsonl
from vocabjax.methods import METHODS
from vocabjax.methods.eagle import release_loaded_heads
from vocabjax.prompts import encode_conversation, encode_prompts, load_prompts
from vocabjax.sharding import make_mesh, parse_mesh

RECORDS = "questions.jsonl"


class ResultDirError(ConfigError):
  """The result directory holds results of another configuration."""


def _move_aside(out: Path) -> None:
  """Move a result directory to `<out>.replaced-<time>` (never deleted)."""
  stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
  aside = out.with_name(f"{out.name}.replaced-{stamp}")
  shutil.move(str(out), str(aside))
  print(f"[vocabjax.eval] moved the old results to {aside}", file=sys.stderr)


# the keys every record holds, which the reports read (metrics.py, report.py)
RECORD_KEYS = frozenset({"framework", "method", "qid", "seed", "num_tokens", "wall_s",
                         "output_ids"})
LOCK = ".vocabjax.lock"
_HELD: dict[str, int] = {}  # result directories this process has claimed -> the lock's fd
SPLITS = "splits.json"  # the step-part timings of a result directory's methods
# what a run writes into its directory (anything else there is the user's: `_check_ours`)
# the files a run writes in its directory (what must be a file there, or absent)
OURS = ("run.json", RECORDS, SPLITS, "summary.md", "summary.csv", "summary.json", LOCK,
        "speedup_by_group.png", "tau_vs_vocab.png", "content_hashes.json")


def claim_dir(out: Path) -> None:
  """Claim `out` for this process: an exclusive lock on `out/.vocabjax.lock` (flock, held until
  the process ends or `release_dir`), with the holder's pid, host and start time written in
  it. A second run on the same directory is refused naming that process while it lives; the
  lock of a run that crashed went with its process, so its successor takes the directory over.
  A process that holds the claim already keeps it."""
  import fcntl
  import socket

  key = str(out.resolve())
  if key in _HELD:
    return
  out.mkdir(parents=True, exist_ok=True)
  path = out / LOCK
  if path.is_symlink():
    raise ResultDirError(f"{path} is a symbolic link: a run directory's files are its own")
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    try:
      holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
      holder = {}
    os.close(fd)
    raise ResultDirError(
        f"{out} is in use by another run: process {holder.get('pid', '?')} on "
        f"{holder.get('host', '?')} since {holder.get('started', '?')}; wait for it to "
        f"finish, or use another --out") from None
  os.ftruncate(fd, 0)
  os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "started": datetime.datetime.now().isoformat(
                                timespec="seconds")}).encode(), 0)
  _HELD[key] = fd


def _check_unclaimed(out: Path) -> None:
  """Refuse early (before models are loaded) a directory another live process has claimed."""
  if str(out.resolve()) in _HELD or not (out / LOCK).is_file():
    return
  claim_dir(out)  # raises naming the holder while it lives
  release_dir(out)


def release_dir(out: Path) -> None:
  """Give up this process's claim on `out` (the end of a run)."""
  fd = _HELD.pop(str(Path(out).resolve()), None)
  if fd is not None:
    os.close(fd)  # closing the descriptor releases the flock


def _check_ours(out: Path) -> None:
  """Refuse a directory holding files vocabjax did not write there: an existing directory that
  is no run of this library (no run.json) and is not empty, and symbolic links among a run's
  files (appending through one would write outside the run)."""
  if not out.is_dir():
    return
  entries = sorted(p.name for p in out.iterdir())
  if entries and not (out / "run.json").exists() and not (out / RECORDS).exists():
    foreign = [e for e in entries if e != LOCK]
    if foreign:
      raise ResultDirError(f"{out} is not empty and holds no vocabjax run (no run.json): "
                           f"{foreign[:8]}; results are never mixed with other files: use a "
                           f"new or empty directory as --out")
  _check_unclaimed(out)
  blocked = [n for n in OURS if (out / n).exists() and not (out / n).is_file()]
  if blocked:  # found now, not by the write at the end of the run
    raise ResultDirError(f"{out / blocked[0]} is not a file (a directory?): a run writes its "
                         f"{blocked[0]} there; move it away or use another --out")
  links = [p.name for p in out.iterdir() if p.is_symlink()]
  if links:
    raise ResultDirError(f"{out} holds symbolic link(s) {links[:8]}: a run writes only its own "
                         f"files; remove them or use another --out")


def prepare_dir(out: Path, config: EvalConfig, *, overwrite: bool,
                inputs: dict | None = None, claim: bool = True) -> None:
  """Claim `out` for `config` made from `inputs` (`vocabjax.eval.provenance.inputs`: model
  and method file contents, the questions' text, the library version, the machine); refuse a
  directory of another configuration or of other inputs unless `overwrite`, which moves the
  old results aside (never deletes them). So a resume never mixes records of a replaced model,
  an edited question or another machine into one table. A directory that is no vocabjax run
  and not empty, or one holding symbolic links, is refused (`_check_ours`); claiming it takes
  its lock (`claim_dir`)."""
  run = out / "run.json"
  records = out / RECORDS
  _check_ours(out)
  if not run.exists() and records.exists() and records.stat().st_size:
    # records whose configuration and inputs cannot be checked: never resumed into a table
    if not overwrite:
      raise ResultDirError(f"{out} holds {RECORDS} without its run.json: the configuration "
                           f"and inputs of its records cannot be checked. Use another --out, "
                           f"or --overwrite to move them aside.")
    if not claim:
      return
    _move_aside(out)
  if run.exists():
    try:
      old = json.loads(run.read_text())
    except json.JSONDecodeError:
      old = {"fingerprint": "<unreadable run.json>", "config": {}}
    problem = None
    if old.get("fingerprint") != config.fingerprint():
      new = config.as_dict()
      diff = sorted(k for k in set(new) | set(old.get("config", {}))
                    if new.get(k) != old.get("config", {}).get(k))
      problem = (f"results of a different configuration (fingerprint {old.get('fingerprint')} "
                 f"vs {config.fingerprint()}; differing fields: {diff})")
    elif inputs is not None and old.get("inputs") != inputs:
      problem = (f"results of the same configuration made from other inputs: "
                 f"{provenance.describe_change(old.get('inputs'), inputs)}")
    if problem:
      if not overwrite:
        raise ResultDirError(f"{out} holds {problem}. Use another --out, or --overwrite to "
                             f"move the old results aside.")
      if not claim:  # only checking: the move waits until the run is sure to start
        return
      _move_aside(out)
  if not claim:
    return
  claim_dir(out)
  if not run.exists():
    atomic_write_json(run, {"fingerprint": config.fingerprint(), "config": config.as_dict(),
                            "inputs": inputs,
                            "created": datetime.datetime.now().isoformat(timespec="seconds")})


def read_records(path: Path, *, repair: bool = True) -> list[dict]:
  """Records written so far; a torn last line (interrupted write) is dropped (and, with
  `repair`, the file rewritten without it: a run about to append; a report only reads)."""
  return read_jsonl(path, ResultDirError, repair=repair)


@dataclasses.dataclass
class Loaded:
  target: Model
  draft: Model | None
  own_drafts: dict = dataclasses.field(default_factory=dict)  # a method's own drafter by source

  def draft_of(self, m) -> Model | None:
    """The drafter method `m` (a `MethodSpec`) drafts with: its own, else the suite's."""
    return self.own_drafts[m.draft] if m.draft else self.draft

  def drafters(self) -> list:
    """(role, model) of every drafter loaded: the suite's, then the methods' own."""
    out = [("drafter", self.draft)] if self.draft is not None else []
    return out + [(f"drafter {src}", d) for src, d in self.own_drafts.items()]


def suite_dtypes(config: EvalConfig, compare_torch: bool = False) -> tuple:
  """(target, drafter) dtypes `load_model` is asked for: the suite's fields; None where it
  gives none, which loads a GGUF file's own blocks on one CPU device
  (`loader.weights_default`), except beside PyTorch (`compare_torch`): transformers runs the
  file's values in float32, and so does vocabjax then."""
  target = config.dtype or ("float32" if compare_torch else None)
  return target, config.draft_dtype or target


def load_models(config: EvalConfig, mesh=None, progress: bool = True,
                compare_torch: bool = False) -> Loaded:
  """The suite's models (`suite_dtypes`); on `mesh`, each tensor placed with its sharding as
  it is read. `progress`: the fetch's and the checksum's bars (off under `--quiet`)."""
  t_dtype, d_dtype = suite_dtypes(config, compare_torch)
  target = load_model(config.target, dtype=t_dtype, mesh=mesh, progress=progress)

  def drafter(source: str, methods) -> Model:
    # the drafter's tokenizer only matters to a cross-vocabulary method
    cross = any(m.method == "crossvocab" for m in methods)
    return load_model(source, dtype=d_dtype, load_tokenizer=cross, mesh=mesh,
                      progress=progress)

  shared = [m for m in config.methods if not m.draft]
  draft = drafter(config.draft, shared) if config.draft else None
  own = {}
  for m in config.methods:
    if m.draft and m.draft not in own:
      own[m.draft] = drafter(m.draft, [x for x in config.methods if x.draft == m.draft])
  return Loaded(target, draft, own)


def _length_limits(config: EvalConfig, models: Loaded) -> list[tuple[str, int]]:
  """(name, tokens) of every bound a prompt and its new tokens must fit: `max_len`, and each
  model's context."""
  limits = [(f"max_len={config.max_len}", config.max_len)] if config.max_len else []
  for role, m in (("target", models.target), *models.drafters()):
    ctx = m.config.max_position_embeddings if m is not None else None
    if ctx:
      limits.append((f"the {role}'s context of {ctx}", ctx))
  return limits


def bad_prompts(prompts, ids, config: EvalConfig, models: Loaded, room: int) -> list:
  """(prompt, reason) for every prompt that cannot run: empty once encoded, or too long for
  `max_len` or for a model's context with `room` slots of new tokens (the longest method's)."""
  limits = _length_limits(config, models)
  out = []
  for p, x in zip(prompts, ids):
    if not x:
      out.append((p, "empty once encoded"))
      continue
    for name, limit in limits:
      if len(x) + room > limit:
        out.append((p, f"{len(x)} tokens + {room} slots for new tokens exceed {name}"))
        break
  return out


def _remembering(dec):
  """The part of a decoder that drafts from earlier requests' outputs (SuffixDecoding's global
  tree, alone or as a hybrid's host tree: `remember`, `untracked`), or None."""
  p = getattr(dec, "proposer", None)
  host = getattr(p, "host", None)
  for part in (p, host, getattr(host, "suffix", None)):
    if callable(getattr(part, "remember", None)):
      return part
  return None


def _turn_ids(tok, config: EvalConfig, p, t: int, answers, room: int, limits) -> list[int]:
  """The prompt of turn t of conversation `p`: its turns so far with the method's own `answers`
  (decoded, special tokens dropped); a ConfigError naming the question, the turn and the
  tokens when it leaves too little room for the new tokens (`limits`: `_length_limits`)."""
  texts = [tok.decode(a, skip_special_tokens=True) for a in answers]
  try:
    x = encode_conversation(tok, p.turns[:t + 1], texts, config.chat,
                            dict(config.chat_template_kwargs), where=f"{p.qid} turn {t + 1}")
  except ValueError as e:
    raise ConfigError(f"config {config.name}: {p.qid} turn {t + 1} cannot be encoded: "
                      f"{e}") from e
  for what, limit in limits:
    if len(x) + room > limit:
      raise ConfigError(f"config {config.name}: {p.qid} turn {t + 1}: the conversation so far "
                        f"is {len(x)} tokens; with {room} slots for new tokens it exceeds "
                        f"{what}: raise max_len (or drop it to size the cache per prompt), or "
                        f"lower max_new_tokens")
  return x


def _check_map_count(n_methods: int, path: str = "/proc/sys/vm/max_map_count") -> None:
  """Warn when many methods may exhaust Linux's memory-map limit.

  Every XLA:CPU executable holds ~1-2K memory mappings for the Qwen pair's programs, and a suite
  keeps each method's programs per prompt-length bucket: the 9-method `vocabtrim` suite crashed
  at ~65K mappings (the default limit) with "LLVM compilation error: Cannot allocate memory"
  and a segfault, with RAM to spare. Raising the limit fixed it.
  """
  try:
    limit = int(Path(path).read_text())
  except (OSError, ValueError):
    return
  if n_methods > 4 and limit < 262144:
    print(f"[vocabjax.eval] warning: {n_methods} methods compile many XLA:CPU programs and may "
          f"exceed vm.max_map_count={limit} (the process then dies with 'LLVM compilation "
          f"error: Cannot allocate memory'); raise it with `sysctl -w "
          f"vm.max_map_count=262144`, or split the suite (a rerun resumes)", file=sys.stderr)


def run_suite(config: EvalConfig, out: str | os.PathLike, *, overwrite: bool = False,
              compare_torch: bool = False, progress: bool = True,
              models: Loaded | None = None, skip_bad_prompts: bool = False,
              reference: str | None = None, reuse: tuple[str, ...] = ()) -> dict:
  """Run (or resume) `config` into `out` and write the reports; returns the summary.

  Every prompt is checked against the cache and the models' context before anything is
  generated or `out` is claimed: an empty prompt or one too long fails the suite up front,
  naming each question and its file, or, with `skip_bad_prompts`, is left out and listed in
  the summary (`skipped`). Neither choice changes the fingerprint, so finished records stay.

  The report sets the run beside a recorded reference run (`report.reference_summary_path`:
  `reference`, a results directory or summary.json, else the shipped reference of the suite,
  `vocabjax/eval/references/<suite>.json`; "none": no comparison).

  Under `jax.distributed` (`vocabjax.distributed`) every process runs every question on the
  mesh over all processes' devices; process 0 alone claims `out`, reads the records a resumed
  run has (the others get its list of what is still to run), writes records and reports, and
  returns the summary (the others return {"process": their index}).

  `reuse`: result directories whose records this run would make identically are taken from
  there instead of generated again (`vocabjax.eval.reuse`: same settings, models, machine and
  version; per method the same parameters and files; per question the same text)."""
  try:
    with hub.showing_progress(None if progress else False):  # the heads' downloads too
      return _run_suite(config, out, overwrite=overwrite, compare_torch=compare_torch,
                        progress=progress, models=models, skip_bad_prompts=skip_bad_prompts,
                        reference=reference, reuse=reuse)
  finally:
    release_dir(Path(out))  # the claim `prepare_dir` took (none: nothing to release)


def _run_suite(config: EvalConfig, out: str | os.PathLike, *, overwrite: bool,
               compare_torch: bool, progress: bool, models: Loaded | None,
               skip_bad_prompts: bool, reference: str | None, reuse: tuple[str, ...]) -> dict:
  """`run_suite`'s stages: every check before `out` is claimed, then records and reports."""
  writer = distributed.is_main()
  progress = progress and writer
  out = Path(out)
  _check_map_count(len(config.methods))
  prompts = load_prompts(config.datasets)  # bad datasets fail before anything is written
  inputs = provenance.inputs(config, prompts, suite_dtypes(config, compare_torch))
  if writer:
    prepare_dir(out, config, overwrite=overwrite, inputs=inputs, claim=False)  # refuse early
  ref_path = report.reference_summary_path(config.name, out, reference)  # a bad path, early
  mesh = _suite_mesh(config)
  t0 = time.perf_counter()
  models = models or load_models(config, mesh, progress, compare_torch)
  load_s = time.perf_counter() - t0
  ids = _encoded(config, models, prompts)
  decoders = _decoders(config, models, mesh)
  room = config.max_new_tokens + max(d.extra_slots for d in decoders.values())
  prompts, ids, skipped = _runnable(config, models, prompts, ids, room, skip_bad_prompts)
  reused = _reusable(config, out, inputs, prompts, reuse) if writer else []
  records, splits = [], {}
  if writer:
    prepare_dir(out, config, overwrite=overwrite, inputs=inputs)
    records = read_records(out / RECORDS)
    splits = json.loads((out / SPLITS).read_text()) if (out / SPLITS).exists() else {}
  done = {(r["framework"], r["method"], r["qid"], r["seed"]) for r in records}
  _take_reused(out, reused, records, splits, done)
  if config.time_split:
    _time_step_parts(config, decoders, splits, out, writer, progress)
  commit = report.git_commit()
  _generate(config, models, decoders, prompts, ids, room, records, splits, done, out, writer,
            progress, commit)
  if not writer:
    return {"process": jax.process_index()}

  info = report.models_info(models)
  eos = models.target.eos_token_ids
  torch_versions = None
  if compare_torch:
    # free vocabjax's weights first: both frameworks' f32 copies do not fit 24 GB together
    del decoders, models
    release_loaded_heads()  # the shared EAGLE heads reference the target's params
    gc.collect()
    torch_versions = _run_torch(config, prompts, ids, eos, out, records, done, progress,
                                commit)
  summary = report.build_summary(config, records, info, splits, meta={
      "load_s": load_s, "torch_versions": torch_versions, "skipped": skipped})
  if ref_path is not None:
    summary = report.attach_reference(summary, ref_path)
  report.write_reports(out, summary)
  return summary



def _suite_mesh(config: EvalConfig):
  """The suite's mesh (None without one); data=1: a suite decodes one question at a time."""
  if not config.mesh:
    return None
  try:
    mesh = make_mesh(**parse_mesh(config.mesh))
  except ValueError as e:
    raise ConfigError(f"config {config.name}: {e}") from None
  if mesh.shape["data"] != 1:
    raise ConfigError(f"config {config.name}: mesh {config.mesh!r}: a suite decodes one "
                      f"question at a time (batch 1), so its mesh needs data=1 (tensor "
                      f"parallel over model); got data={mesh.shape['data']}")
  return mesh


def _encoded(config: EvalConfig, models: Loaded, prompts) -> list[list[int]]:
  """Each prompt's first turn as the target's ids (through its chat template with `chat`)."""
  try:
    return encode_prompts(models.target.tokenizer, [p.text for p in prompts], config.chat,
                          dict(config.chat_template_kwargs))
  except ValueError as e:  # generate's wording names its --chat flag; eval has `chat:`
    if config.chat and "has no chat template" in str(e):
      raise ConfigError(f"config {config.name}: chat: true, but the target's tokenizer "
                        f"({config.target}) has no chat template; set chat: false") from e
    raise ConfigError(f"config {config.name}: the prompts cannot be encoded: {e}") from e


def _decoders(config: EvalConfig, models: Loaded, mesh) -> dict:
  """{method name: decoder}; pairing and parameter errors before `out` is claimed."""
  decoders = {}
  for m in config.methods:
    try:
      method = METHODS[m.method]
      draft = models.draft_of(m) if method.needs_draft else None
      decoders[m.name] = method.make(models.target, draft, m.kwargs, mesh)
    except (ValueError, KeyError) as e:
      raise ConfigError(f"config {config.name}: method {m.name!r} ({m.method}) cannot be "
                        f"built with these models: {e}") from e
  return decoders


def _runnable(config: EvalConfig, models: Loaded, prompts, ids, room: int,
              skip_bad_prompts: bool):
  """(prompts, ids, skipped): the prompts that fit the cache and the models' context. One that
  does not fails the suite (before any generation and before `out` is claimed), naming it,
  or with `skip_bad_prompts` is left out and listed."""
  bad = bad_prompts(prompts, ids, config, models, room)
  if bad and not skip_bad_prompts:
    listed = "; ".join(f"{p.qid} ({p.source or 'no file'}): {why}" for p, why in bad[:10])
    more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
    hint = ("raise max_len or drop it to size the cache per prompt" if config.max_len else
            "shorten or drop them")
    raise ConfigError(f"{len(bad)} of {len(prompts)} prompts cannot run: {listed}{more}; "
                      f"{hint}, or pass --skip-bad-prompts to run the others and list these "
                      f"in the summary")
  skipped = [{"qid": p.qid, "source": p.source, "reason": why} for p, why in bad]
  if bad and len(bad) == len(prompts):
    why = "; ".join(f"{p.qid}: {w}" for p, w in bad[:3])
    raise ConfigError(f"all {len(prompts)} prompts cannot run ({why}"
                      f"{' ...' if len(bad) > 3 else ''}): --skip-bad-prompts leaves nothing "
                      f"to measure; raise max_len or use other prompts")
  if bad:
    drop = {p.qid for p, _ in bad}
    print(f"[vocabjax.eval] skipping {len(bad)} prompts that cannot run: {sorted(drop)}",
          file=sys.stderr)
    keep = [i for i, p in enumerate(prompts) if p.qid not in drop]
    prompts, ids = [prompts[i] for i in keep], [ids[i] for i in keep]
  return prompts, ids, skipped


def _reusable(config: EvalConfig, out: Path, inputs, prompts, reuse) -> list:
  """[(source, what it can give)] for each `--reuse` directory; one that cannot be reused fails
  before `out` is claimed."""
  found = []
  for source in reuse:
    if Path(source).resolve() == out.resolve():
      raise ConfigError(f"--reuse {source} is this run's own --out (a rerun resumes it "
                        f"anyway)")
    found.append((source, reusable(source, config, inputs, prompts, set())))
  return found


def _take_reused(out: Path, reused, records: list, splits: dict, done: set) -> None:
  """The reusable records not here yet appended (to `records`, `done` and the file), their
  methods' step splits too."""
  for source, found in reused:
    for why in found.skipped:
      print(f"[vocabjax.eval] --reuse {source}: not reused: {why}", file=sys.stderr)
    new = [r for r in found.records
           if (r["framework"], r["method"], r["qid"], r["seed"]) not in done]
    for r in new:
      append_jsonl(out / RECORDS, r)
      done.add((r["framework"], r["method"], r["qid"], r["seed"]))
    records += new
    methods = {r["method"] for r in new}
    fresh = {n: s for n, s in found.splits.items() if n in methods and n not in splits}
    if fresh:
      splits.update(fresh)
      atomic_write_json(out / SPLITS, splits)
    print(f"[vocabjax.eval] --reuse {source}: {len(new)} records taken "
          f"({len(found.records) - len(new)} already here), {len(methods)} methods",
          file=sys.stderr)


def _time_step_parts(config: EvalConfig, decoders: dict, splits: dict, out: Path, writer: bool,
                     progress: bool) -> None:
  """The step-part timings of the methods that time them and have none yet (every process
  times, its programs span the mesh; process 0 writes)."""
  names = [n for n, dec in decoders.items() if dec.times_step_parts]
  need = distributed.broadcast_from_main(np.array([n not in splits for n in names], bool))
  for name, todo_split in zip(names, need):
    if todo_split:
      if progress:
        print(f"[vocabjax.eval] timing the step parts of {name}", file=sys.stderr)
      splits[name] = step_split(decoders[name], max_len=config.max_len or 512,
                                repeats=3).as_dict()
      if writer:
        atomic_write_json(out / SPLITS, splits)


def _generate(config: EvalConfig, models: Loaded, decoders: dict, prompts, ids, room: int,
              records: list, splits: dict, done: set, out: Path, writer: bool, progress: bool,
              commit) -> None:
  """Every (question, seed, method) not recorded yet generated, turn by turn, each record
  appended as it comes (process 0) and to `records`; Ctrl-C finishes the current question."""
  from tqdm.auto import tqdm

  tok, eos = models.target.tokenizer, models.target.eos_token_ids
  sampling = SamplingParams(config.temperature, config.top_k, config.top_p,
                            config.draft_in_set)
  todo = [(p, i, s) for i, p in enumerate(prompts) for s in config.seeds]
  every = [(p, i, s, m.name) for p, i, s in todo for m in config.methods]
  missing = distributed.broadcast_from_main(  # a conversation: any of its turns
      np.array([any(("vocabjax", name, p.turn_qid(t), s) not in done
                    for t in range(len(p.turns))) for p, _, s, name in every], bool))
  answered = {(r["method"], r["qid"], r["seed"]): r["output_ids"] for r in records
              if r["framework"] == "vocabjax"}
  limits = _length_limits(config, models)  # what a later turn's conversation must fit
  jobs = [job for job, m in zip(every, missing) if m]
  # a method that drafts from earlier outputs (SuffixDecoding's global tree) gets the recorded
  # ones, in the order an uninterrupted run made them, before it answers anything new
  todo_or_replay = [(job, bool(m)) for job, m in zip(every, missing)
                    if m or _remembering(decoders[job[3]]) is not None]
  old = sorted({r.get("commit") for r in records} - {commit})
  if old:
    print(f"[vocabjax.eval] resuming records made at other commits {old} (now {commit}); "
          f"the summary lists every commit", file=sys.stderr)
  warmed = set()
  bar = tqdm(total=len(jobs), desc="vocabjax.eval", disable=not progress, file=sys.stderr)
  with interrupt.deferred_interrupt():  # Ctrl-C: finish and record the current question
    for (p, i, seed, name), todo in todo_or_replay:
      dec = decoders[name]
      keeper = _remembering(dec)
      kw = dict(max_new_tokens=config.max_new_tokens, sampling=sampling, seed=seed,
                eos_token_ids=eos, max_len=config.max_len)
      answers = []  # a conversation's earlier answers (this method's own)
      for t in range(len(p.turns)):
        interrupt.check()  # a deferred Ctrl-C stops here, after the last record was written
        qid = p.turn_qid(t)
        if (name, qid, seed) in answered:  # a resumed conversation: this turn is recorded
          if keeper is not None:
            x = ids[i] if t == 0 else _turn_ids(tok, config, p, t, answers, room, limits)
            keeper.remember(x, answered[(name, qid, seed)])
          answers.append(answered[(name, qid, seed)])
          continue
        x = ids[i] if t == 0 else _turn_ids(tok, config, p, t, answers, room, limits)
        # The first call of a method at a prompt-block shape pays one-off costs (compilation,
        # which `compile_s` keeps out anyway, and first-touch allocation of its buffers: a
        # chain step's first prefill of a 152-token prompt took 9.9 s against 6.7 s on later
        # calls), so each (method, prompt block) is run once untimed first; every method gets
        # the same.
        shape = (name, prompt_bucket(len(x)))
        if shape not in warmed:
          with (keeper.untracked() if keeper is not None else contextlib.nullcontext()):
            dec.generate([x], **{**kw, "max_new_tokens": min(8, config.max_new_tokens)})
          warmed.add(shape)
        res = dec.generate([x], **kw)
        rec = {"framework": "vocabjax", "method": name, "qid": qid, "group": p.turn_group(t),
               "category": p.category, "seed": seed, "prompt_tokens": len(x),
               "output_ids": res.tokens[0], "compile_s": res.compile_s, "commit": commit,
               **record_metrics(res)}
        if p.followups:
          rec["turn"] = t + 1
        extra = dec.run_record(res)  # method-specific counts (crossvocab: n-gram hits, ...)
        if extra:
          rec["extra"] = extra
        split = splits.get(name)
        rec["time_split"] = None
        if split and res.stats is not None:
          rec["time_split"] = run_split(StepSplit.from_dict(split), res.steps, res.decode_s,
                                        **skipped_drafting(res.stats))
        if writer:
          append_jsonl(out / RECORDS, rec)
        records.append(rec)
        answered[(name, qid, seed)] = res.tokens[0]
        answers.append(res.tokens[0])
      if todo:  # (a conversation only replayed has no new record)
        bar.set_postfix_str(f"{name} {p.qid} {rec['tokens_per_s']:.2f} tok/s")
        bar.update(1)
  bar.close()


def _check_record_keys(records, path: Path, keys, which=lambda r: True) -> None:
  """A record lacking any of `keys` (among those `which` selects) named by file:line and the
  keys, not a KeyError."""
  for i, r in enumerate(records):
    missing = sorted(set(keys) - set(r)) if isinstance(r, dict) else sorted(keys)
    if missing and (not isinstance(r, dict) or which(r)):
      raise ResultDirError(f"--report-only: {path}:{i + 1} is not a whole record: it lacks "
                           f"{missing}; move the file away or rerun the suite")


def config_info(config: EvalConfig) -> dict:
  """`report.models_info` without loading weights: the models' configs by name
  (`vocabjax.checkpoints.known.resolve_config`: the registry's known configs, a config.json, a
  .gguf)
  and their sources as `load_model` names them (a registry model: its cache path)."""

  def one(name):
    if name is None:
      return None, None
    try:
      cfg = resolve_config(name)[1]
    except ShapeError as e:
      raise ConfigError(f"config {config.name}: --report-only needs the models' configs: {e}")
    entry = zoo.REGISTRY.get(name)
    return cfg, str(zoo.cache_dir() / entry.filename) if entry else str(name)

  (tcfg, tsrc), (dcfg, dsrc) = one(config.target), one(config.draft)
  t_dtype, d_dtype = suite_dtypes(config)
  return {"target_config": tcfg, "target_source": tsrc, "draft_config": dcfg,
          "draft_source": dsrc,
          "own_drafts": {m.draft: one(m.draft) for m in config.methods if m.draft},
          "dtype": report.weights_label(
              weights_default(config.target, t_dtype, config.mesh),
              weights_default(config.draft, d_dtype, config.mesh) if config.draft else None)}


def report_only(config: EvalConfig, out: str | os.PathLike, *,
                reference: str | None = None) -> dict:
  """Write the reports of `out` from the records already there, generating nothing (a run cut
  short, or one whose models are no longer at hand); returns the summary.

  Only questions (and seeds) that every method finished are counted, so every method is
  measured on the same questions; the summary's `partial` says how many of the suite's that
  is and how many records were left out (null when the run is complete). The machine and CPU
  in the summary are those the records were made on (`run.json`), not this one's. The methods'
  files need not be here (`config` loaded with `check_files=False`): a method whose MBSU needs
  them is listed in the summary's `mbsu_unavailable` instead."""
  out = Path(out)
  run = out / "run.json"
  if not run.is_file():
    raise ResultDirError(f"--report-only: {out} holds no run.json (no run of a suite there)")
  try:
    meta_run = json.loads(run.read_text())
  except json.JSONDecodeError as e:
    raise ResultDirError(f"--report-only: {run} is not readable JSON ({e})") from None
  prepare_dir(out, config, overwrite=False, claim=False)  # same configuration, or an error
  ref_path = report.reference_summary_path(config.name, out, reference)
  prompts = load_prompts(config.datasets)
  records = read_records(out / RECORDS, repair=False)  # a report rewrites no records file
  if not records:
    raise ResultDirError(f"--report-only: {out / RECORDS} holds no records yet")
  names = [m.name for m in config.methods]
  _check_record_keys(records, out / RECORDS, ("framework", "method", "qid", "seed"))
  have = {}
  for r in records:
    if r["framework"] == "vocabjax":
      have.setdefault((r["qid"], r["seed"]), set()).add(r["method"])
  order = [(p.qid, s) for p in prompts for s in config.seeds]
  complete = [q for q in order if have.get(q, set()) >= set(names)]
  if not complete:
    raise ResultDirError(f"--report-only: no question in {out} was finished by every method "
                         f"({len(records)} records; methods {names})")
  keep = set(complete)
  kept = [r for r in records if (r["qid"], r["seed"]) in keep]
  _check_record_keys(records, out / RECORDS, RECORD_KEYS,
                     lambda r: (r["qid"], r["seed"]) in keep)  # what the report reads
  partial = None
  if len(complete) < len(order):
    partial = {"questions": len(complete), "of": len(order),
               "records_left_out": len(records) - len(kept),
               "left_out": [f"{q}/seed {s}" for q, s in order if (q, s) not in keep]}
  splits_path = out / SPLITS
  splits = json.loads(splits_path.read_text()) if splits_path.exists() else {}
  machine = (meta_run.get("inputs") or {}).get("machine") or {}
  summary = report.build_summary(config, kept, config_info(config), splits, meta={
      "load_s": None, "torch_versions": None, "skipped": [], "partial": partial,
      "files_may_be_missing": True,
      "environment": {"report_only": True,
                      **({"machine": machine["host"]} if "host" in machine else {}),
                      **({"cpu": machine["cpu"]} if "cpu" in machine else {}),
                      **({"cpu_count": machine["cpus"]} if "cpus" in machine else {})}})
  if ref_path is not None:
    summary = report.attach_reference(summary, ref_path)
  report.write_reports(out, summary)
  return summary


def _run_torch(config, prompts, ids, eos, out, records, done, progress, commit) -> dict:
  from tqdm.auto import tqdm

  import jax.numpy as jnp

  runner = TorchRunner(config.target, config.draft, threads=os.cpu_count(),
                       dtype=jnp.dtype(parse_dtype(config.dtype)).name)
  variants = [("ar", False)] + ([(runner.assisted_name, True)] if config.draft else [])
  jobs = [(p, i, s, name, a) for i, p in enumerate(prompts) for s in config.seeds
          for name, a in variants if ("torch", name, p.qid, s) not in done]
  if jobs:  # warm-up
    runner.generate(ids[0], max_new_tokens=4, assisted=bool(config.draft), eos_token_ids=eos)
  for p, i, seed, name, assisted in tqdm(jobs, desc="transformers", disable=not progress,
                                         file=sys.stderr):
    r = runner.generate(ids[i], max_new_tokens=config.max_new_tokens, assisted=assisted,
                        eos_token_ids=eos, temperature=config.temperature, seed=seed)
    # a conversation's first turn only (its later turns hold vocabjax's own answers)
    rec = {"framework": "torch", "method": name, "qid": p.qid, "group": p.turn_group(0),
           "category": p.category, "seed": seed, "prompt_tokens": len(ids[i]), **r,
           "prefill_s": None, "decode_s": None, "steps": None, "accepted": None,
           "drafted": None, "finish_reason": None, "compile_s": 0.0, "time_split": None,
           "commit": commit}
    append_jsonl(out / RECORDS, rec)
    records.append(rec)
  return runner.versions
