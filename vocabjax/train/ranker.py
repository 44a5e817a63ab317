"""`python -m vocabjax.train.ranker --config configs/ranker_*.yaml`: train SpecVocab's ranker.

Letters: N label positions, D drafter hidden size, R ranker rank (d'), V vocabulary, T teacher
top tokens.

Data: jsonl files of completions (`prompt` text + `completion_ids`, as written by
`python -m vocabjax.calibrate count --generate`). The positions that predict completion tokens
are the training rows. Their features are computed once and stored in shards under
`features/` (resumable, shard by shard; reused by every run with the same drafter, target and
data):
  hidden [N, D]   the drafter's final (normed) hidden state: the ranker's input
  label [N]       the target's next token there (its argmax, teacher-forced), or the text's
                  next token when no target is configured
  top_ids/top_p [N, T]  the target's top-T next-token distribution (for `loss: kl`)
  draft_argmax [N]      the drafter's own greedy token (recall of it = how often SpecVocab
                        drafts exactly what the full head would)
Records are split into train and held-out by prompt (the last `heldout` fraction of distinct
prompts; completions of one prompt by two models stay on one side).

Modes (SpecVocab section 3):
  frozen: only the ranker trains, on the stored hidden states; loss = cross-entropy of
    softmax(W_vocab W_down h) against the labels (`ce`) or the target's top-T distribution
    (`kl`), computed blockwise over V (`vocabjax.train.losses`).
  joint:  the drafter and the ranker train together, L = L_draft + lambda * L_aux: L_draft the
    drafter's own cross-entropy against the same labels (full LM head, blockwise), L_aux the
    ranker's loss on the drafter's hidden states (stop-gradient: the auxiliary loss trains the
    ranker only). Needs the token sequences, so it runs the drafter forward every step.
The ranker starts from the drafter head's best rank-R approximation (`init: svd`) or random.
Optimizer: AdamW, warmup + cosine, global-norm clipping; orbax checkpoints every
`checkpoint_every` steps (rerunning the command resumes); held-out loss and recall@k every
`eval_every` steps into `log.jsonl` and `curves.png`. Outputs: `ranker.safetensors` (with the
drafter's identity), `drafter/` (joint mode: the tuned drafter, safetensors), `recall.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.train.loop import (Checkpoints, OptimConfig, TrainError, TrainState, append_log,
                                 apply_grads, make_optimizer, plot_curves, progress, read_log,
                                 write_json_atomic)
from vocabjax.train.losses import label_ranks, vocab_cross_entropy

MODES = ("frozen", "joint")
LOSSES = ("ce", "kl")


@dataclasses.dataclass(frozen=True)
class RankerJob:
  drafter: str  # registry name or path of the drafter
  data: tuple[str, ...]  # completion jsonl files
  out: str  # output directory
  target: str | None = None  # teacher for labels (None: the text's next tokens)
  rank: int = 56  # d'
  mode: str = "frozen"
  loss: str = "ce"
  teacher_top: int = 32  # T stored per row
  steps: int = 1000
  batch_tokens: int = 512  # rows per step (frozen); joint: sequences of <= seq_len
  joint_batch: int = 2
  seq_len: int = 256
  joint_lambda: float = 0.1
  lr: float = 3e-3
  warmup_steps: int = 50
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  heldout: float = 0.1
  eval_every: int = 100
  checkpoint_every: int = 100
  recall_k: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
  select_by: str | None = "heldout_loss"  # frozen mode: export the evaluated step with the
  #   lowest held-out loss (or highest "recall@K_target"/"recall@K_drafter"); None: the last
  init: str = "svd"
  seed: int = 0
  vocab_block: int = 16384
  max_records: int | None = None
  features: str | None = None  # default <out>/features

  def __post_init__(self):
    if self.mode not in MODES:
      raise TrainError(f"mode={self.mode!r} is not one of {MODES}")
    if self.loss not in LOSSES:
      raise TrainError(f"loss={self.loss!r} is not one of {LOSSES}")
    if self.loss == "kl" and not self.target:
      raise TrainError("loss='kl' needs a target (its top-T distribution is the teacher)")
    if self.init not in ("svd", "random"):
      raise TrainError(f"init={self.init!r} is not 'svd' or 'random'")
    if self.rank < 1:
      raise TrainError(f"rank d'={self.rank} must be >= 1")
    if not 0 < self.heldout < 1:
      raise TrainError(f"heldout={self.heldout} must be in (0, 1)")
    if not self.data:
      raise TrainError("no data files given")
    keys = {"heldout_loss"} | {f"recall@{k}_{w}" for k in self.recall_k
                               for w in ("target", "drafter")}
    if self.select_by is not None and self.select_by not in keys:
      raise TrainError(f"select_by={self.select_by!r} is not one of {sorted(keys)}")

  @property
  def features_dir(self) -> Path:
    return Path(self.features) if self.features else Path(self.out) / "features"

  def feature_fingerprint(self) -> str:
    files = [(str(Path(p).resolve()), Path(p).stat().st_size) for p in self.data]
    key = json.dumps([self.drafter, self.target, files, self.teacher_top, self.max_records])
    return hashlib.sha256(key.encode()).hexdigest()[:16]

  def train_fingerprint(self) -> str:
    d = dataclasses.asdict(self)
    for k in ("out", "features", "eval_every", "checkpoint_every", "select_by"):
      d.pop(k)
    d["data"] = self.feature_fingerprint()
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def job_from_dict(raw: dict, *, where: str = "config") -> RankerJob:
  fields = {f.name: f for f in dataclasses.fields(RankerJob)}
  unknown = sorted(set(raw) - set(fields))
  if unknown:
    raise TrainError(f"{where}: unknown fields {unknown}; known: {sorted(fields)}")
  missing = [k for k in ("drafter", "data", "out") if k not in raw]
  if missing:
    raise TrainError(f"{where}: missing required field(s) {missing}")
  raw = dict(raw)
  raw["data"] = tuple([raw["data"]] if isinstance(raw["data"], str) else raw["data"])
  if "recall_k" in raw:
    raw["recall_k"] = tuple(raw["recall_k"])
  return RankerJob(**raw)


# --- features ----------------------------------------------------------------------------------

def read_records(paths, max_records=None) -> list[dict]:
  """Completion records (`prompt`, `completion_ids`) from jsonl files, in file order."""
  out = []
  for p in paths:
    p = Path(p)
    if not p.is_file():
      raise TrainError(f"no data file at {p}")
    for i, line in enumerate(p.read_text().splitlines()):
      if not line.strip():
        continue
      try:
        r = json.loads(line)
        out.append({"prompt": r["prompt"], "completion_ids": [int(t) for t in
                                                              r["completion_ids"]]})
      except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise TrainError(f"{p}:{i + 1} is not a completion record ({e!r})") from None
  if not out:
    raise TrainError(f"no completion records in {list(map(str, paths))}")
  return out[:max_records] if max_records else out


def model_identity(model) -> dict:
  from vocabjax.vocab.ranked import drafter_identity

  return {"source": Path(model.source).name, **drafter_identity(model.params, model.config)}


def _forward_fn(config):
  from vocabjax.models.cache import KVCache
  from vocabjax.models.llamalike import forward

  @jax.jit
  def run(params, tokens):
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    hidden, _ = forward(params, tokens, pos, KVCache.init(config, B, T), config=config)
    return hidden
  return run


def _record_features(rec, tokenizer, d_run, draft, t_run, target, T_top):
  from vocabjax.decoding.autoregressive import bucket
  from vocabjax.models.llamalike import lm_head

  prompt = tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"]
  comp = rec["completion_ids"]
  if not prompt or not comp:
    return None
  toks = prompt + comp
  L, P = len(toks), len(prompt)
  padded = np.zeros((1, bucket(L)), np.int32)
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


def build_features(job: RankerJob, *, show_progress: bool = True) -> Path:
  """Compute (or finish computing) the feature shards of `job`; returns the directory."""
  from vocabjax.checkpoints.loader import load_model

  fdir = job.features_dir
  fdir.mkdir(parents=True, exist_ok=True)
  meta_path = fdir / "meta.json"
  fp = job.feature_fingerprint()
  records = read_records(job.data, job.max_records)
  n_shards = -(-len(records) // SHARD_RECORDS)
  if meta_path.exists():
    meta = json.loads(meta_path.read_text())
    if meta.get("fingerprint") != fp:
      raise TrainError(f"{fdir} holds features of other data or models ({meta.get('drafter')}"
                       f" / {meta.get('target')} on {meta.get('data')}); use another "
                       f"'features' directory")
    if meta.get("complete"):
      return fdir
  todo = [i for i in range(n_shards) if not (fdir / f"shard-{i:05d}.npz").exists()]
  draft = load_model(job.drafter, dtype="float32")
  target = load_model(job.target, dtype="float32") if job.target else None
  if target is not None and target.config.vocab_size != draft.config.vocab_size:
    raise TrainError(f"target vocabulary V={target.config.vocab_size} differs from the "
                     f"drafter's V={draft.config.vocab_size}: a ranker needs one tokenizer")
  tok = draft.tokenizer
  if tok is None:
    raise TrainError(f"{draft.source} has no tokenizer: the prompts cannot be encoded")
  meta = {"fingerprint": fp, "drafter": model_identity(draft),
          "target": model_identity(target) if target else None,
          "data": [str(p) for p in job.data], "records": len(records), "shards": n_shards,
          "teacher_top": job.teacher_top, "complete": False}
  write_json_atomic(meta_path, meta)
  d_run = _forward_fn(draft.config)
  t_run = _forward_fn(target.config) if target else None
  t0, rows = time.perf_counter(), 0
  for i in progress(todo, desc="features (shards)", enabled=show_progress):
    parts = []
    for r in range(i * SHARD_RECORDS, min(len(records), (i + 1) * SHARD_RECORDS)):
      f = _record_features(records[r], tok, d_run, draft, t_run, target, job.teacher_top)
      if f is not None:
        parts.append((r, f))
    rows += sum(len(f["label"]) for _, f in parts)
    arrays = {k: np.concatenate([f[k] for _, f in parts])
              for k in ("hidden", "draft_argmax", "label", "top_ids", "top_p")
              if parts and k in parts[0][1]}
    arrays["record"] = np.concatenate([np.full(len(f["label"]), r, np.int32) for r, f in parts])
    arrays["seq_tokens"] = np.concatenate([f["tokens"] for _, f in parts])
    arrays["seq_offsets"] = np.cumsum([0] + [len(f["tokens"]) for _, f in parts])
    arrays["seq_first_row"] = np.asarray([f["first_row"] for _, f in parts], np.int32)
    arrays["seq_record"] = np.asarray([r for r, _ in parts], np.int32)
    tmp = fdir / f"shard-{i:05d}.tmp.npz"
    np.savez(tmp, **arrays)
    tmp.replace(fdir / f"shard-{i:05d}.npz")
  meta.update(complete=True, seconds=round(time.perf_counter() - t0, 1), new_rows=rows)
  write_json_atomic(meta_path, meta)
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
  meta_path = Path(fdir) / "meta.json"
  if not meta_path.exists() or not json.loads(meta_path.read_text()).get("complete"):
    raise TrainError(f"{fdir} has no complete features; run the training command (it builds "
                     f"them first)")
  meta = json.loads(meta_path.read_text())
  cols: dict = {}
  seqs = []
  for i in range(meta["shards"]):
    path = Path(fdir) / f"shard-{i:05d}.npz"
    try:
      z = dict(np.load(path))
    except (OSError, ValueError, EOFError) as e:
      raise TrainError(f"feature shard {path} is missing or corrupt ({e}); delete it and rerun "
                       f"to recompute it") from None
    for k in ("hidden", "label", "draft_argmax", "record", "top_ids", "top_p"):
      if k in z:
        cols.setdefault(k, []).append(z[k])
    off = z["seq_offsets"]
    for j, r in enumerate(z["seq_record"]):
      seqs.append((int(r), z["seq_tokens"][off[j]:off[j + 1]], int(z["seq_first_row"][j])))
  cat = {k: np.concatenate(v) for k, v in cols.items()}
  if not len(cat.get("label", [])):
    raise TrainError(f"{fdir} holds no training rows (empty completions?)")
  return Features(cat["hidden"], cat["label"], cat["draft_argmax"], cat["record"],
                  cat.get("top_ids"), cat.get("top_p"), seqs, meta)


def heldout_records(feats: "Features", heldout: float) -> np.ndarray:
  """Record ids held out: every record of the last `heldout` fraction of distinct prompts (in
  order of first appearance), so a prompt's completions by two models never straddle the split."""
  first_seen: dict = {}
  rec_prompt = {}
  for rec, toks, first in feats.seqs:
    key = tuple(toks[:first + 1].tolist())
    rec_prompt[rec] = first_seen.setdefault(key, len(first_seen))
  n = len(first_seen)
  cut = int(round(n * (1 - heldout)))
  if cut < 1 or cut >= n:
    raise TrainError(f"{n} distinct prompts cannot be split with heldout={heldout} (need at "
                     f"least one prompt on each side)")
  return np.asarray(sorted(r for r, g in rec_prompt.items() if g >= cut), np.int64)


