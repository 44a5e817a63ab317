"""`python -m vocabjax.train.eagle --config configs/train/eagle_*.yaml`: train an EAGLE-3 head.

Letters: B batch, T window tokens, E = T - 1 head entries per window, Lf*Dt fused target
feature width, D head width, V target vocabulary, Vd the head's vocabulary, J training-time-test steps.

Data: `calibrate count --generate` completions; the target's fused features (float16) and
teacher-forced argmax per position, computed once into shards (`vocabjax.train.features`;
resumable, refused when made by another target or data), in one directory or one per data file
(`features` a list as long as `data`). Training-time test (EAGLE-3 section 3.2): step j feeds
entry i the token x_{i+1+j} and the head's own step j-1 output, as tree depth j decodes; loss
sum_j 0.8^j CE_j over completion positions (labels outside the head's vocabulary skipped,
counted). `prompt_labels: true` trains on prompt positions too; `soft_labels: true` on the
target's whole distribution over the head's vocabulary (kept up to TEACHER_PROBS_BYTES, else
recomputed per depth). Held-out: the last `heldout` fraction of prompts (data files' order).
Vocabulary: the full V (`draft_vocab_size: null`), the `draft_vocab_size` most frequent label
tokens plus any `vocab_counts` files (ties to the lower id), or a `vocab_subset` file; its LM
head starts as the target's rows and trains unless `train_lm_head: false`. `init_head`
fine-tunes an exported head (the job names its layers, MLP width and vocabulary size; a fresh
optimizer). The embedding is the target's, frozen. `compute_dtype: bfloat16`: bf16 products,
f32 accumulation (`Lowering.bf16_dots`). AdamW, warmup + cosine, clipping; orbax checkpoints
every `checkpoint_every` steps (rerun to resume: the same run); `log.jsonl`, `curves.png`;
`head/` (EAGLE-3, for SGLang and vLLM) at the best held-out step (`select_by`), `summary.json`.
Figures and the why of each option: docs/eagle.md, 'Training'.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
from pathlib import Path
import sys

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.eagle3 import head_target_ids, load_eagle3, save_eagle3
from vocabjax.checkpoints.loader import load_model
from vocabjax.io import atomic_write_json
from vocabjax.lowering import Lowering
from vocabjax.models.eagle import init_eagle, training_feature_layers
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.train.eagle_data import (build_eagle_features, load_eagle_features, make_batch,
                                       make_packed_batch, record_sources)
from vocabjax.train.eagle_job import EagleJob
from vocabjax.train.eagle_step import (choose_vocab, evaluate_heldout, head_config, starting_head,
                                       target_to_head, train_step)
from vocabjax.train.features import heldout_records, model_identity
from vocabjax.train.loop import (TrainError, TrainRun, TrainState, job_fields, make_optimizer,
                                 run_job_cli, step_rng)


# --- training ----------------------------------------------------------------------------------

def train(job: EagleJob, *, show_progress: bool = True, stop_after: int | None = None) -> dict:
  """Build features if needed, train (resuming from checkpoints), export; returns the summary."""
  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  target = load_model(job.target, dtype="float32", progress=show_progress)
  tc = target.config
  layers = tuple(job.feature_layers or training_feature_layers(tc.num_layers))
  if min(layers) < 0 or max(layers) >= tc.num_layers:
    raise TrainError(f"feature_layers={list(layers)} must be target layers in [0, "
                     f"{tc.num_layers})")
  if job.draft_vocab_size is not None and not 1 <= job.draft_vocab_size <= tc.vocab_size:
    # checked again where the vocabulary is chosen; here before minutes of feature building
    raise TrainError(f"draft_vocab_size={job.draft_vocab_size} must be in [1, "
                     f"V={tc.vocab_size}]")
  start_head = starting_head(job, target, layers)  # before minutes of feature building
  fdir = build_eagle_features(job, target, layers, show_progress=show_progress)
  # from here on only the target's embedding and LM head are read: its f32 transformer layers
  # (6 GB for a 1.5B target) go before the features (GBs more) are read
  target = dataclasses.replace(target, params={k: v for k, v in target.params.items()
                                               if k != "layers"}, _layouts={})
  gc.collect()
  data = load_eagle_features(fdir, target, layers, hidden=job.soft_labels)
  held_recs = set(heldout_records(data, job.heldout, job.heldout_split, job.seed).tolist())
  sources = record_sources(job.data, job.max_records)
  train_idx = [i for i, (r, _, _) in enumerate(data.seqs) if r not in held_recs]
  held_idx = [i for i, (r, _, _) in enumerate(data.seqs) if r in held_recs]
  if not train_idx or not held_idx:
    raise TrainError(f"empty train ({len(train_idx)}) or held-out ({len(held_idx)}) records")
  V = tc.vocab_size
  ids = (head_target_ids(np.asarray(start_head["d2t"])) if start_head is not None
         else choose_vocab(job, data, {data.seqs[i][0] for i in train_idx}, V))
  # a data-size ablation trains on a fraction of the training records: the first ones (the data
  # files' order) or a seeded random sample (the same permutation: smaller fractions are subsets
  # of larger ones); the held-out split and the head's vocabulary are those of the whole data
  n_train = max(1, int(round(len(train_idx) * job.train_fraction)))
  if job.train_subset == "random":
    pick = np.random.default_rng(job.seed).permutation(len(train_idx))[:n_train]
    train_idx = [train_idx[i] for i in sorted(pick.tolist())]
  else:
    train_idx = train_idx[:n_train]
  Vd = len(ids)
  t2d = target_to_head(ids, V)
  hc = head_config(tc, layers, Vd, job.intermediate_size)

  if start_head is not None:
    init = dict(start_head)
  else:
    init = init_eagle(jax.random.key(job.seed), hc)
    init["lm_head"] = jnp.take(lm_head_weight(target.params, tc), jnp.asarray(ids), axis=0)
  d2t = jnp.asarray(ids - np.arange(Vd), jnp.int32)
  # soft labels: the target's own LM-head rows of the head's vocabulary (frozen, and apart
  # from the head's LM head, which trains); an argument of the step, not a constant
  teacher = (jnp.take(lm_head_weight(target.params, tc), jnp.asarray(ids), axis=0)
             if job.soft_labels else None)
  frozen_names = ("d2t",) + (() if job.train_lm_head else ("lm_head",))
  trainable = {k: v for k, v in init.items() if k not in frozen_names}
  aux = {k: init[k] if k != "d2t" else d2t for k in frozen_names}
  embed = target.params["embed"]

  hyper = job.optim.array()  # the step's argument: jobs differing only there share a program
  fingerprint = job.train_fingerprint()  # reads init_head's files: once per run
  run = TrainRun(out, fingerprint, steps=job.steps, eval_every=job.eval_every,
                 checkpoint_every=job.checkpoint_every, what="train.eagle",
                 job=dataclasses.asdict(job))
  state = run.restore(TrainState.create(trainable, make_optimizer(job.optim), aux))
  if not np.array_equal(np.asarray(state.aux["d2t"]), np.asarray(d2t)):
    raise TrainError(f"the checkpoint in {out / 'checkpoints'} has another head vocabulary")
  start = run.start

  def frozen_of(st):
    return {"embed": embed, **st.aux}

  lowering = Lowering(bf16_dots=job.compute_dtype == "bfloat16")  # mixed precision or f32

  train_fn = functools.partial(train_step, config=hc, steps=job.ttt_steps,
                               decay=job.step_decay, block=job.vocab_block, lowering=lowering)

  identity = model_identity(target)
  head_dir = out / "head"
  best_row = None
  if job.select_by and (head_dir / "config.json").exists():
    rec = json.loads((head_dir / "config.json").read_text()).get("vocabjax", {})
    if rec.get("job") == fingerprint and rec.get("row", {}).get("step", 1e18) <= start:
      best_row = rec["row"]
  fn_cache: dict = {}

  def export(st, row):
    params = {**st.params, **st.aux}
    save_eagle3(params, hc, head_dir, target=identity,
                extra={"job": fingerprint, "row": row})

  def better(row):
    if best_row is None:
      return True
    if job.select_by == "acc_0":
      return row["acc_0"] > best_row["acc_0"]
    return row["heldout_loss"] < best_row["heldout_loss"]

  def evaluate(st, step):
    return evaluate_heldout(st.params, frozen_of(st), data, held_idx, job, t2d, hc, fn_cache)

  def keep_best(st, row):
    nonlocal best_row
    if job.select_by and better(row):
      export(st, row)
      best_row = row

  def step_fn(st, step):
    rs = step_rng(job.seed, step)
    if job.pack:
      batch = make_packed_batch(data, train_idx, rs, job, t2d)
    else:
      idx = [train_idx[i] for i in rs.randint(0, len(train_idx), job.batch_size)]
      batch = make_batch(data, idx, rs, job, t2d, prompt=job.prompt_labels,
                         hidden=job.soft_labels)
    st, loss = train_fn(st, {k: jnp.asarray(v) for k, v in batch.items()}, embed, teacher,
                        hyper)
    return st, {"loss": loss}

  res = run.fit(state, step_fn, evaluate, on_row=keep_best, stop_after=stop_after,
                desc=f"EAGLE head ({job.ttt_steps} TTT steps)", show_progress=show_progress)
  state, rows, end = res.state, res.rows, res.end
  run.plot(["train_loss", "heldout_loss", "acc_0", f"acc_{job.ttt_steps - 1}"],
           f"EAGLE head for {identity['source']}")
  summary = {"job": dataclasses.asdict(job), "steps_done": end, "complete": end == job.steps,
             "train_records": len(train_idx), "heldout_records": len(held_idx),
             "head_vocab": Vd, "feature_layers": list(layers),
             "train_label_positions": int(sum(
                 len(data.labels[i]) - (0 if job.prompt_labels else data.seqs[i][2])
                 for i in train_idx)),
             "features_seconds": data.meta.get("seconds"),
             "start": rows[0] if rows else None, "final": rows[-1] if rows else None}
  if end == job.steps:
    # held-out figures per data source (the `source` field of `train.corpus` records, else the
    # file's directory name): what the difference between the target's own completions, the
    # drafter's and the datasets' answers costs, measured on the same split
    groups: dict = {}
    for i in held_idx:
      groups.setdefault(sources[data.seqs[i][0]], []).append(i)
    # a rerun of a finished job (the same last row and split) keeps the per-source evaluation
    # its summary holds: minutes with a full-vocabulary head
    summary["heldout_by_source"] = _finished_by_source(
        out / "summary.json", end, summary["final"], groups) or {
            g: {"records": len(idx), **evaluate_heldout(state.params, frozen_of(state), data,
                                                        idx, job, t2d, hc, fn_cache)}
            for g, idx in sorted(groups.items())}
    if not job.select_by:
      export(state, rows[-1])
    load_eagle3(head_dir, target_config=tc)  # what was exported loads for this target
    summary["exported"] = json.loads((head_dir / "config.json").read_text())["vocabjax"]["row"]
  atomic_write_json(out / "summary.json", summary)
  return summary


def _finished_by_source(path: Path, steps_done: int, final: dict | None,
                        groups: dict) -> dict | None:
  """The per-source held-out evaluation a previous run of the same finished job wrote in its
  summary (same steps, same last row, the same records per source in `groups`), else None:
  unreadable, older, from other parameters or another split."""
  try:
    prev = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  by_source = prev.get("heldout_by_source") if isinstance(prev, dict) else None
  if (not isinstance(by_source, dict) or not prev.get("complete")
      or prev.get("steps_done") != steps_done or prev.get("final") != final
      or {g: r.get("records") for g, r in by_source.items()}
      != {g: len(idx) for g, idx in groups.items()}):
    return None
  return by_source


# --- command line ------------------------------------------------------------------------------

def job_from_dict(raw: dict, *, where: str = "config") -> EagleJob:
  return EagleJob(**job_fields(raw, EagleJob, ("target", "data", "out"), where=where,
                               tuples=("vocab_counts", "feature_layers")))


def main(argv=None) -> int:
  return run_job_cli(argv, prog="python -m vocabjax.train.eagle", doc=__doc__,
                     configs="configs/train/eagle_*.yaml", what="EAGLE", job_from_dict=job_from_dict,
                     train=train)


if __name__ == "__main__":
  sys.exit(main())
