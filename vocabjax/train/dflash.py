"""`python -m vocabjax.train.dflash --config configs/train/dflash_*.yaml`: train a DFlash drafter.

DFlash (arXiv 2602.06036) trains a small block-diffusion drafter on the target's own answers,
conditioned on the target's features at `target_layer_ids`; the target's embedding and LM head
are the drafter's, frozen. Data: `calibrate count --generate` completions; the target's fused
features per position, built once into shards and shared with EAGLE-3 jobs over the same
target, data and layers (`train.eagle_data`: resumable, refused when made by another target).
Each step draws `batch_size` records (a window of their last `seq_len` tokens) and `anchors`
blocks in each completion (`train.dflash_step`: masks, labels, the decayed loss). The drafter:
`num_layers` Qwen3 layers of the target's width and heads (`intermediate_size`: the MLP's
width, default the target's), random initial weights, `mask_token_id` the token its block's
undrafted positions embed (default: the tokenizer's pad token); `draft_vocab_size` gives it a head of its own over the training
answers' most frequent tokens (exported in `speculators`' layout). Held out: a `heldout` fraction
of prompts; evaluated every `eval_every` steps (per-position accuracy, the accepted length
`tau` a greedy chain would get against the text). AdamW, warmup + cosine, clipping; orbax
checkpoints every `checkpoint_every` steps (rerun the command to resume); `log.jsonl`,
`curves.png`; `drafter/` in z-lab's layout (what `dflash` 0.1.0 and `--method dflash --head`
load) at the best held-out step (`select_by`); `summary.json`.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.dflash import load_dflash, save_dflash
from vocabjax.checkpoints.loader import load_model
from vocabjax.io import atomic_write_json
from vocabjax.lowering import Lowering
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.dflash import DFlashConfig, default_target_layers, init_dflash
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.train.dflash_step import (evaluate_heldout, make_batch, row_map, train_step,
                                        valid_anchors)
from vocabjax.train.eagle_data import build_eagle_features, load_eagle_features
from vocabjax.train.eagle_job import EagleJob
from vocabjax.train.features import heldout_records, model_identity
from vocabjax.train.loop import (OptimConfig, TrainError, TrainRun, TrainState, check_settings,
                                 job_fields, make_optimizer, run_job_cli, step_rng,
                                 train_fingerprint)


@dataclasses.dataclass(frozen=True)
class DFlashJob:
  target: str  # registry name or path of the target
  data: tuple[str, ...]  # completion jsonl files
  out: str  # output directory
  features: str | tuple[str, ...] | None = None  # as EagleJob's (shared with EAGLE jobs)
  feature_backend: str = "jax"
  feature_dtype: str = "float32"
  final_hidden: bool = False  # also store the final hidden states (for an EAGLE job's soft labels)
  num_layers: int = 1  # the drafter's layers
  intermediate_size: int | None = None  # its MLP width (default: the target's)
  target_layer_ids: tuple[int, ...] | None = None  # default: z-lab's (`default_target_layers`)
  block_size: int = 16
  mask_token_id: int | None = None  # default: the tokenizer's pad token
  causal: bool = False  # causal attention within the block (DFlash: bidirectional)
  seq_len: int = 512  # window T: the last seq_len tokens of a record
  batch_size: int = 2  # windows per step
  anchors: int = 8  # blocks per window
  loss_decay_gamma: float | None = 7.0  # position k's weight exp(-(k - 1) / gamma); None: flat
  # the training softmax over the head's rows of the N most frequent completion tokens of the
  # training records (labels outside weigh nothing; None: the whole head). The drafter still
  # drafts through the whole head: held-out figures are read through it
  loss_vocab: int | None = None
  # a head of its own over the N most frequent completion tokens of the training records
  # (`speculators`' draft_vocab_size, d2t / t2d), started from the target's rows of those ids
  # and trained with the layers; exported in speculators' layout. None: the target's head
  draft_vocab_size: int | None = None
  steps: int = 400
  lr: float = 6e-4
  warmup_steps: int = 20
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  heldout: float = 0.15
  heldout_split: str = "random"
  eval_every: int = 50
  eval_stride: int = 4  # held out: every eval_stride-th anchor of each record
  checkpoint_every: int = 50
  select_by: str | None = "tau"  # "tau", "heldout_loss" or None (export the last step)
  seed: int = 0
  vocab_block: int = 16384
  max_records: int | None = None
  compute_dtype: str = "float32"  # "bfloat16": mixed-precision products
  # the drafter's final norm at step 0: "ones" (RMSNorm's usual start) or "target", the
  # target's final norm weights, as the frozen head reads the target's normed hidden states
  # (the registry target's average 4.6: logits that much hotter at the start)
  norm_init: str = "ones"

  def __post_init__(self):
    check_settings(self)
    if not self.data:
      raise TrainError("no data files given")
    if isinstance(self.features, list):
      object.__setattr__(self, "features", tuple(self.features))
    for name in ("num_layers", "anchors", "eval_stride"):
      if getattr(self, name) < 1:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 1")
    if self.block_size < 2:
      raise TrainError(f"block_size={self.block_size}: a block drafts block_size - 1 tokens "
                       f"and needs at least 2 positions")
    if self.seq_len < self.block_size:
      raise TrainError(f"seq_len={self.seq_len} is shorter than a block ({self.block_size})")
    if self.loss_decay_gamma is not None and self.loss_decay_gamma <= 0:
      raise TrainError(f"loss_decay_gamma={self.loss_decay_gamma} must be > 0 (or null: every "
                       f"position weighs the same)")
    if not 0 < self.heldout < 1:
      raise TrainError(f"heldout={self.heldout} must be in (0, 1)")
    if self.heldout_split not in ("last", "random"):
      raise TrainError(f"heldout_split={self.heldout_split!r} is not 'last' or 'random'")
    if self.select_by not in (None, "tau", "heldout_loss"):
      raise TrainError(f"select_by={self.select_by!r} is not 'tau', 'heldout_loss' or null")
    if self.compute_dtype not in ("float32", "bfloat16"):
      raise TrainError(f"compute_dtype={self.compute_dtype!r} is not float32 or bfloat16")
    if self.norm_init not in ("target", "ones"):
      raise TrainError(f"norm_init={self.norm_init!r} is not 'target' or 'ones'")
    if self.draft_vocab_size is not None:
      if self.draft_vocab_size < 1:
        raise TrainError(f"draft_vocab_size={self.draft_vocab_size} must be >= 1 (or null: "
                         f"the target's head)")
      if self.loss_vocab is not None:
        raise TrainError(f"loss_vocab={self.loss_vocab} with draft_vocab_size="
                         f"{self.draft_vocab_size}: a head of its own is its softmax already")
    if self.loss_vocab is not None and self.loss_vocab < 1:
      raise TrainError(f"loss_vocab={self.loss_vocab} must be >= 1 (or null: the whole head)")
    self.feature_job()  # the feature fields checked before anything is loaded

  @property
  def optim(self) -> OptimConfig:
    return OptimConfig(lr=self.lr, warmup_steps=self.warmup_steps, total_steps=self.steps,
                       weight_decay=self.weight_decay, clip_norm=self.clip_norm)

  def feature_job(self, layers=None) -> EagleJob:
    """The EAGLE job whose features are this job's: the same target, data, layers and
    backend compute the same shards (one directory serves both kinds of drafter)."""
    return EagleJob(target=self.target, data=self.data, out=self.out, features=self.features,
                    feature_layers=None if layers is None else tuple(layers),
                    feature_backend=self.feature_backend, feature_dtype=self.feature_dtype,
                    final_hidden=self.final_hidden, max_records=self.max_records)

  def train_fingerprint(self) -> str:
    return train_fingerprint(self, new_defaults={"loss_vocab": None, "norm_init": "ones",
                                                   "draft_vocab_size": None})


def drafter_config(job: DFlashJob, target: LlamaLikeConfig, mask_token_id: int) -> DFlashConfig:
  """The drafter's config: Qwen3 layers (q/k norms, no biases) of the target's width, heads
  and RoPE, `num_layers` of them."""
  layer = target.replace(arch="qwen3", qk_norm=True, attention_bias=False,
                         num_layers=job.num_layers, layer_types=None, sliding_window=None,
                         intermediate_size=job.intermediate_size or target.intermediate_size)
  ids = tuple(job.target_layer_ids or default_target_layers(target.num_layers, job.num_layers))
  bad = [i for i in ids if not 0 <= i < target.num_layers - 1]
  if bad:
    raise TrainError(f"target_layer_ids={list(ids)}: layers {bad} are not in 0 .. "
                     f"{target.num_layers - 2} (the features are the residual stream after a "
                     f"layer; the last layer's output is read normed at decoding)")
  try:
    return DFlashConfig(layer=layer, target_hidden_size=target.hidden_size,
                        target_layer_ids=ids, block_size=job.block_size,
                        mask_token_id=mask_token_id, causal=True if job.causal else None)
  except ValueError as e:
    raise TrainError(str(e)) from None


def mask_token_of(job: DFlashJob, target) -> int:
  if job.mask_token_id is not None:
    return job.mask_token_id
  tok = target.tokenizer
  pad = getattr(tok, "pad_token_id", None) if tok is not None else None
  if pad is None:
    raise TrainError(f"{job.target}'s tokenizer has no pad token: name mask_token_id")
  return int(pad)


def train(job: DFlashJob, *, show_progress: bool = True, stop_after: int | None = None) -> dict:
  """Build the features if needed, train (resuming from checkpoints), export; the summary."""
  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  target = load_model(job.target, dtype="float32", progress=show_progress)
  tc = target.config
  config = drafter_config(job, tc, mask_token_of(job, target))
  fjob = job.feature_job(config.target_layer_ids)
  fdir = build_eagle_features(fjob, target, config.target_layer_ids, show_progress=show_progress)
  # from here on only the embedding and LM head are read: the layers go before the features
  embed, head = target.params["embed"], lm_head_weight(target.params, tc)
  final_norm = target.params["final_norm"]
  identity = model_identity(target)
  target = dataclasses.replace(target, params={k: v for k, v in target.params.items()
                                               if k != "layers"}, _layouts={})
  gc.collect()
  data = load_eagle_features(fdir, target, config.target_layer_ids)
  held = set(heldout_records(data, job.heldout, job.heldout_split, job.seed).tolist())
  train_idx = [i for i, (r, _, _) in enumerate(data.seqs) if r not in held]
  held_idx = [i for i, (r, _, _) in enumerate(data.seqs) if r in held]
  if not train_idx or not held_idx:
    raise TrainError(f"empty train ({len(train_idx)}) or held-out ({len(held_idx)}) records")
  if not any(len(valid_anchors(data, i, job.seq_len)) for i in train_idx):
    raise TrainError(f"no training record of {list(job.data)} has two completion tokens in "
                     f"a row: no block to train on")  # make_batch would draw records forever

  loss_head, t2d, loss_rows, ids = head, None, int(head.shape[0]), None
  n_rows = job.loss_vocab or job.draft_vocab_size
  if n_rows is not None:
    ids = loss_vocab_ids(data, train_idx, n_rows, tc.vocab_size)
    loss_head = jnp.take(head, jnp.asarray(ids), axis=0)
    t2d = row_map(ids, tc.vocab_size)
    loss_rows = len(ids)
  own = job.draft_vocab_size is not None
  if own and len(ids) < tc.vocab_size:
    config = dataclasses.replace(config, draft_vocab_size=len(ids))
  else:
    own = False  # as many rows as the vocabulary: the target's head
  hyper = job.optim.array()
  fingerprint = job.train_fingerprint()
  run = TrainRun(out, fingerprint, steps=job.steps, eval_every=job.eval_every,
                 checkpoint_every=job.checkpoint_every, what="train.dflash",
                 job=dataclasses.asdict(job))
  init = init_dflash(jax.random.key(job.seed), config)
  if job.norm_init == "target":
    init["final_norm"] = jnp.asarray(final_norm, init["final_norm"].dtype)
  d2t = None
  if own:  # the head starts as the target's rows of its ids; d2t is fixed, not a parameter
    init["lm_head"] = loss_head.astype(init["lm_head"].dtype)
    d2t = jnp.asarray(ids - np.arange(len(ids)), jnp.int32)
    del init["d2t"]
    loss_head = None
  state = run.restore(TrainState.create(init, make_optimizer(job.optim)))
  lowering = Lowering(bf16_dots=job.compute_dtype == "bfloat16")
  step_fn_jit = functools.partial(train_step, config=config,
                                  gamma_decay=job.loss_decay_gamma, block=job.vocab_block,
                                  lowering=lowering)
  drafter_dir = out / "drafter"
  best = None
  if job.select_by and (drafter_dir / "config.json").exists():
    rec = json.loads((drafter_dir / "config.json").read_text()).get("vocabjax", {})
    if rec.get("job") == fingerprint and rec.get("row", {}).get("step", 1e18) <= run.start:
      best = rec["row"]

  def export(st, row):
    params = jax.device_get(st.params)
    if own:
      params = dict(params, d2t=d2t)
    save_dflash(params, config, drafter_dir, num_target_layers=tc.num_layers,
                verifier=job.target,
                extra={"job": fingerprint, "row": row, "target": identity})

  def better(row):
    if best is None:
      return True
    if job.select_by == "tau":
      return row["tau"] > best["tau"]
    return row["heldout_loss"] < best["heldout_loss"]

  def keep_best(st, row):
    nonlocal best
    if job.select_by and better(row):
      export(st, row)
      best = row

  def evaluate(st, step):
    return evaluate_heldout(st.params, embed, None if own else head, data, held_idx,
                            config=config, batch_size=job.batch_size, seq_len=job.seq_len,
                            anchors=job.anchors, stride=job.eval_stride,
                            t2d=t2d if own else None)

  def step_fn(st, step):
    batch = make_batch(data, train_idx, step_rng(job.seed, step), batch_size=job.batch_size,
                       seq_len=job.seq_len, anchors=job.anchors)
    st, loss = step_fn_jit(st, {k: jnp.asarray(v) for k, v in batch.items()}, embed,
                           loss_head, hyper, t2d)
    return st, {"loss": loss}

  res = run.fit(state, step_fn, evaluate, on_row=keep_best, stop_after=stop_after,
                desc=f"DFlash drafter ({job.num_layers} layers, block {job.block_size})",
                show_progress=show_progress)
  run.plot(["train_loss", "heldout_loss", "tau", "acc_1", f"acc_{config.gamma}"],
           f"DFlash drafter for {identity['source']}")
  rows = res.rows
  summary = {"job": dataclasses.asdict(job), "steps_done": res.end,
             "complete": res.end == job.steps, "train_records": len(train_idx),
             "heldout_records": len(held_idx), "target_layer_ids": list(config.target_layer_ids),
             "loss_rows": loss_rows, "draft_vocab_size": config.draft_vocab_size,
             "mask_token_id": config.mask_token_id, "drafter_params": int(sum(
                 np.size(x) for x in jax.tree.leaves(init))),
             "train_completion_tokens": int(sum(
                 len(data.seqs[i][1]) - data.seqs[i][2] - 1 for i in train_idx)),
             "features_seconds": data.meta.get("seconds"),
             "start": rows[0] if rows else None, "final": rows[-1] if rows else None}
  if res.end == job.steps:
    if not job.select_by:
      export(res.state, rows[-1])
    load_dflash(drafter_dir, target_config=tc)  # what was exported loads for this target
    summary["exported"] = json.loads((drafter_dir / "config.json").read_text())[
        "vocabjax"]["row"]
  atomic_write_json(out / "summary.json", summary)
  return summary


def loss_vocab_ids(data, train_idx, n: int, V: int) -> np.ndarray:
  """The `n` most frequent completion tokens of the training records (ties to the lower id),
  sorted: the rows of a `loss_vocab` softmax."""
  counts = np.zeros(V, np.int64)
  for i in train_idx:
    _, toks, first = data.seqs[i]
    np.add.at(counts, np.asarray(toks[first + 1:], np.int64), 1)
  order = np.lexsort((np.arange(V), -counts))[:min(n, V)]
  return np.sort(order).astype(np.int32)


def job_from_dict(raw: dict, *, where: str = "config") -> DFlashJob:
  return DFlashJob(**job_fields(raw, DFlashJob, ("target", "data", "out"), where=where,
                                tuples=("target_layer_ids",)))


def main(argv=None) -> int:
  return run_job_cli(argv, prog="python -m vocabjax.train.dflash", doc=__doc__,
                     configs="configs/train/dflash_*.yaml", what="DFlash",
                     job_from_dict=job_from_dict, train=train)


if __name__ == "__main__":
  raise SystemExit(main())