# --- training ----------------------------------------------------------------------------------

def ranker_loss(ranker, h, batch, *, loss: str, block: int):
  low = jnp.einsum("ND,RD->NR", h, ranker["down"], preferred_element_type=jnp.float32)
  if loss == "kl":
    return vocab_cross_entropy(low, ranker["vocab"], None, batch.get("weight"),
                               teacher_ids=batch["top_ids"], teacher_probs=batch["top_p"],
                               block=block)
  return vocab_cross_entropy(low, ranker["vocab"], batch["label"], batch.get("weight"),
                             block=block)


def recall(ranker, rows: dict, ks) -> dict:
  """recall@k of the target's label and of the drafter's own argmax among the top-k scores."""
  low = jnp.asarray(rows["hidden"]) @ jnp.asarray(ranker["down"]).T
  out = {}
  for name in ("label", "draft_argmax"):
    r = np.asarray(label_ranks(low, jnp.asarray(ranker["vocab"]), jnp.asarray(rows[name])))
    for k in ks:
      out[f"recall@{k}_{'target' if name == 'label' else 'drafter'}"] = float(np.mean(r < k))
  return out


def _init_ranker(job, draft):
  from vocabjax.vocab.ranked import svd_ranker

  r = svd_ranker(draft.params, draft.config, job.rank)
  if job.init == "random":
    rs = np.random.RandomState(job.seed)
    D, V = draft.config.hidden_size, draft.config.vocab_size
    return {"down": jnp.asarray(rs.randn(job.rank, D) / np.sqrt(D), jnp.float32),
            "vocab": jnp.asarray(rs.randn(V, job.rank) / np.sqrt(job.rank), jnp.float32)}
  return {"down": jnp.asarray(r.down), "vocab": jnp.asarray(r.vocab)}


