"""`python -m vocabjax.train.eagle --config configs/train/eagle_*.yaml`: train an EAGLE-3 head.

Letters: B batch, T window tokens, E = T - 1 head entries per window, Lf*Dt fused target
feature width, D head width, V target vocabulary, Vd the head's vocabulary, J training-time-test steps.

Data: completions generated for the target (`python -m vocabjax.calibrate count --generate`
jsonl: `prompt` text + `completion_ids`). The target runs once over each prompt + completion
and stores, per position p, its fused layer features f_p (EAGLE-3's low/middle/high layers,
float16) and its teacher-forced argmax y_p (the token it would emit after x_0..x_p), in shards
(`vocabjax.train.features`; resumable, and refused when made by another target or data):
one directory for all data files, or one per file (`features` a list as long as `data`): a
file's features are then built once and read by every job over that file.

Training-time test (EAGLE-3 section 3.2). Entry i of a window pairs the token x_{i+1} with the
target's feature f_i. Step 0 runs the head over all entries with causal attention and predicts
y_{i+1}. Step j >= 1 feeds entry i the token x_{i+1+j} and, instead of a target feature, the
head's own step j-1 output at i, and predicts y_{i+1+j}: exactly what the head sees at tree
depth j during decoding. Attention follows decoding too: the step-j query at i sees the step-0
entries 0..i (the committed prefix, which has target features), its own earlier steps at i (its
ancestors in the tree) and itself; RoPE position i + j (the position of its entry). The loss is
sum_j 0.8^j CE_j, each CE_j the mean cross-entropy over the positions whose label is a
completion token (target ids mapped into the head's vocabulary; labels outside it are
skipped, and counted); with `prompt_labels: true` the prompt's positions train too (the
target's argmax after a prompt prefix is as valid a label as after a completion prefix, and
the features are computed there anyway: 3.2x the label positions of target_chat at no extra
feature cost), while the held-out figures stay on completion positions, what decoding drafts.
With `soft_labels: true` the label of every position is the target's whole distribution
softmax(h W^T) over the head's vocabulary (h its stored final hidden state, W its LM-head rows
of those ids), EAGLE-3's distillation target, instead of its argmax: more of what the target
knows per position, for one more product per batch (the target's distribution at every slot
is computed once, in vocabulary blocks, and each depth's slice read from it: 3 products of the
depth's outputs with the head, forward and backward, as for hard labels; past
TEACHER_PROBS_BYTES each depth recomputes it, 9 products). Held-out records (by prompt,
the last `heldout` fraction) give the
per-step top-1 accuracy acc_j, EAGLE's figure of merit (the split follows the data files'
order: put varied prompts last, or the held-out figures describe one kind of text only).

The head's vocabulary: the target's full V (`draft_vocab_size: null`), the `draft_vocab_size`
most frequent tokens (FR-Spec / EAGLE-3's d2t) by the training labels' frequencies plus those
of any `vocab_counts` calibration files (`python -m vocabjax.calibrate count`; each source
weighs as one distribution, ties go to the lower id), or a VocabSubset file (`vocab_subset`).
Its LM head starts as the target's LM-head rows of those ids, and trains unless
`train_lm_head: false` (then it is the target's head, frozen). `init_head` fine-tunes an
exported head instead (e.g. one trained on a general mix, on text of the domain it will draft):
training starts from its weights, vocabulary (d2t) and LM head; the job must name its feature
layers, MLP width and vocabulary size, and the optimizer and schedule start afresh. The
embedding is always the target's, frozen. d2t (and a frozen LM head) are saved in the orbax
checkpoints beside the trained params.

Precision: f32, or with `compute_dtype: bfloat16` mixed precision: every product of the
training step (the layer's projections, fc, the LM head, and their gradients) rounds its
operands to bf16 and accumulates in f32 (`Lowering.bf16_dots`), while the params, the
optimizer state, norms, softmaxes and the held-out evaluation stay f32. On a CPU with AMX,
XLA's bf16 GEMM runs at ~3x its f32 rate.

Optimizer: AdamW, warmup + cosine, global-norm clipping (`vocabjax.train.loop`); checkpoints
every `checkpoint_every` steps (rerun the command to resume; batches depend only on the step,
so a resumed run is the same run); `log.jsonl`, `curves.png`. Output: `head/`, an EAGLE-3
checkpoint SGLang or vLLM can load (`vocabjax.checkpoints.eagle3`), written at the evaluated
step with the lowest held-out loss (`select_by`), and `summary.json`.
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
                 checkpoint_every=job.checkpoint_every, what="train.eagle")
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
