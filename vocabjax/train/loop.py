"""Shared training machinery: the optimizer, orbax checkpoints with resume, progress, curves.

    cfg = OptimConfig(lr=3e-3, warmup_steps=50, total_steps=1000)
    step_fn = jax.jit(lambda st, batch, hyper: apply_grads(st, grads_of(st, batch),
                                                           optimizer_of(hyper)))
    ckpt = Checkpoints(out / "checkpoints", job_fingerprint)
    step, state = ckpt.restore_or(TrainState.create(params, make_optimizer(cfg)))
    for step in progress(range(step, total)):
      state = step_fn(state, batch, cfg.array()); ckpt.maybe_save(step + 1, state)

The optimizer is optax AdamW under a linear-warmup + cosine-decay schedule, after global-norm
gradient clipping; a jitted step reads its numbers (lr, warmup, steps, ...) from an array
argument, so that jobs differing only there share one compiled program. Checkpoints are
orbax `CheckpointManager` directories holding the whole `TrainState` (params, optimizer state,
step); a directory written by another job (other data, model or hyperparameters: its
fingerprint) is refused rather than resumed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from vocabjax import interrupt
from vocabjax.checkpoints.hub import (add_allow_bin_argument, allow_bin_from_args,
                                     showing_progress)
from vocabjax.errors import disk_full, disk_full_message
from vocabjax.io import atomic_write_json
from vocabjax.plots import save_png, subplots


class TrainInterrupted(KeyboardInterrupt):
  """Ctrl-C during training, after the last checkpoint was written: its message says where."""


class TrainError(ValueError):
  """Bad training input (config, data, checkpoint of another job); the message names values."""


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  lr: float = 1e-3
  warmup_steps: int = 50
  total_steps: int = 1000
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  end_lr_ratio: float = 0.1  # cosine decays to lr * end_lr_ratio

  def __post_init__(self):
    if self.total_steps < 1 or not 0 <= self.warmup_steps <= self.total_steps:
      raise TrainError(f"need 0 <= warmup_steps <= total_steps and total_steps >= 1, got "
                       f"warmup_steps={self.warmup_steps}, total_steps={self.total_steps}")
    if self.lr <= 0:
      raise TrainError(f"lr must be positive, got {self.lr}")

  def array(self) -> jax.Array:
    """The numbers as one f32 array, the argument `optimizer_of` reads inside a jitted step:
    jobs that differ only in them (steps, warmup, lr, ...) then share one compiled program."""
    return jnp.asarray([getattr(self, f) for f in HYPERPARAMETERS], jnp.float32)


HYPERPARAMETERS = ("lr", "warmup_steps", "total_steps", "weight_decay", "clip_norm",
                   "end_lr_ratio")


def schedule(cfg: OptimConfig) -> optax.Schedule:
  """Linear warmup from 0 to `lr` over `warmup_steps`, then a cosine decay to
  `lr * end_lr_ratio` at `total_steps` (optax's `warmup_cosine_decay_schedule`, written out so
  that its numbers may be traced values)."""
  return _schedule(cfg.lr, cfg.warmup_steps, cfg.total_steps, cfg.end_lr_ratio)


def _schedule(lr, warmup_steps, total_steps, end_lr_ratio) -> optax.Schedule:
  def value(count):
    count = jnp.asarray(count, jnp.float32)
    warm = jnp.clip(count, 0, warmup_steps)
    up = (0.0 - lr) * (1 - warm / jnp.maximum(warmup_steps, 1)) + lr
    decay_steps = jnp.maximum(total_steps - warmup_steps, 1)
    c = jnp.minimum(count - warmup_steps, decay_steps)
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * c / decay_steps))
    down = lr * ((1 - end_lr_ratio) * cosine + end_lr_ratio)
    return jnp.where(count < warmup_steps, up, down)
  return value


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  """AdamW under `schedule(cfg)` after global-norm clipping, cfg's numbers as constants (for
  `TrainState.create`; a jitted step builds the same optimizer with `optimizer_of`)."""
  return _optimizer(*(getattr(cfg, f) for f in HYPERPARAMETERS))


def optimizer_of(hyper: jax.Array) -> optax.GradientTransformation:
  """`make_optimizer`'s optimizer with its numbers read from `OptimConfig.array()` (traced
  inside a jitted step, so the program does not depend on them; its state has the same
  structure as `make_optimizer`'s)."""
  return _optimizer(*(hyper[i] for i in range(len(HYPERPARAMETERS))))