def _frozen_step(opt, job):
  @jax.jit
  def step(state, batch):
    loss, grads = jax.value_and_grad(
        lambda p: ranker_loss(p, batch["hidden"], batch, loss=job.loss,
                              block=job.vocab_block))(state.params)
    return apply_grads(state, grads, opt), loss
  return step


def _joint_step(opt, job, config):
  from vocabjax.models.cache import KVCache
  from vocabjax.models.llamalike import forward, lm_head_weight

  @jax.jit
  def step(state, batch):
    def total(p):
      B, T = batch["tokens"].shape
      pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
      h, _ = forward(p["drafter"], batch["tokens"], pos, KVCache.init(config, B, T),
                     config=config)
      h = h.reshape(B * T, -1)
      w = batch["weight"].reshape(-1)
      flat = {k: v.reshape((B * T,) + v.shape[2:]) for k, v in batch.items()
              if k not in ("tokens", "weight")}
      flat["weight"] = w
      U = lm_head_weight(p["drafter"], config)
      if job.loss == "kl":
        l_draft = vocab_cross_entropy(h, U, None, w, teacher_ids=flat["top_ids"],
                                      teacher_probs=flat["top_p"], block=job.vocab_block)
      else:
        l_draft = vocab_cross_entropy(h, U, flat["label"], w, block=job.vocab_block)
      l_aux = ranker_loss(p["ranker"], jax.lax.stop_gradient(h), flat, loss=job.loss,
                          block=job.vocab_block)
      return l_draft + job.joint_lambda * l_aux, (l_draft, l_aux)
    (loss, parts), grads = jax.value_and_grad(total, has_aux=True)(state.params)
    return apply_grads(state, grads, opt), loss
  return step


