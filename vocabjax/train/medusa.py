"""`python -m vocabjax.train.medusa --config configs/train/medusa_*.yaml`: train Medusa-1 heads.

Letters: N positions per batch, D the target's hidden size, V its vocabulary, Hm heads, K the
training vocabulary (V, or its `train_vocab_size` most frequent tokens).

Data: the EAGLE trainer's feature shards built with `final_hidden: true` (the target's final
normed hidden state h_t and teacher-forced argmax y_t per position); a Medusa job names the same
`data`, `features` and feature settings as an EAGLE job, and builds them (resumably) when missing.
Loss: head j (0-based) reads h_t and predicts y_{t+j+1}; L = sum_j decay^j CE_j over the positions
whose label is a completion token (labels outside the training vocabulary skipped, counted).
Heads are per-position MLPs, so a batch is N positions drawn from every record, unpadded.

Heads: `num_layers` residual blocks each, and the target's LM head shared and frozen
(`shared_lm_head: true`, the default: a V x D projection per head is too much to train on a
CPU) or each head's own copy, trained. `train_vocab_size: K` computes the training softmax over
the K most frequent label tokens (null: the full V; the decode-time subset is `draft_vocab`).
Held-out records (the last `heldout` fraction of prompts, or `heldout_split: random`): per-head
loss, top-1 and top-`topk` accuracy over the full V every `eval_every` steps; the heads of the
best held-out step are exported in Medusa's layout (`vocabjax.checkpoints.medusa`) to
`<out>/heads`. docs/medusa.md.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.loader import load_model
from vocabjax.checkpoints.medusa import load_medusa, save_medusa
from vocabjax.io import atomic_write_json
from vocabjax.models.eagle import training_feature_layers
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.models.medusa import MedusaConfig, init_medusa, medusa_hidden
from vocabjax.train.eagle import EagleJob
from vocabjax.train.eagle_data import build_eagle_features, load_eagle_features
from vocabjax.train.features import heldout_records, model_identity
from vocabjax.train.loop import (OptimConfig, TrainError, TrainRun, TrainState, apply_grads,
                                 check_settings, job_fields, make_optimizer, optimizer_of,
                                 run_job_cli, step_rng, train_fingerprint)


@dataclasses.dataclass(frozen=True)
class MedusaJob:
  target: str  # registry name or path of the target
  data: tuple[str, ...]  # completion jsonl files (those of the EAGLE job whose shards are used)
  out: str  # output directory
  features: str | None = None  # the EAGLE feature shards (default <out>/features)
  feature_layers: tuple[int, ...] | None = None  # as the EAGLE job's (they name the shards)
  feature_backend: str = "jax"
  feature_dtype: str = "float32"
  max_records: int | None = None
  num_heads: int = 4  # Hm
  num_layers: int = 1  # residual blocks per head
  shared_lm_head: bool = True  # the target's head, frozen, for every head
  train_vocab_size: int | None = 32768  # K; None: the full V
  step_decay: float = 0.8
  batch_size: int = 2048  # N positions per step
  steps: int = 300
  lr: float = 1e-3
  warmup_steps: int = 20
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  heldout: float = 0.1
  heldout_split: str = "last"  # "last" prompts or a "random" sample of them (seed), as EAGLE's
  topk: int = 5
  heldout_positions: int = 2048  # evaluated held-out positions (a fixed sample; full-V logits)
  eval_every: int = 50
  checkpoint_every: int = 50
  seed: int = 0

  def __post_init__(self):
    check_settings(self)
    if not self.data:
      raise TrainError("no data files given")
    if self.num_heads < 1 or self.num_layers < 1:
      raise TrainError(f"need num_heads >= 1 and num_layers >= 1, got num_heads="
                       f"{self.num_heads}, num_layers={self.num_layers}")
    if not 0 < self.heldout < 1:
      raise TrainError(f"heldout={self.heldout} must be in (0, 1)")
    if self.heldout_split not in ("last", "random"):
      raise TrainError(f"heldout_split={self.heldout_split!r} is not 'last' or 'random'")
    if self.topk < 1:
      raise TrainError(f"topk={self.topk} must be >= 1")
    if not self.shared_lm_head and self.train_vocab_size is not None:
      raise TrainError("train_vocab_size needs shared_lm_head: true (each head's own projection "
                       "trains over the full V: set train_vocab_size: null)")
    self.eagle_job  # the feature settings are checked there
    self.optim

  @property
  def optim(self) -> OptimConfig:
    return OptimConfig(lr=self.lr, warmup_steps=self.warmup_steps, total_steps=self.steps,
                       weight_decay=self.weight_decay, clip_norm=self.clip_norm)

  @property
  def eagle_job(self) -> EagleJob:
    """The EAGLE job whose feature shards these are (same fingerprint, `final_hidden`)."""
    return EagleJob(target=self.target, data=self.data, out=self.out, features=self.features,
                    feature_layers=self.feature_layers, feature_backend=self.feature_backend,
                    feature_dtype=self.feature_dtype, final_hidden=True,
                    max_records=self.max_records)

  def train_fingerprint(self) -> str:
    return train_fingerprint(self, new_defaults={"heldout_split": "last"})


@dataclasses.dataclass
class Positions:
  """Every usable position of a set of records: h_t [P, D] float16 and labels [P, Hm] (target
  ids y_{t+j+1}, -1 where that token is past the record or not a completion token)."""

  hidden: np.ndarray
  labels: np.ndarray


def positions(data, idx, num_heads: int) -> Positions:
  hs, ys = [], []
  for i in idx:
    _, toks, first = data.seqs[i]
    L = len(toks)
    y = data.labels[i]
    t = np.arange(max(0, first - 1), L - 1)  # y_{t+1} must exist and be a completion token
    if not len(t):
      continue
    lab = np.full((len(t), num_heads), -1, np.int32)
    for j in range(num_heads):
      src = t + j + 1
      ok = (src < L) & (src >= first)
      lab[ok, j] = y[src[ok]]
    keep = (lab >= 0).any(1)
    hs.append(data.hidden[i][t[keep]])
    ys.append(lab[keep])
  if not hs:
    raise TrainError("no positions with completion labels in these records")
  return Positions(np.concatenate(hs), np.concatenate(ys))


def choose_train_vocab(labels: np.ndarray, K: int | None, V: int) -> np.ndarray:
  """Ascending ids of the training vocabulary: all V, or the K most frequent labels (ties by
  id)."""
  if K is None:
    return np.arange(V)
  if not 1 <= K <= V:
    raise TrainError(f"train_vocab_size={K} must be in [1, V={V}]")
  counts = np.bincount(labels[labels >= 0], minlength=V)
  order = np.lexsort((np.arange(V), -counts))
  return np.sort(order[:K])


def medusa_loss(params, frozen, h, dlabel, *, config: MedusaConfig, decay: float):
  """(sum_j decay^j CE_j, CE_j [Hm]) over the training vocabulary; dlabel [N, Hm] holds indices
  into it, -1 where skipped."""
  x = medusa_hidden(params, h.astype(jnp.float32), config=config)  # [N, Hm, D]
  if config.shared_lm_head:
    logits = jnp.einsum("NHD,KD->NHK", x, frozen["rows"])
  else:
    logits = jnp.stack([x[:, i] @ head["lm_head"].T for i, head in enumerate(params["heads"])],
                       axis=1)
  lse = jax.nn.logsumexp(logits, -1)
  picked = jnp.take_along_axis(logits, jnp.maximum(dlabel, 0)[..., None], -1)[..., 0]
  w = (dlabel >= 0).astype(jnp.float32)
  ce = ((lse - picked) * w).sum(0) / jnp.maximum(w.sum(0), 1.0)
  return (ce * decay ** jnp.arange(config.num_heads)).sum(), ce


def _full_logits(params, frozen, h, config: MedusaConfig):
  x = medusa_hidden(params, h.astype(jnp.float32), config=config)
  if config.shared_lm_head:
    return jnp.einsum("NHD,VD->NHV", x, frozen["full"])
  return jnp.stack([x[:, i] @ head["lm_head"].T for i, head in enumerate(params["heads"])], 1)


def evaluate_heldout(params, frozen, held: Positions, t2k, config: MedusaConfig, job: MedusaJob,
                     fn_cache: dict) -> dict:
  """Held-out per-head CE (training vocabulary) and top-1 / top-k accuracy over the full V."""
  if "fn" not in fn_cache:
    def fn(params, frozen, h, y, dl):
      _, ce = medusa_loss(params, frozen, h, dl, config=config, decay=job.step_decay)
      logits = _full_logits(params, frozen, h, config)
      _, top = jax.lax.top_k(logits, job.topk)
      valid = y >= 0
      hit1 = (top[..., 0] == y) & valid
      hitk = (top == y[..., None]).any(-1) & valid
      return ce, (dl >= 0).sum(0), hit1.sum(0), hitk.sum(0), valid.sum(0)
    fn_cache["fn"] = jax.jit(fn)
  n_heads = config.num_heads
  ce_sum, ce_n = np.zeros(n_heads), np.zeros(n_heads)
  h1, hk, n = np.zeros(n_heads), np.zeros(n_heads), np.zeros(n_heads)
  B = 128  # full-V logits [B, Hm, V] f32 per call
  for s in range(0, len(held.hidden), B):
    h = held.hidden[s:s + B]
    y = held.labels[s:s + B]
    pad = B - len(h)
    if pad:  # one compiled shape
      h = np.concatenate([h, np.zeros((pad, h.shape[1]), h.dtype)])
      y = np.concatenate([y, np.full((pad, n_heads), -1, np.int32)])
    dl = np.where(y >= 0, t2k[np.maximum(y, 0)], -1)
    ce, cnt, a1, ak, v = fn_cache["fn"](params, frozen, jnp.asarray(h), jnp.asarray(y),
                                        jnp.asarray(dl))
    ce_sum += np.asarray(ce) * np.asarray(cnt)
    ce_n += np.asarray(cnt)
    h1 += np.asarray(a1)
    hk += np.asarray(ak)
    n += np.asarray(v)
  ce = ce_sum / np.maximum(ce_n, 1)
  row = {"heldout_loss": float((ce * job.step_decay ** np.arange(n_heads)).sum())}
  for j in range(n_heads):
    row[f"ce_{j}"] = float(ce[j])
    row[f"acc_{j}"] = float(h1[j] / max(n[j], 1))
    row[f"top{job.topk}_{j}"] = float(hk[j] / max(n[j], 1))
  return row


def train(job: MedusaJob, *, show_progress: bool = True, stop_after: int | None = None) -> dict:
  """Build (or reuse) the shards, train (resuming), export the best heads; returns the summary."""
  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  target = load_model(job.target, dtype="float32", progress=show_progress)
  tc = target.config
  layers = tuple(job.feature_layers or training_feature_layers(tc.num_layers))
  if job.train_vocab_size is not None and not 1 <= job.train_vocab_size <= tc.vocab_size:
    raise TrainError(f"train_vocab_size={job.train_vocab_size} must be in [1, "
                     f"V={tc.vocab_size}]")
  fdir = build_eagle_features(job.eagle_job, target, layers, show_progress=show_progress)
  data = load_eagle_features(fdir, target, layers, hidden=True)
  held_recs = set(heldout_records(data, job.heldout, job.heldout_split, job.seed).tolist())
  train_idx = [i for i, (r, _, _) in enumerate(data.seqs) if r not in held_recs]
  held_idx = [i for i, (r, _, _) in enumerate(data.seqs) if r in held_recs]
  if not train_idx or not held_idx:
    raise TrainError(f"empty train ({len(train_idx)}) or held-out ({len(held_idx)}) records")
  tr = positions(data, train_idx, job.num_heads)
  held = positions(data, held_idx, job.num_heads)
  if len(held.hidden) > job.heldout_positions:  # a fixed, spread sample
    pick = np.random.RandomState(job.seed).choice(len(held.hidden), job.heldout_positions,
                                                  replace=False)
    held = Positions(held.hidden[np.sort(pick)], held.labels[np.sort(pick)])
  V = tc.vocab_size
  ids = choose_train_vocab(tr.labels, job.train_vocab_size, V)
  t2k = np.full(V, -1, np.int32)
  t2k[ids] = np.arange(len(ids))
  skipped = float(((tr.labels >= 0) & (t2k[np.maximum(tr.labels, 0)] < 0)).sum()
                  / max((tr.labels >= 0).sum(), 1))

  mc = MedusaConfig(num_heads=job.num_heads, hidden_size=tc.hidden_size, vocab_size=V,
                    num_layers=job.num_layers, shared_lm_head=job.shared_lm_head)
  full = lm_head_weight(target.params, tc)
  params = init_medusa(jax.random.key(job.seed), mc, None if job.shared_lm_head else full)
  frozen = {"rows": jnp.take(full, jnp.asarray(ids), axis=0), "full": full}
  hyper = job.optim.array()  # the step's argument: jobs differing only there share a program
  run = TrainRun(out, job.train_fingerprint(), steps=job.steps, eval_every=job.eval_every,
                 checkpoint_every=job.checkpoint_every, what="train.medusa",
                 job=dataclasses.asdict(job))
  state = run.restore(TrainState.create(params, make_optimizer(job.optim)))

  @jax.jit
  def train_fn(st, frozen, h, dl, hyper):
    (loss, _), grads = jax.value_and_grad(
        lambda p: medusa_loss(p, frozen, h, dl, config=mc, decay=job.step_decay),
        has_aux=True)(st.params)
    return apply_grads(st, grads, optimizer_of(hyper)), loss

  identity = model_identity(target)
  heads_dir = out / "heads"
  best = {"row": None}
  if (heads_dir / "config.json").exists():
    rec = json.loads((heads_dir / "config.json").read_text()).get("vocabjax", {})
    if rec.get("job") == job.train_fingerprint() and rec.get("row", {}).get(
        "step", 1e18) <= run.start:
      best["row"] = rec["row"]
  fn_cache: dict = {}

  def evaluate(st, step):
    return evaluate_heldout(st.params, frozen, held, t2k, mc, job, fn_cache)

  def keep_best(st, row):
    if best["row"] is None or row["heldout_loss"] < best["row"]["heldout_loss"]:
      save_medusa(st.params, mc, heads_dir, target=identity,
                  extra={"job": job.train_fingerprint(), "row": row})
      best["row"] = row

  def step_fn(st, step):
    rs = step_rng(job.seed, step)
    pick = rs.randint(0, len(tr.hidden), job.batch_size)
    y = tr.labels[pick]
    dl = np.where(y >= 0, t2k[np.maximum(y, 0)], -1)
    st, loss = train_fn(st, frozen, jnp.asarray(tr.hidden[pick]), jnp.asarray(dl), hyper)
    return st, {"loss": loss}

  res = run.fit(state, step_fn, evaluate, on_row=keep_best, stop_after=stop_after,
                desc=f"Medusa heads ({job.num_heads})", show_progress=show_progress)
  rows = res.rows
  run.plot(["train_loss", "heldout_loss", "acc_0", f"acc_{job.num_heads - 1}"],
           f"Medusa heads for {identity['source']}")
  summary = {"job": dataclasses.asdict(job), "steps_done": res.end,
             "complete": res.end == job.steps, "train_records": len(train_idx),
             "heldout_records": len(held_idx), "train_positions": int(len(tr.hidden)),
             "heldout_positions": int(len(held.hidden)), "train_vocab": int(len(ids)),
             "labels_outside_train_vocab": round(skipped, 5),
             "start": rows[0] if rows else None, "final": rows[-1] if rows else None}
  if res.end == job.steps:
    load_medusa(heads_dir, target_config=tc, target_params=target.params)  # loads for it
    summary["exported"] = json.loads((heads_dir / "config.json").read_text())["vocabjax"]["row"]
  atomic_write_json(out / "summary.json", summary)
  return summary


# --- command line ------------------------------------------------------------------------------

def job_from_dict(raw: dict, *, where: str = "config") -> MedusaJob:
  return MedusaJob(**job_fields(raw, MedusaJob, ("target", "data", "out"), where=where,
                                tuples=("feature_layers",)))


def main(argv=None) -> int:
  return run_job_cli(argv, prog="python -m vocabjax.train.medusa", doc=__doc__,
                     configs="configs/train/medusa_*.yaml", what="Medusa", job_from_dict=job_from_dict,
                     train=train)


if __name__ == "__main__":
  sys.exit(main())
