"""The trainable drafter (`Distiller`), offline training (`train`) and the export of the
distilled drafter."""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vocabjax.checkpoints.distilled import save_distilled
from vocabjax.decoding.adaptive import init_acceptance_head
from vocabjax.io import atomic_write_json
from vocabjax.models.identity import drafter_identity
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.models.lora import init_lora, merge
from vocabjax.train.distill.data import (Example, batch_sizes, build_target_side, load_examples,
                                         make_batch)
from vocabjax.train.distill.job import DistillJob, load_model_for
from vocabjax.train.distill.losses import acceptance_terms, distill_terms, masked_mean
from vocabjax.train.features import read_records
from vocabjax.train.loop import (OptimConfig, TrainError, TrainRun, TrainState,
                                 make_optimizer, optimizer_of)
from vocabjax.vocab.translate import Translator


class Distiller:
  """The trainable drafter (full or LoRA) [+ acceptance head], its optimizer and jitted steps;
  shared by the offline `train` and the `online` loop."""

  def __init__(self, job: DistillJob, target, draft, translator):
    self.job, self.dcfg = job, draft.config
    int_d, int_t = translator.intersection()
    self.intersection = int(len(int_d))
    wt = lm_head_weight(target.params, target.config)
    # big arrays (the frozen base, the target's head rows) are arguments, never jit constants
    self.frozen = {"wt_I": wt[int_t], "wt_full": wt, "int_d": jnp.asarray(int_d, jnp.int32),
                   "int_t": jnp.asarray(int_t, jnp.int32)}
    self.base = draft.params
    self.base_identity = drafter_identity(self.base, self.dcfg)  # before buffers are donated
    key = jax.random.key(job.seed)
    # full fine-tuning trains a copy: the step donates its buffers, the caller keeps its model
    trainable = {"drafter": init_lora(key, self.base, rank=job.lora_rank) if job.lora_rank
                 else jax.tree.map(jnp.copy, self.base)}
    self.use_head = job.acceptance != "none"
    if self.use_head:
      trainable["head"] = init_acceptance_head(jax.random.fold_in(key, 1), self.dcfg.hidden_size,
                                               job.head_width)
    optim_d = OptimConfig(lr=job.lr, warmup_steps=job.warmup_steps, total_steps=job.steps,
                          weight_decay=job.weight_decay, clip_norm=job.clip_norm)
    optim_h = OptimConfig(lr=job.head_lr, warmup_steps=0, total_steps=job.steps,
                          weight_decay=0.0, clip_norm=job.clip_norm)
    # the steps' argument (traced): jobs differing only in these numbers share a program
    self.hyper = {"drafter": optim_d.array(), "head": optim_h.array()}
    self.opt = self._optimizer(make_optimizer(optim_d), make_optimizer(optim_h))
    self.state = TrainState.create(trainable, self.opt)
    self.base_arg = self.base if job.lora_rank else None
    parts = ("drafter", "head") if job.acceptance == "interleaved" else ("both",)
    self._steps = {p: jax.jit(functools.partial(self._step, part=p), donate_argnums=(0,))
                   for p in parts}
    self._eval = jax.jit(self._eval_fn)
    self._merge = merge

  @staticmethod
  def _optimizer(opt_d, opt_h):
    return optax.multi_transform(
        {"drafter": opt_d, "head": opt_h},
        lambda params: {k: jax.tree.map(lambda _, k=k: k, v) for k, v in params.items()})

  def effective(self, trainable, base):
    j = self.job
    return self._merge(base, trainable["drafter"], alpha=j.lora_alpha) if j.lora_rank \
        else trainable["drafter"]

  def loss_fn(self, trainable, batch, frozen, base, part):
    """part: "both" (joint, or no head), "drafter" / "head" (interleaved steps)."""
    job = self.job
    dp = self.effective(trainable, base)
    if part == "head":
      dp = jax.lax.stop_gradient(dp)
    l_dm, l_ng, hd, log_q, _ = distill_terms(dp, batch, frozen, config=self.dcfg)
    loss = l_dm + job.lam * l_ng
    # share of direct positions where the drafter's greedy proposal over the intersection is
    # the target's argmax: what greedy verification accepts there
    hit = frozen["int_t"][jnp.argmax(log_q, -1)] == batch["argmax"][batch["dm_row"]]
    aux = {"l_dm": l_dm, "l_ngram": l_ng,
           "agree": masked_mean(hit.astype(jnp.float32), batch["dm_mask"])}
    if self.use_head:
      l_acc, acc, ybar = acceptance_terms(
          trainable["head"], dp, hd if part == "both" else jax.lax.stop_gradient(hd),
          jax.lax.stop_gradient(log_q), batch, frozen, label=job.acceptance_label,
          weight=job.rejection_weight, config=self.dcfg)
      aux.update(l_acc=l_acc, acc_head=acc, label_mean=ybar)
      if part == "head":
        loss = l_acc
      elif part == "both":
        loss = loss + job.acceptance_mu * l_acc
    return loss, aux

  def _step(self, st, batch, frozen, base, hyper, *, part):
    (loss, aux), grads = jax.value_and_grad(self.loss_fn, has_aux=True)(
        st.params, batch, frozen, base, part)
    opt = self._optimizer(optimizer_of(hyper["drafter"]), optimizer_of(hyper["head"]))
    updates, opt_state = opt.update(grads, st.opt_state, st.params)
    if part != "both":  # interleaved: only one part moves this step
      keep = "head" if part == "head" else "drafter"
      updates = {k: (u if k == keep else jax.tree.map(jnp.zeros_like, u))
                 for k, u in updates.items()}
    new = TrainState(step=st.step + 1, params=optax.apply_updates(st.params, updates),
                     opt_state=opt_state, aux=st.aux)
    return new, {"loss": loss, **aux}

  def _eval_fn(self, trainable, batch, frozen, base):
    return self.loss_fn(trainable, batch, frozen, base, "both")[1]

  sizes: tuple = (0, 0, 0, 0)  # padded batch sizes seen so far (`batch_sizes`)

  def fit_sizes(self, examples) -> None:
    """Grow the padded sizes to cover `examples` (call with all data up front: one compile)."""
    self.sizes = batch_sizes(examples, self.sizes)

  def step(self, ex: Example) -> dict:
    """One optimizer step on one record (interleaved: even steps the drafter, odd the head)."""
    self.fit_sizes([ex])
    n = int(self.state.step)
    part = (("drafter" if n % 2 == 0 else "head") if self.job.acceptance == "interleaved"
            else "both")
    self.state, m = self._steps[part](self.state, make_batch(ex, self.sizes), self.frozen,
                                      self.base_arg, self.hyper)
    return {k: float(v) for k, v in m.items()}

  def evaluate(self, examples) -> dict:
    agg: dict = {}
    self.fit_sizes(examples)
    for ex in examples:
      for k, v in self._eval(self.state.params, make_batch(ex, self.sizes), self.frozen,
                             self.base_arg).items():
        agg.setdefault(k, []).append(float(v))
    return {k: float(np.mean(v)) for k, v in agg.items()}

  def drafter_params(self) -> dict:
    """The drafter's effective params now (LoRA merged)."""
    return self.effective(self.state.params, self.base)

  def head(self) -> dict | None:
    return self.state.params.get("head")