def _joint_batch(feats: Features, rec_ids, rs, job, label_rows: dict):
  """B sequences (random train records, a window of <= seq_len tokens) with per-position
  labels; positions without one get weight 0."""
  B, T = job.joint_batch, job.seq_len
  tokens = np.zeros((B, T), np.int32)
  weight = np.zeros((B, T), np.float32)
  label = np.zeros((B, T), np.int32)
  top_ids = np.zeros((B, T, job.teacher_top), np.int32) if feats.top_ids is not None else None
  top_p = np.zeros((B, T, job.teacher_top), np.float32) if feats.top_ids is not None else None
  for b in range(B):
    rec, toks, first = feats.seqs[rec_ids[rs.randint(len(rec_ids))]]
    rows = label_rows[rec]  # feature row indices of this record, in position order
    n = min(len(toks), T)
    tokens[b, :n] = toks[:n]
    for j, row in enumerate(rows):
      pos = first + j
      if pos < n:
        weight[b, pos] = 1.0
        label[b, pos] = feats.label[row]
        if top_ids is not None:
          top_ids[b, pos], top_p[b, pos] = feats.top_ids[row], feats.top_p[row]
  out = {"tokens": tokens, "weight": weight, "label": label}
  if top_ids is not None:
    out.update(top_ids=top_ids, top_p=top_p)
  return out