def _optimizer(lr, warmup_steps, total_steps, weight_decay, clip_norm, end_lr_ratio):
  return optax.chain(optax.clip_by_global_norm(clip_norm),
                     optax.adamw(_schedule(lr, warmup_steps, total_steps, end_lr_ratio),
                                 weight_decay=weight_decay))


@struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  aux: Any = None  # saved and restored with the state, never optimized (e.g. a head's d2t)

  @classmethod
  def create(cls, params, opt: optax.GradientTransformation, aux=None) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt.init(params),
               aux=aux)


def apply_grads(state: TrainState, grads, opt: optax.GradientTransformation) -> TrainState:
  """One optimizer step (`opt`: inside a jitted step, `optimizer_of(hyper)`)."""
  updates, opt_state = opt.update(grads, state.opt_state, state.params)
  return TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                    opt_state=opt_state, aux=state.aux)


class Checkpoints:
  """An orbax checkpoint directory of one training job (identified by `fingerprint`)."""

  def __init__(self, directory: Path, fingerprint: str, *, every: int = 100, keep: int = 2):
    import orbax.checkpoint as ocp

    self.dir = Path(directory).absolute()
    self.every = every
    marker = self.dir / "job.json"
    if marker.exists():
      have = json.loads(marker.read_text()).get("fingerprint")
      if have != fingerprint:
        raise TrainError(f"{self.dir} holds checkpoints of another training job (fingerprint "
                         f"{have}, this job's is {fingerprint}); use another output directory "
                         f"or delete it")
    else:
      atomic_write_json(marker, {"fingerprint": fingerprint})
    self.manager = ocp.CheckpointManager(
        self.dir, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def restore_or(self, state: TrainState) -> TrainState:
    """The newest saved state (same structure as `state`), or `state` when none is saved."""
    import orbax.checkpoint as ocp

    step = self.manager.latest_step()
    if step is None:
      # committed where a restored state's arrays are (orbax's restore commits them): a fresh
      # and a resumed run then trace one program (an uncommitted state lowers without
      # shardings, a different program, compiled again for the resumed run)
      return jax.device_put(state, jax.tree.map(lambda x: x.sharding, state))
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def save(self, step: int, state: TrainState, *, force: bool = False) -> None:
    import orbax.checkpoint as ocp

    if force or step % self.every == 0:
      self.manager.save(step, args=ocp.args.StandardSave(state), force=force)

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


OWNER = "vocabjax-job.json"  # beside a training job's outputs: which job they belong to


def _marked_fingerprint(marker: Path) -> str | None:
  """The fingerprint a job marker (OWNER, checkpoints/job.json) names; None if unreadable."""
  try:
    return json.loads(marker.read_text()).get("fingerprint")
  except (OSError, json.JSONDecodeError):
    return None


def _recorded_by(out: Path, job: dict | None) -> bool:
  """Whether `out`'s summary.json records the job `job` (a job's fields, `dataclasses.asdict`):
  each field it records but `out` (where it was written, since moved) has this job's value
  (fields added to the job since may be absent). A run committed with its summary but not its
  marker (as the older ones are) is then its own job's to rewrite, so its recorded command
  rebuilds it on a fresh clone."""
  if job is None:
    return False
  mine = json.loads(json.dumps(job, default=str))  # tuples as lists, as the summary has them
  for name in ("summary.json", "recall.json"):  # (the ranker's summary is recall.json)
    try:
      rec = json.loads((out / name).read_text()).get("job")
    except (OSError, json.JSONDecodeError, AttributeError):
      continue
    if (isinstance(rec, dict) and rec and set(rec) <= set(mine)
        and all(rec[k] == mine[k] for k in rec if k != "out")):
      return True
  return False


def claim_output(out: Path, fingerprint: str, what: str, job: dict | None = None) -> None:
  """Mark `out` as this job's (`OWNER`), or raise TrainError if it holds another job's outputs:
  the marker names another fingerprint, or outputs are there with no marker to say whose (e.g.
  `checkpoints/` was removed: the job.json inside it went with it, and another job would
  otherwise overwrite the log and exports without a word) and no summary.json recording this
  very job (`job`: its fields; `_recorded_by`)."""
  marker = out / OWNER
  if marker.exists():
    have = _marked_fingerprint(marker)
    if have != fingerprint:
      raise TrainError(f"{out} holds the outputs of another training job ({marker.name}: "
                       f"fingerprint {have}, this {what} job's is {fingerprint}); use another "
                       f"output directory or delete it")
    return
  ckpt_marker = out / "checkpoints" / "job.json"
  # log.jsonl is written by TrainRun alone: a log with no marker of whose it is belongs to a
  # job that cannot be identified (what a trainer writes before its run, e.g. distillation's
  # target side, is its own and checked by its own fingerprints)
  if not ckpt_marker.exists() and (out / "log.jsonl").exists() and not _recorded_by(out, job):
    raise TrainError(f"{out} holds the outputs of a training job that cannot be identified "
                     f"(log.jsonl, but no {OWNER}, no checkpoints/job.json and no summary "
                     f"recording this job); use another output directory (--out) or delete it")
  if ckpt_marker.exists() and _marked_fingerprint(ckpt_marker) != fingerprint:
    return  # outputs of a version before OWNER: Checkpoints refuses them with its own message
  atomic_write_json(marker, {"fingerprint": fingerprint, "what": what})


def step_rng(seed: int, step: int) -> np.random.RandomState:
  """The batch sampler's generator at `step`: batches depend on (seed, step) alone, so a
  resumed run draws what the uninterrupted run would have."""
  return np.random.RandomState((seed * 1_000_003 + step) % 2**32)


@dataclasses.dataclass
class RunResult:
  state: Any  # the TrainState at `end`
  rows: list  # the whole log (this run's rows after the restored ones)
  end: int  # the step it stopped at (the job's total steps when complete)


class TrainRun:
  """The one training driver of `vocabjax.train.*`: a job's output directory with orbax
  checkpoints (resumed when the job's fingerprint matches, refused otherwise), its jsonl log
  (trimmed to the restored step, so a resumed run rewrites what it redoes), held-out evaluation
  every `eval_every` steps and at the end, a stop on a non-finite loss naming the step, a
  progress bar, and the curves. Each trainer supplies only its step and its evaluation:

      run = TrainRun(out, job.train_fingerprint(), steps=job.steps, eval_every=job.eval_every,
                     checkpoint_every=job.checkpoint_every, what="train.ranker")
      state = run.restore(TrainState.create(params, opt))
      result = run.fit(state, step_fn, evaluate, desc="ranker", stop_after=None)
      run.plot(["train_loss", "heldout_loss"], "title")

  `step_fn(state, step) -> (state, metrics)` (metrics a dict holding "loss"; every metric is
  averaged over the steps since the last evaluation and logged as `train_<name>`);
  `evaluate(state, step) -> dict` (the held-out figures); `on_row(state, row)` sees every
  logged row (e.g. to export the best step so far).
  """

  def __init__(self, out: Path, fingerprint: str, *, steps: int, eval_every: int,
               checkpoint_every: int, what: str, keep: int = 2, job: dict | None = None):
    self.out = Path(out)
    self.out.mkdir(parents=True, exist_ok=True)
    self.steps, self.eval_every, self.what = steps, eval_every, what
    claim_output(self.out, fingerprint, what, job)  # `job`: its fields, as summary.json has
    self.ckpt = Checkpoints(self.out / "checkpoints", fingerprint, every=checkpoint_every,
                            keep=keep)
    self.log_path = self.out / "log.jsonl"
    self.start = 0

  def restore(self, state: TrainState) -> TrainState:
    """The newest checkpoint (or `state`); the log is cut back to the restored step."""
    state = self.ckpt.restore_or(state)
    self.start = int(state.step)
    rows = read_log(self.log_path, upto_step=self.start)
    self.log_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return state

  def fit(self, state, step_fn, evaluate, *, desc: str, stop_after: int | None = None,
          on_row=None, show_progress: bool = True) -> RunResult:
    """Steps from the restored one to `steps` (or `stop_after` more); checkpoints are written
    every `checkpoint_every` steps and at the last step of this call."""
    t0 = time.perf_counter()

    def log(st, step, train):
      row = {"step": step, **({f"train_{k}": v for k, v in train.items()} if train else
                              {"train_loss": None}),
             **evaluate(st, step), "time": round(time.perf_counter() - t0, 1)}
      append_log(self.log_path, row)
      if on_row is not None:
        on_row(st, row)

    if self.start == 0 and not read_log(self.log_path):
      log(state, 0, None)
    end = self.steps if stop_after is None else min(self.steps, self.start + stop_after)
    bar = progress(range(self.start, end), total=self.steps, initial=self.start, desc=desc,
                   enabled=show_progress)
    with interrupt.deferred_interrupt("saving a checkpoint after this step, then stopping "
                                      "(Ctrl-C again to stop at once)"):
      try:
        state = self._steps(bar, state, step_fn, log, end, show_progress)
      except KeyboardInterrupt:
        bar.close()
        self.ckpt.close()  # an in-flight save completes: orbax's threads end quietly
        raise TrainInterrupted(
            f"{self.what} interrupted; the last checkpoint is step "
            f"{self.ckpt.latest_step()} in {self.ckpt.dir}: rerun the same command to "
            f"resume") from None
    self.ckpt.close()
    return RunResult(state=state, rows=read_log(self.log_path), end=end)

  def _steps(self, bar, state, step_fn, log, end, show_progress):
    sums: dict = {}
    n = 0
    for step in bar:
      if interrupt.requested():  # a deferred Ctrl-C: checkpoint what is done, then stop
        if step > self.start and self.ckpt.latest_step() != step:
          self.ckpt.save(step, state, force=True)
        raise KeyboardInterrupt
      state, metrics = step_fn(state, step)
      metrics = {k: float(v) for k, v in metrics.items()}
      check_finite_loss(metrics["loss"], step + 1, self.what, self.ckpt)
      if show_progress:
        bar.set_postfix_str(f"loss {metrics['loss']:.3f}", refresh=False)
      for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + v
      n += 1
      done = step + 1
      if done % self.eval_every == 0 or done == self.steps:
        log(state, done, {k: v / n for k, v in sums.items()})
        sums, n = {}, 0
      self.ckpt.save(done, state, force=done == end)
    return state

  def plot(self, keys: list[str], title: str) -> None:
    rows = read_log(self.log_path)
    plot_curves(rows, [k for k in keys if any(r.get(k) is not None for r in rows)],
                self.out / "curves.png", title)


def progress(it: Iterable, *, total: int | None = None, initial: int = 0, desc: str = "",
             enabled: bool = True):
  from tqdm.auto import tqdm

  return tqdm(it, total=total, initial=initial, desc=desc, disable=not enabled,
              dynamic_ncols=True)


def append_log(path: Path, row: dict) -> None:
  with open(path, "a") as f:
    f.write(json.dumps(row) + "\n")


def read_log(path: Path, upto_step: int | None = None) -> list[dict]:
  """Rows of a jsonl training log (those at or before `upto_step`: a resumed run rewrites)."""
  if not Path(path).exists():
    return []
  rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
  return [r for r in rows if upto_step is None or r["step"] <= upto_step]


def plot_curves(rows: list[dict], keys: list[str], path: Path, title: str) -> None:
  """One panel per key (rows missing a key are skipped), saved atomically as a PNG."""
  fig, axes = subplots(1, len(keys), figsize=(4.5 * len(keys), 3.2), squeeze=False)
  for ax, key in zip(axes[0], keys):
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if pts:
      ax.plot(*zip(*pts), marker="." if len(pts) < 30 else None)
    ax.set_xlabel("step")
    ax.set_title(key)
    ax.grid(alpha=0.3)
  fig.suptitle(title)
  save_png(fig, path)


# --- job configs (YAML) and their command lines --------------------------------------------------

def job_fields(raw: dict, job_cls, required, *, where: str, tuples=()) -> dict:
  """`raw` checked against the dataclass `job_cls` (unknown and missing fields are TrainErrors
  naming them), with `data` and the `tuples` fields turned into tuples (YAML gives lists)."""
  fields = {f.name for f in dataclasses.fields(job_cls)}
  unknown = sorted(set(raw) - fields)
  if unknown:
    raise TrainError(f"{where}: unknown fields {unknown}; known: {sorted(fields)}")
  missing = [k for k in required if k not in raw]
  if missing:
    raise TrainError(f"{where}: missing required field(s) {missing}")
  raw = dict(raw)
  annotations = {f.name: str(f.type) for f in dataclasses.fields(job_cls)}
  for k in ("data", *tuples):
    if raw.get(k) is not None:
      raw[k] = _as_tuple(k, raw[k], annotations[k], where)
  for k, v in raw.items():
    check_field(k, v, annotations[k], where)
  return raw


def _as_tuple(name: str, value, annotation: str, where: str) -> tuple:
  """A list field's YAML value as a tuple: a list as it is, a single path (a string where the
  field holds strings) as a one-element list; anything else (a number, a mapping, a string
  where numbers belong) a TrainError naming the field, what it holds and the value."""
  elem = "str" if "tuple[str" in annotation else "int" if "tuple[int" in annotation else None
  if isinstance(value, str) and elem == "str":
    return (value,)
  if not isinstance(value, (list, tuple)):
    raise TrainError(f"{where}: {name} must be a list{f' of {elem}s' if elem else ''} (e.g. "
                     f"{name}: [...]), got {value!r}")
  if elem and not all(_TYPES[elem](v) for v in value):
    bad = next(v for v in value if not _TYPES[elem](v))
    raise TrainError(f"{where}: {name} must be a list of {elem}s, got {bad!r} in {list(value)}")
  return tuple(value)


# The optimizer's and the losses' numbers, one rule for every trainer (EAGLE, Medusa, ranker,
# distillation): name -> (low, low included, high, high included, what it is). A value outside
# reverses or voids the objective and trains anyway, exit 0: a negative step decay makes the loss
# negative, a negative clip norm is gradient ascent (held-out loss 21.4 against 16.8), a
# negative weight decay grows the weights, a negative loss weight maximizes its term.
SETTINGS = {
    "lr": (0.0, False, math.inf, False, "a learning rate"),
    "head_lr": (0.0, False, math.inf, False, "a learning rate"),
    "weight_decay": (0.0, True, math.inf, False, "AdamW's weight decay"),
    "clip_norm": (0.0, False, math.inf, False, "the gradient's global-norm bound (0 trains "
                  "nothing, < 0 ascends the gradient)"),
    "end_lr_ratio": (0.0, True, 1.0, True, "the cosine schedule's final fraction of lr"),
    "step_decay": (0.0, False, 1.0, True, "the decay of later steps' losses"),
    "joint_lambda": (0.0, True, math.inf, False, "a loss weight"),
    "lam": (0.0, True, math.inf, False, "a loss weight"),
    "rejection_weight": (0.0, True, math.inf, False, "a loss weight"),
    "acceptance_mu": (0.0, True, math.inf, False, "a loss weight"),
    "lora_alpha": (0.0, True, math.inf, False, "LoRA's scale"),
    "warmup_steps": (0, True, math.inf, False, "a step count"),
}


def check_settings(job, where: str = "") -> None:
  """Every trainer's settings against `SETTINGS` (the fields its job has): each a finite number
  in its range, else a TrainError naming the field, the value and the range, before anything
  is written."""
  names = {f.name for f in dataclasses.fields(job)}
  prefix = f"{where}: " if where else ""
  for name, (lo, lo_in, hi, hi_in, what) in SETTINGS.items():
    if name not in names:
      continue
    v = getattr(job, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      raise TrainError(f"{prefix}{name}={v!r} must be a finite number ({what})")
    if (v < lo or (v == lo and not lo_in)) or (v > hi or (v == hi and not hi_in)):
      lo_s = f"{'[' if lo_in else '('}{lo:g}"
      hi_s = "inf)" if hi == math.inf else f"{hi:g}{']' if hi_in else ')'}"
      raise TrainError(f"{prefix}{name}={v!r} is outside {lo_s}, {hi_s} ({what})")


# counts and sizes: 0 makes an empty batch or no training at all (a run that "trains" NaN)
POSITIVE_FIELDS = frozenset({
    "steps", "batch_tokens", "joint_batch", "seq_len", "rank", "teacher_top", "eval_every",
    "checkpoint_every", "vocab_block", "max_records", "batch_size", "ttt_steps", "head_width",
    "max_tokens", "online_every", "gamma", "max_new_tokens", "draft_vocab_size",
    "intermediate_size"})  # not online_steps: 0 is the online control (no updates)
_TYPES = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
          "None": lambda v: v is None}


def check_field(name: str, value, annotation: str, where: str) -> None:
  """A job field's YAML value against its dataclass annotation ("int", "float | None",
  "tuple[int, ...]", ...) and, for counts and sizes, >= 1: a TrainError naming both."""
  options = [a.strip() for a in annotation.split("|")]
  ok = any(_TYPES[o](value) if o in _TYPES else
           (o.startswith("tuple") and isinstance(value, (list, tuple))) for o in options)
  known = all(o in _TYPES or o.startswith("tuple") for o in options)
  if known and not ok:
    raise TrainError(f"{where}: {name} must be {annotation}, got {value!r}")
  if name in POSITIVE_FIELDS and _TYPES["int"](value) and value < 1:
    raise TrainError(f"{where}: {name}={value} must be >= 1 (it sizes a batch or a count; 0 "
                     f"trains nothing)")
  if isinstance(value, float) and not math.isfinite(value):
    raise TrainError(f"{where}: {name}={value} must be finite")


def check_finite_loss(loss: float, step: int, what: str, ckpt: "Checkpoints") -> None:
  """Stop a run whose training loss is not finite, naming the step: nothing of this step is
  saved, pending checkpoint writes are finished, and the error names the last good one."""
  if not math.isfinite(loss):
    ckpt.close()  # an asynchronous save in flight would else be lost with the process
    last = ckpt.latest_step()
    raise TrainError(f"{what}: the training loss is {loss} at step {step}; stopping without "
                     f"saving it (the newest checkpoint, step {last}, is kept and a rerun "
                     f"resumes from it): lower lr, or check the data and sizes")


def read_job_yaml(path, what: str, overrides: dict) -> dict:
  """A YAML job file's fields with the non-None `overrides` applied."""
  import yaml

  path = Path(path)
  if not path.is_file():
    raise TrainError(f"no {what} config at {path}")
  raw = yaml.safe_load(path.read_text()) or {}
  raw.update({k: v for k, v in overrides.items() if v is not None})
  return raw


RUN_ONLY_FIELDS = ("out", "features", "eval_every", "checkpoint_every", "select_by")


def train_fingerprint(job, *, replace: dict | None = None, new_defaults: dict | None = None
                      ) -> str:
  """A training job's identity for resuming: its fields minus where it writes and how often it
  reports (`RUN_ONLY_FIELDS`), with `replace`'s values put in (e.g. the data's fingerprint);
  fields added later are left out while they hold their `new_defaults` value, so jobs written
  before them keep their fingerprints."""
  import hashlib

  d = dataclasses.asdict(job)
  for k in RUN_ONLY_FIELDS:
    d.pop(k, None)
  d.update(replace or {})
  for k, default in (new_defaults or {}).items():
    if d.get(k) == default:
      d.pop(k)
  return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def run_job_cli(argv, *, prog: str, doc: str, configs: str, what: str, job_from_dict, train,
                report=("final", "complete", "exported"), extra=None,
                errors=(TrainError, ValueError, FileNotFoundError)) -> int:
  """The `main` of a `python -m vocabjax.train.*` job: parse the common arguments (plus
  `extra(parser)`'s), read the YAML job (`what` names it in errors), train (resumable), print
  the summary's `report` keys as JSON; 2 with the error on stderr for a bad job or data.
  `extra` may return a function (args, job) -> exit code or None that runs before training
  (e.g. `--features-only`). `errors`: the exceptions reported as one `error:` line."""
  import sys

  p = job_argparser(prog, doc, configs)
  before = extra(p) if extra else None
  a = p.parse_args(argv)
  allow_bin_from_args(a)  # the target's (and a drafter's) pickled weights, as generate and eval
  try:
    with showing_progress(False if a.quiet else None):  # the models' downloads and checksums
      job = job_from_dict(read_job_yaml(a.config, what, {"out": a.out, "steps": a.steps}),
                          where=str(a.config))
      code = before(a, job) if before else None
      if code is not None:
        return code
      summary = train(job, show_progress=not a.quiet, stop_after=a.stop_after)
  except errors as e:
    full = disk_full(e)
    print(f"error: {disk_full_message(full, a.out) if full else e}", file=sys.stderr)
    return 2
  except Exception as e:
    full = disk_full(e)  # orbax's writer threads wrap ENOSPC in their own errors
    if full is None:
      raise
    print(f"error: {disk_full_message(full, a.out)}", file=sys.stderr)
    return 2
  except KeyboardInterrupt as e:  # one line, not orbax's threads' tracebacks
    print(f"\n[{prog}] {e or 'interrupted'}", file=sys.stderr)
    return 130
  print(json.dumps({k: summary.get(k) for k in report}, indent=1))
  return 0


def job_argparser(prog: str, doc: str, configs: str):
  """The arguments every `python -m vocabjax.train.*` command takes."""
  import argparse

  p = argparse.ArgumentParser(prog=prog, description=doc,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help=f"YAML job ({configs})")
  p.add_argument("--out", help="override the output directory")
  p.add_argument("--steps", type=int, help="override the number of steps")
  p.add_argument("--stop-after", type=int, help="return after N steps (resume later)")
  p.add_argument("--quiet", action="store_true")
  add_allow_bin_argument(p)
  return p