def train(job: DistillJob, *, show_progress: bool = True, stop_after: int | None = None,
          models=None) -> dict:
  """Build the target side (once), then distill; returns the summary (also summary.json)."""
  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  records = read_records(job.data, job.max_records)
  target, draft = models or (load_model_for(job.target, "target", show_progress),
                             load_model_for(job.drafter, "drafter", show_progress))
  for m, what in ((target, "target"), (draft, "drafter")):
    if m.tokenizer is None:
      raise TrainError(f"the {what} {m.source} has no tokenizer")
  read_records(job.data, job.max_records, vocab_size=target.config.vocab_size)  # ids checked
  tr = Translator(target.tokenizer, draft.tokenizer, target_vocab=target.config.vocab_size,
                  draft_vocab=draft.config.vocab_size)
  t0 = time.perf_counter()
  build_target_side(job, target, records, show_progress=show_progress)
  target_side_s = time.perf_counter() - t0
  examples = load_examples(job, tr, len(records))
  n_held = int(round(len(examples) * job.heldout))
  train_ex, held_ex = examples[:len(examples) - n_held], examples[len(examples) - n_held:]
  if not train_ex:
    raise TrainError(f"heldout={job.heldout} leaves no training records of {len(examples)}")
  dist = Distiller(job, target, draft, tr)
  dist.fit_sizes(examples)
  del target  # only its LM head (in the distiller) is needed from here on

  run = TrainRun(out, job.train_fingerprint(), steps=job.steps, eval_every=job.eval_every,
                 checkpoint_every=job.checkpoint_every, what="train.distill",
                 job=dataclasses.asdict(job))
  dist.state = run.restore(dist.state)
  held = held_ex or train_ex[-4:]
  rng = np.random.default_rng(job.seed)  # the order depends on the seed alone: resumable
  order = np.concatenate([rng.permutation(len(train_ex)) for _ in
                          range(job.steps // max(len(train_ex), 1) + 1)])

  def step_fn(st, step):
    dist.state = st
    m = dist.step(train_ex[order[step]])
    return dist.state, m

  def evaluate(st, step):
    dist.state = st
    return {f"held_{k}": v for k, v in dist.evaluate(held).items()}

  t1 = time.perf_counter()
  res = run.fit(dist.state, step_fn, evaluate, desc="distill", stop_after=stop_after,
                show_progress=show_progress)
  dist.state, rows = res.state, res.rows
  train_s = time.perf_counter() - t1
  run.plot(["held_l_dm", "held_l_ngram", "held_agree", "held_acc_head"],
           f"distill {Path(job.drafter).name} -> {Path(job.target).name}")
  done = int(dist.state.step) >= job.steps
  if done:
    export(out / "drafter", dist.state.params, job, dist.base_identity)
  summary = {"job": dataclasses.asdict(job), "records": len(records),
             "train_records": len(train_ex), "heldout_records": len(held_ex),
             "intersection": dist.intersection, "target_side_s": round(target_side_s, 1),
             "train_s_this_run": round(train_s, 1), "step": int(dist.state.step),
             "complete": done, "first": rows[0] if rows else None,
             "last": rows[-1] if rows else None,
             "trainable_params": int(sum(x.size for x in jax.tree.leaves(dist.state.params)))}
  atomic_write_json(out / "summary.json", summary)
  return summary


def export(directory: Path, trainable, job: DistillJob, base_identity: dict) -> None:
  """`vocabjax.checkpoints.distilled.save_distilled` with this job's settings as metadata."""
  save_distilled(directory, trainable["drafter"], trainable.get("head"), {
      "mode": "lora" if job.lora_rank else "full", "lora_rank": job.lora_rank,
      "lora_alpha": job.lora_alpha, "base": base_identity,
      "drafter": job.drafter, "target": job.target, "lam": job.lam,
      "acceptance": job.acceptance, "acceptance_label": job.acceptance_label,
      "steps": job.steps})