def train(job: RankerJob, *, show_progress: bool = True, stop_after: int | None = None) -> dict:
  """Build features if needed, train (resuming from checkpoints), export; returns the summary.

  `stop_after`: return after that many steps of this call (the run can be resumed later).
  """
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.vocab.ranked import Ranker, RankerError

  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  fdir = build_features(job, show_progress=show_progress)
  feats = load_features(fdir)
  draft = load_model(job.drafter, dtype="float32", progress=show_progress)
  if feats.meta["drafter"]["fingerprint"] != model_identity(draft)["fingerprint"]:
    raise TrainError(f"features in {fdir} were made with another drafter")
  D, V = draft.config.hidden_size, draft.config.vocab_size
  if job.rank > D:
    raise RankerError(f"ranker rank d'={job.rank} exceeds the drafter's hidden size d={D}")
  n_rec = feats.meta["records"]
  held_recs = heldout_records(feats, job.heldout)
  held_mask = np.isin(feats.record, held_recs)
  train_mask = ~held_mask
  held = feats.rows(held_mask)
  train_idx = np.flatnonzero(train_mask)
  if not len(train_idx) or not len(held["label"]):
    raise TrainError(f"empty train ({len(train_idx)}) or held-out ({len(held['label'])}) rows")

  opt = make_optimizer(OptimConfig(lr=job.lr, warmup_steps=job.warmup_steps,
                                   total_steps=job.steps, weight_decay=job.weight_decay,
                                   clip_norm=job.clip_norm))
  ranker0 = _init_ranker(job, draft)
  params = ranker0 if job.mode == "frozen" else {"drafter": draft.params, "ranker": ranker0}
  ckpt = Checkpoints(out / "checkpoints", job.train_fingerprint(), every=job.checkpoint_every)
  state = ckpt.restore_or(TrainState.create(params, opt))
  start = int(state.step)
  log_path = out / "log.jsonl"
  rows = read_log(log_path, upto_step=start)
  log_path.write_text("".join(json.dumps(r) + "\n" for r in rows))

  def ranker_of(p):
    return p if job.mode == "frozen" else p["ranker"]

  held_j = {k: jnp.asarray(v) for k, v in held.items()}

  @jax.jit
  def held_loss(ranker):
    return ranker_loss(ranker, held_j["hidden"], held_j, loss=job.loss, block=job.vocab_block)

  identity = model_identity(draft)
  best_path = out / "best.safetensors"

  def better(row, old) -> bool:
    if old is None:
      return True
    key = job.select_by
    return row[key] < old[key] if key == "heldout_loss" else row[key] > old[key]

  best_row = None  # the exported candidate so far (frozen mode with select_by)
  if best_path.exists():
    meta = Ranker.load(best_path).meta
    if meta.get("job") == job.train_fingerprint() and meta["row"]["step"] <= start:
      best_row = meta["row"]  # else another job's, or past the restored step (redone below)

  def evaluate(step, train_loss):
    nonlocal best_row
    r = ranker_of(state.params)
    row = {"step": step, "train_loss": train_loss, "heldout_loss": float(held_loss(r)),
           **recall(r, held, job.recall_k), "time": round(time.perf_counter() - t0, 1)}
    append_log(log_path, row)
    if job.mode == "frozen" and job.select_by and better(row, best_row):
      Ranker(np.asarray(r["down"]), np.asarray(r["vocab"]), drafter=identity,
             meta={"job": job.train_fingerprint(), "row": row}).save(best_path)
      best_row = row
    return row

  t0 = time.perf_counter()
  if start == 0:
    evaluate(0, None)
  def rng(step):  # batches depend on the step alone: a resumed run draws what it would have
    return np.random.RandomState((job.seed * 1_000_003 + step) % 2**32)

  if job.mode == "frozen":
    step_fn = _frozen_step(opt, job)
    cols = {k: jnp.asarray(v) for k, v in feats.rows(train_mask).items()}
    n = len(train_idx)

    def batch_at(step):
      sel = jnp.asarray(rng(step).randint(0, n, job.batch_tokens))
      return {k: v[sel] for k, v in cols.items()}
  else:
    step_fn = _joint_step(opt, job, draft.config)
    held_set = set(held_recs.tolist())
    rec_ids = [i for i, (r, _, _) in enumerate(feats.seqs) if r not in held_set]
    label_rows: dict = {}
    for row, r in enumerate(feats.record):
      label_rows.setdefault(int(r), []).append(row)

    def batch_at(step):
      return {k: jnp.asarray(v) for k, v in _joint_batch(feats, rec_ids, rng(step), job,
                                                         label_rows).items()}

  end = job.steps if stop_after is None else min(job.steps, start + stop_after)
  losses = []
  for step in progress(range(start, end), total=job.steps, initial=start,
                       desc=f"ranker d'={job.rank} ({job.mode})", enabled=show_progress):
    state, loss = step_fn(state, batch_at(step))
    losses.append(float(loss))
    done = step + 1
    if done % job.eval_every == 0 or done == job.steps:
      evaluate(done, float(np.mean(losses)))
      losses = []
    ckpt.save(done, state, force=done == end)
  ckpt.close()
  rows = read_log(log_path)
  plot_curves(rows, ["train_loss", "heldout_loss", f"recall@{max(job.recall_k)}_target",
                     f"recall@{min(job.recall_k)}_target"],
              out / "curves.png", f"ranker d'={job.rank} ({job.mode}, {job.loss})")
  summary = {"job": dataclasses.asdict(job), "steps_done": end, "complete": end == job.steps,
             "train_rows": int(len(train_idx)), "heldout_rows": int(len(held["label"])),
             "records": n_rec, "heldout_records": len(held_recs),
             "start": rows[0] if rows else None, "final": rows[-1] if rows else None,
             "complexity": {"V*d'+k*d": {k: V * job.rank + k * D for k in job.recall_k},
                            "V*d": V * D}}
  if end == job.steps:
    r = ranker_of(state.params)
    chosen = rows[-1]
    if job.mode == "frozen" and job.select_by:
      best = Ranker.load(best_path)
      r, chosen = {"down": best.down, "vocab": best.vocab}, best.meta["row"]
    summary["exported"] = chosen
    Ranker(np.asarray(r["down"]), np.asarray(r["vocab"]),
           drafter=(identity if job.mode == "frozen" else
                    _tuned_identity(state.params["drafter"], draft)),
           meta={"job": job.train_fingerprint(), "mode": job.mode, "loss": job.loss,
                 "steps": job.steps, "select_by": job.select_by, "exported_step":
                 chosen["step"], "final": chosen}).save(out / "ranker.safetensors")
    if job.mode == "joint":
      _save_drafter(state.params["drafter"], draft, out / "drafter")
  write_json_atomic(out / "recall.json", summary)
  return summary


def _tuned_identity(params, draft) -> dict:
  from vocabjax.vocab.ranked import drafter_identity

  return {"source": "joint-tuned " + Path(draft.source).name,
          **drafter_identity(params, draft.config)}


def _save_drafter(params, draft, path: Path) -> None:
  """The jointly tuned drafter as safetensors + config beside the original's tokenizer."""
  from vocabjax.checkpoints.hf import save_hf

  save_hf(params, draft.config, path, source=draft.source)


# --- command line ------------------------------------------------------------------------------

def load_job(path, **overrides) -> RankerJob:
  import yaml

  path = Path(path)
  if not path.is_file():
    raise TrainError(f"no ranker config at {path}")
  raw = yaml.safe_load(path.read_text()) or {}
  raw.update({k: v for k, v in overrides.items() if v is not None})
  return job_from_dict(raw, where=str(path))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m vocabjax.train.ranker", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="YAML job (configs/ranker_*.yaml)")
  p.add_argument("--out", help="override the output directory")
  p.add_argument("--steps", type=int, help="override the number of steps")
  p.add_argument("--features-only", action="store_true", help="build the features and stop")
  p.add_argument("--stop-after", type=int, help="return after N steps (resume later)")
  p.add_argument("--quiet", action="store_true")
  a = p.parse_args(argv)
  try:
    job = load_job(a.config, out=a.out, steps=a.steps)
    if a.features_only:
      print(build_features(job, show_progress=not a.quiet))
      return 0
    summary = train(job, show_progress=not a.quiet, stop_after=a.stop_after)
  except (TrainError, ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps({"final": summary["final"], "complete": summary["complete"]}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
