"""`python -m vocabjax.train.ranker --config configs/train/ranker_*.yaml`: train SpecVocab's
ranker.

Letters: X label positions (rows), D drafter hidden size, R ranker rank (d'), V vocabulary, Kt
teacher top tokens, B and T a joint-mode batch's sequences and tokens.

Data: the drafter's final hidden states, the target's next tokens (and top-Kt distribution) and
the drafter's greedy tokens at every completion position, computed once into feature shards
(`vocabjax.train.features`; `<out>/features`, or shared through `features`). `eagle_head`: an
EAGLE head over the target's full vocabulary as the drafter (rows: its normed depth-0 outputs
over `eagle_features`; `drafter` names its target; frozen mode, `ce` only). `dflash_drafter`:
likewise a DFlash drafter drafting through the target's head (rows: its blocks' drafted
positions at every `anchor_stride`-th completion position, each labelled with the target's token
there). Records split into
train and held-out by prompt (the last `heldout` fraction). Modes (SpecVocab section 3):
`frozen` trains the ranker alone on the stored states, cross-entropy of softmax(W_vocab W_down h)
against the labels (`ce`) or the target's top-Kt distribution (`kl`), blockwise over V; `joint`
trains drafter and ranker, L = L_draft + lambda * L_aux (the ranker's loss on stop-gradient
states), running the drafter every step. `init`: `svd` (the head's best rank-R approximation) or
random. Frozen mode's `label`: `target` (the next token) or `drafter` (its own greedy token: no
target forward needed, `target: null`); `vocab`: `free` (W_vocab [V, R]) or `tied` (W_vocab = U P,
U the drafter's frozen LM head, so unseen tokens rank like seen ones; exported as U P). AdamW,
warmup + cosine, clipping; orbax checkpoints every `checkpoint_every` steps (rerun to resume);
held-out loss and recall@k every `eval_every` steps (`log.jsonl`, `curves.png`). Outputs:
`ranker.safetensors` (with the drafter's identity; frozen mode: the best step by `select_by`),
`drafter/` (joint mode, an HF directory), `recall.json`. docs/specvocab.md.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.dflash import load_dflash
from vocabjax.checkpoints.eagle3 import load_eagle3
from vocabjax.checkpoints.hf import save_hf
from vocabjax.checkpoints.loader import load_model
from vocabjax.io import atomic_write_json
from vocabjax.models.dflash import scale_logits
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.train.dflash_step import empty_batch, hidden_of, put_record, valid_anchors
from vocabjax.train.eagle_job import head_identity
from vocabjax.train.eagle_data import load_eagle_features
from vocabjax.train.eagle_step import ttt_outputs
from vocabjax.train.features import (FeatureSpec, Features, build_features, forward_len,
                                     heldout_records, job_fingerprint, load_features,
                                     model_identity, pending_shards, sequence_hidden,
                                     write_shards)
from vocabjax.train.loop import (OptimConfig, TrainError, TrainRun, TrainState, apply_grads,
                                 check_settings, job_fields, make_optimizer, optimizer_of,
                                 run_job_cli, step_rng, train_fingerprint)
from vocabjax.train.losses import label_ranks, vocab_cross_entropy
from vocabjax.vocab.ranked import Ranker, RankerError, svd_of_head
from vocabjax.models.identity import drafter_identity

MODES = ("frozen", "joint")
LOSSES = ("ce", "kl")
LABELS = ("target", "drafter")
VOCABS = ("free", "tied")


@dataclasses.dataclass(frozen=True)
class RankerJob:
  drafter: str  # registry name or path of the drafter
  data: tuple[str, ...]  # completion jsonl files
  out: str  # output directory
  target: str | None = None  # teacher for labels (None: the text's next tokens)
  rank: int = 56  # d'
  mode: str = "frozen"
  loss: str = "ce"
  teacher_top: int = 32  # Kt stored per row
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
  label: str = "target"  # what CE trains toward: "target" (next token) or "drafter" (its argmax)
  vocab: str = "free"  # "free" W_vocab [V, R] or "tied" W_vocab = U P (module doc)
  # an EAGLE-3 head over the target's full vocabulary as the drafter (module doc); `drafter` is
  # then its target, `eagle_features` the target features it was trained on (one directory or
  # one per data file, as the head's recipe names them)
  eagle_head: str | None = None
  eagle_features: str | tuple[str, ...] | None = None
  # or a DFlash drafter directory (z-lab's layout) over the target's head, with the target
  # features it was trained on as `eagle_features`; its rows: every `anchor_stride`-th anchor
  dflash_drafter: str | None = None
  anchor_stride: int = 4

  @property
  def head(self) -> str | None:
    """The head or drafter over the target's vocabulary this ranker is for (None: a model)."""
    return self.eagle_head or self.dflash_drafter

  def __post_init__(self):
    check_settings(self)
    if isinstance(self.eagle_features, list):
      object.__setattr__(self, "eagle_features", tuple(self.eagle_features))
    if self.eagle_head is not None and self.dflash_drafter is not None:
      raise TrainError("give eagle_head or dflash_drafter, not both: a ranker serves one head")
    if (self.head is None) != (self.eagle_features is None):
      raise TrainError("eagle_head (or dflash_drafter) and eagle_features go together: the "
                       "head and the target features it was trained on")
    if self.anchor_stride < 1:
      raise TrainError(f"anchor_stride={self.anchor_stride} must be >= 1")
    if self.head is not None:
      if self.mode != "frozen" or self.loss != "ce" or self.target is not None:
        raise TrainError(f"a head's ranker trains in mode='frozen' with loss='ce' on the "
                         f"target's tokens stored in its features (target: null); got "
                         f"mode={self.mode!r}, loss={self.loss!r}, target={self.target!r}")
    if self.mode not in MODES:
      raise TrainError(f"mode={self.mode!r} is not one of {MODES}")
    if self.loss not in LOSSES:
      raise TrainError(f"loss={self.loss!r} is not one of {LOSSES}")
    if self.loss == "kl" and not self.target:
      raise TrainError("loss='kl' needs a target (its top-Kt distribution is the teacher)")
    if self.init not in ("svd", "random"):
      raise TrainError(f"init={self.init!r} is not 'svd' or 'random'")
    if self.label not in LABELS:
      raise TrainError(f"label={self.label!r} is not one of {LABELS}")
    if self.label == "drafter" and self.loss != "ce":
      raise TrainError(f"label='drafter' trains cross-entropy on the drafter's greedy token; "
                       f"loss={self.loss!r} is a distribution over the target's tokens")
    if self.label == "drafter" and self.mode != "frozen":
      raise TrainError(f"label='drafter' is for mode='frozen' (joint mode tunes the drafter "
                       f"toward the target's tokens); got mode={self.mode!r}")
    if self.vocab not in VOCABS:
      raise TrainError(f"vocab={self.vocab!r} is not one of {VOCABS}")
    if self.vocab == "tied" and self.mode != "frozen":
      raise TrainError(f"vocab='tied' is for mode='frozen' (the drafter's head it is tied to "
                       f"is frozen); got mode={self.mode!r}")
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

  @property
  def feature_spec(self) -> FeatureSpec:
    return FeatureSpec(drafter=self.drafter, data=self.data, directory=str(self.features_dir),
                       target=self.target, teacher_top=self.teacher_top,
                       max_records=self.max_records)

  def head_feature_fingerprint(self) -> str:
    """The head-ranker features: the head's weights and export record, the target features'
    directories and fingerprints (what `build_head_features` computes from)."""
    dirs = ([self.eagle_features] if isinstance(self.eagle_features, str)
            else list(self.eagle_features))
    metas = []
    for d in dirs:
      meta = Path(d) / "meta.json"
      metas.append(json.loads(meta.read_text()).get("fingerprint") if meta.exists() else None)
    if self.dflash_drafter:
      return job_fingerprint("dflash-drafter-ranker", self.drafter,
                             head_identity(self.dflash_drafter), dirs, metas, self.max_records,
                             self.anchor_stride)
    return job_fingerprint("eagle-head-ranker", self.drafter, head_identity(self.eagle_head),
                           dirs, metas, self.max_records)

  def train_fingerprint(self) -> str:
    data = (self.head_feature_fingerprint() if self.head
            else self.feature_spec.fingerprint())
    return train_fingerprint(self, replace={"data": data},
                             new_defaults={"label": "target", "vocab": "free",
                                           "eagle_head": None, "eagle_features": None,
                                           "dflash_drafter": None, "anchor_stride": 4})


def job_from_dict(raw: dict, *, where: str = "config") -> RankerJob:
  return RankerJob(**job_fields(raw, RankerJob, ("drafter", "data", "out"), where=where,
                                tuples=("recall_k",)))


# --- an EAGLE head as the drafter ----------------------------------------------------------------

def load_head(job: RankerJob, target):
  """(head config, the head's params) of `job.eagle_head` for `target` (the loader refuses a
  head of another target), refused unless its LM head covers the target's whole vocabulary."""
  try:
    hc, params, _ = load_eagle3(job.eagle_head, target_config=target.config,
                                target_params=target.params, dtype=jnp.float32)
  except ValueError as e:
    raise TrainError(f"eagle_head={job.eagle_head!r}: {e}") from None
  V = target.config.vocab_size
  if hc.draft_vocab_size != V:
    raise TrainError(f"eagle_head={job.eagle_head!r} drafts over {hc.draft_vocab_size} tokens, "
                     f"not the target's V={V}: SpecVocab ranks a full-vocabulary head (train "
                     f"it with draft_vocab_size: null)")
  return hc, params


def _head_rows_todo(job: RankerJob, target, layers):
  """(features dir, target feature dirs, fingerprint, the target features, records, shards
  still to compute) of a head's or drafter's ranker rows; TrainError when `job.data` are not the
  files the target features were made from (a head's rows come from its own features)."""
  fdir = job.features_dir
  fdir.mkdir(parents=True, exist_ok=True)
  dirs = ([job.eagle_features] if isinstance(job.eagle_features, str)
          else list(job.eagle_features))
  fingerprint = job.head_feature_fingerprint()
  data = load_eagle_features([Path(d) for d in dirs] if len(dirs) > 1 else Path(dirs[0]),
                             target, layers)
  made_from = [str(Path(f).resolve()) for f in data.meta["data"]]
  if [str(Path(f).resolve()) for f in job.data] != made_from:
    raise TrainError(f"data={list(job.data)} are not the files eagle_features={dirs} were made "
                     f"from ({data.meta['data']}): a head's rows come from its own features")
  n = len(data.seqs) if job.max_records is None else min(job.max_records, len(data.seqs))
  return fdir, dirs, fingerprint, data, n, pending_shards(fdir, fingerprint, n)


def build_head_features(job: RankerJob, target=None, head=None, *,
                        show_progress: bool = True) -> Path:
  """The ranker rows of an EAGLE head (`job.eagle_head`), from the target features it was
  trained on, in the drafter-feature format `load_features` reads; resumable per shard.
  `target` / `head`: the loaded target and `load_head`'s result (loaded here when not given)."""
  if target is None:
    target = load_model(job.drafter, dtype="float32", progress=show_progress)
  hc, params = head if head is not None else load_head(job, target)
  fdir, dirs, fingerprint, data, n, todo = _head_rows_todo(job, target, hc.feature_layers)
  if not todo:
    return fdir
  embed = target.params["embed"]
  head_rows = jnp.asarray(params["lm_head"], jnp.float32)  # [V, D], target ids (full V)
  run = jax.jit(lambda p, e, b: ttt_outputs(p, e, b, config=hc, steps=1))

  def record_fn(i):
    _, toks, first = data.seqs[i]
    L = len(toks)
    T = forward_len(L)
    batch = {"tokens": np.zeros((1, T), np.int32),
             "feats": np.zeros((1, T, data.feats[i].shape[1]), np.float32),
             "dlabel": np.full((1, T), -1, np.int32), "weight": np.zeros((1, T), np.float32)}
    batch["tokens"][0, :L] = toks
    batch["feats"][0, :L] = data.feats[i]
    rows = np.arange(max(first - 1, 0), L - 2)  # output i predicts token i + 2 (ttt_outputs)
    if not len(rows):
      return None
    (hn, _, _), = run(params, embed, {k: jnp.asarray(v) for k, v in batch.items()})
    h = hn[0, rows]
    own = jnp.argmax(h @ head_rows.T, -1)  # h is normed already: the head's LM head on it
    return {"hidden": np.asarray(h, np.float32),
            "label": np.asarray(data.labels[i][rows + 1], np.int32),
            "draft_argmax": np.asarray(own, np.int32), "tokens": np.asarray(toks, np.int32),
            "first_row": int(rows[0])}

  meta = {"fingerprint": fingerprint, "kind": "eagle_head_ranker",
          "drafter": head_drafter_identity(target, params), "target": model_identity(target),
          "eagle_head": str(job.eagle_head), "eagle_features": dirs}
  write_shards(fdir, meta, list(range(n)), todo, record_fn, desc="head features (shards)",
               show_progress=show_progress)
  return fdir


def load_dflash_drafter(job: RankerJob, target):
  """(config, params) of `job.dflash_drafter` for `target` (refused: another target's, or one
  with a head of its own: SpecVocab ranks the target's whole head it drafts through)."""
  try:
    dc, dp = load_dflash(job.dflash_drafter, target_config=target.config, dtype=jnp.float32)
  except ValueError as e:
    raise TrainError(f"dflash_drafter={job.dflash_drafter!r}: {e}") from None
  if dc.draft_vocab_size is not None:
    raise TrainError(f"dflash_drafter={job.dflash_drafter!r} drafts over a head of its own "
                     f"({dc.draft_vocab_size} rows): SpecVocab ranks the target's whole head")
  if dc.dflash2:
    raise TrainError(f"dflash_drafter={job.dflash_drafter!r} is a DFlash 2 drafter: its "
                     f"selector rescores the head's top-k, a ranker's rows are not trained here")
  return dc, dp


def build_dflash_features(job: RankerJob, target=None, drafter=None, *,
                          show_progress: bool = True) -> Path:
  """The ranker rows of a DFlash drafter (`job.dflash_drafter`): at every `anchor_stride`-th
  completion position of each record, the block's drafted positions' final hidden states
  (`train.dflash_step.hidden_of`, over the target features it was trained on), the target's
  token there as the label and the drafter's own greedy token through the target's head;
  resumable per shard, in the format `load_features` reads."""
  if target is None:
    target = load_model(job.drafter, dtype="float32", progress=show_progress)
  dc, dp = drafter if drafter is not None else load_dflash_drafter(job, target)
  fdir, dirs, fingerprint, data, n, todo = _head_rows_todo(job, target, dc.target_layer_ids)
  if not todo:
    return fdir
  embed = target.params["embed"]
  head = lm_head_weight(target.params, target.config)
  A = 16  # anchors per call (one program per record length bucket)
  run = jax.jit(lambda p, e, b: hidden_of(p, e, b, dc))
  greedy = jax.jit(lambda h, w: jnp.argmax(scale_logits(h @ w.T, dc), -1))  # w an argument
  G = dc.gamma

  def record_fn(i):
    _, toks, first = data.seqs[i]
    L = len(toks)
    anchors = valid_anchors(data, i, L)[::job.anchor_stride]
    if not len(anchors):
      return None
    hs, labels = [], []
    for j in range(0, len(anchors), A):
      part = anchors[j:j + A]
      b = empty_batch(data, 1, forward_len(L), A)
      put_record(b, data, 0, i, part)
      h = run(dp, embed, {k: jnp.asarray(v) for k, v in b.items()})[0, :len(part)]
      idx = part[:, None] + np.arange(1, G + 1)  # the token each drafted position predicts
      keep = idx < L
      hs.append(np.asarray(h)[keep])
      labels.append(data.labels[i][idx[keep] - 1])  # the target's argmax there: its token
    h = np.concatenate(hs).astype(np.float32)
    return {"hidden": h, "label": np.concatenate(labels).astype(np.int32),
            "draft_argmax": np.asarray(greedy(jnp.asarray(h), head), np.int32),
            "tokens": np.asarray(toks, np.int32), "first_row": int(first)}

  meta = {"fingerprint": fingerprint, "kind": "dflash_drafter_ranker",
          "drafter": head_drafter_identity(target, {"lm_head": head}, "dflash drafter"),
          "target": model_identity(target), "dflash_drafter": str(job.dflash_drafter),
          "eagle_features": dirs, "anchor_stride": job.anchor_stride}
  write_shards(fdir, meta, list(range(n)), todo, record_fn, desc="drafter features (shards)",
               show_progress=show_progress)
  return fdir


def head_drafter_identity(target, head_params: dict, what: str = "eagle head") -> dict:
  """The drafter record of a head's ranker (and its features): what `EagleProposer` attaches a
  ranker to, the target's config with the head's LM-head rows (for a full-vocabulary head
  trained with the target's head frozen these are the target's rows, so the ranker serves the
  head with lm_head 'own' or 'target' alike)."""
  dc = dataclasses.replace(target.config, tie_word_embeddings=False)
  return {"source": f"{what} for " + Path(target.source).name,
          **drafter_identity({"lm_head": head_params["lm_head"]}, dc)}


# --- training ----------------------------------------------------------------------------------

def ranker_loss(ranker, h, batch, *, loss: str, block: int, label: str = "target"):
  low = jnp.einsum("XD,RD->XR", h, ranker["down"], preferred_element_type=jnp.float32)
  if loss == "kl":
    return vocab_cross_entropy(low, ranker["vocab"], None, batch.get("weight"),
                               teacher_ids=batch["top_ids"], teacher_probs=batch["top_p"],
                               block=block)
  labels = batch["draft_argmax" if label == "drafter" else "label"]
  return vocab_cross_entropy(low, ranker["vocab"], labels, batch.get("weight"), block=block)


def materialize(params: dict, U: jax.Array | None = None) -> dict:
  """The ranker {"down", "vocab"} of trained parameters: a tied ranker {"down", "proj"} has
  W_vocab = U P (U the drafter's LM head [V, D], P [D, R]); a free one is returned as is."""
  if "proj" not in params:
    return params
  return {"down": params["down"],
          "vocab": jnp.einsum("VD,DR->VR", U, params["proj"], preferred_element_type=jnp.float32)}


def recall(ranker, rows: dict, ks) -> dict:
  """recall@k of the target's label and of the drafter's own argmax among the top-k scores."""
  low = jnp.asarray(rows["hidden"]) @ jnp.asarray(ranker["down"]).T
  out = {}
  for name in ("label", "draft_argmax"):
    r = np.asarray(label_ranks(low, jnp.asarray(ranker["vocab"]), jnp.asarray(rows[name])))
    for k in ks:
      out[f"recall@{k}_{'target' if name == 'label' else 'drafter'}"] = float(np.mean(r < k))
  return out


def _init_ranker(job, U):
  """The starting ranker for the drafter's LM head U [V, D]: random, or its SVD (`svd_ranker`)."""
  V, D = U.shape
  if job.init == "random":
    rs = np.random.RandomState(job.seed)
    if job.vocab == "tied":
      return {"down": jnp.asarray(rs.randn(job.rank, D) / np.sqrt(D), jnp.float32),
              "proj": jnp.asarray(rs.randn(D, job.rank) / np.sqrt(D), jnp.float32)}
    return {"down": jnp.asarray(rs.randn(job.rank, D) / np.sqrt(D), jnp.float32),
            "vocab": jnp.asarray(rs.randn(V, job.rank) / np.sqrt(job.rank), jnp.float32)}
  r = svd_of_head(U, job.rank)
  if job.vocab == "tied":  # U Q_r: the SVD ranker exactly (down = Q_r^T, P = Q_r)
    return {"down": jnp.asarray(r.down), "proj": jnp.asarray(np.ascontiguousarray(r.down.T))}
  return {"down": jnp.asarray(r.down), "vocab": jnp.asarray(r.vocab)}


def _frozen_step(job):
  @jax.jit  # the head U and the optimizer's numbers are arguments, not constants of the program
  def step(state, batch, U, hyper):
    loss, grads = jax.value_and_grad(
        lambda p: ranker_loss(materialize(p, U), batch["hidden"], batch, loss=job.loss,
                              block=job.vocab_block, label=job.label))(state.params)
    return apply_grads(state, grads, optimizer_of(hyper)), loss
  return step


def _joint_step(job, config):
  @jax.jit
  def step(state, batch, hyper):
    def total(p):
      B, T = batch["tokens"].shape
      h = sequence_hidden(p["drafter"], batch["tokens"], config=config).reshape(B * T, -1)
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
    return apply_grads(state, grads, optimizer_of(hyper)), loss
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
  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  if job.eagle_head:
    draft = load_model(job.drafter, dtype="float32", progress=show_progress)
    hc, head = load_head(job, draft)
    fdir = build_head_features(job, draft, (hc, head), show_progress=show_progress)
    identity = head_drafter_identity(draft, head)
    U = head["lm_head"]  # [V, D]: the head's LM head (the target's rows, full V)
  elif job.dflash_drafter:
    draft = load_model(job.drafter, dtype="float32", progress=show_progress)
    U = lm_head_weight(draft.params, draft.config)  # the target's head it drafts through
    fdir = build_dflash_features(job, draft, load_dflash_drafter(job, draft),
                                 show_progress=show_progress)
    identity = head_drafter_identity(draft, {"lm_head": U}, "dflash drafter")
  else:
    fdir = build_features(job.feature_spec, show_progress=show_progress)
    draft = load_model(job.drafter, dtype="float32", progress=show_progress)
    identity = model_identity(draft)
    U = lm_head_weight(draft.params, draft.config)
  feats = load_features(fdir)
  if feats.meta["drafter"]["fingerprint"] != identity["fingerprint"]:
    raise TrainError(f"features in {fdir} were made with another drafter")
  V, D = U.shape
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

  optim = OptimConfig(lr=job.lr, warmup_steps=job.warmup_steps, total_steps=job.steps,
                      weight_decay=job.weight_decay, clip_norm=job.clip_norm)
  hyper = optim.array()  # the step's argument: jobs differing only there share a program
  ranker0 = _init_ranker(job, U)
  params = ranker0 if job.mode == "frozen" else {"drafter": draft.params, "ranker": ranker0}
  run = TrainRun(out, job.train_fingerprint(), steps=job.steps, eval_every=job.eval_every,
                 checkpoint_every=job.checkpoint_every, what="train.ranker",
                 job=dataclasses.asdict(job))
  state = run.restore(TrainState.create(params, make_optimizer(optim)))
  start = run.start

  def ranker_of(p):
    return materialize(p, U) if job.mode == "frozen" else p["ranker"]

  held_j = {k: jnp.asarray(v) for k, v in held.items()}

  @jax.jit
  def held_loss(ranker):
    return ranker_loss(ranker, held_j["hidden"], held_j, loss=job.loss, block=job.vocab_block,
                       label=job.label)

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

  def evaluate(st, step):
    r = ranker_of(st.params)
    return {"heldout_loss": float(held_loss(r)), **recall(r, held, job.recall_k)}

  def keep_best(st, row):
    nonlocal best_row
    if job.mode == "frozen" and job.select_by and better(row, best_row):
      r = ranker_of(st.params)
      Ranker(np.asarray(r["down"]), np.asarray(r["vocab"]), drafter=identity,
             meta={"job": job.train_fingerprint(), "row": row}).save(best_path)
      best_row = row

  if job.mode == "frozen":
    frozen_step = _frozen_step(job)
    U_arg = jnp.asarray(U)

    def train_fn(st, batch):
      return frozen_step(st, batch, U_arg, hyper)
    cols = {k: jnp.asarray(v) for k, v in feats.rows(train_mask).items()}
    n = len(train_idx)

    def batch_at(step):
      sel = jnp.asarray(step_rng(job.seed, step).randint(0, n, job.batch_tokens))
      return {k: v[sel] for k, v in cols.items()}
  else:
    joint_step = _joint_step(job, draft.config)

    def train_fn(st, batch):
      return joint_step(st, batch, hyper)
    held_set = set(held_recs.tolist())
    rec_ids = [i for i, (r, _, _) in enumerate(feats.seqs) if r not in held_set]
    label_rows: dict = {}
    for row, r in enumerate(feats.record):
      label_rows.setdefault(int(r), []).append(row)

    def batch_at(step):
      return {k: jnp.asarray(v) for k, v in _joint_batch(feats, rec_ids,
                                                         step_rng(job.seed, step), job,
                                                         label_rows).items()}

  def step_fn(st, step):
    st, loss = train_fn(st, batch_at(step))
    return st, {"loss": loss}

  res = run.fit(state, step_fn, evaluate, on_row=keep_best, stop_after=stop_after,
                desc=f"ranker d'={job.rank} ({job.mode})", show_progress=show_progress)
  state, rows, end = res.state, res.rows, res.end
  run.plot(["train_loss", "heldout_loss", f"recall@{max(job.recall_k)}_target",
            f"recall@{min(job.recall_k)}_target"], f"ranker d'={job.rank} ({job.mode}, {job.loss})")
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
                 "label": job.label, "vocab": job.vocab,
                 "steps": job.steps, "select_by": job.select_by, "exported_step":
                 chosen["step"], "final": chosen}).save(out / "ranker.safetensors")
    if job.mode == "joint":
      _save_drafter(state.params["drafter"], draft, out / "drafter")
  atomic_write_json(out / "recall.json", summary)
  return summary


def _tuned_identity(params, draft) -> dict:
  return {"source": "joint-tuned " + Path(draft.source).name,
          **drafter_identity(params, draft.config)}


def _save_drafter(params, draft, path: Path) -> None:
  """The jointly tuned drafter as safetensors + config beside the original's tokenizer."""
  save_hf(params, draft.config, path, source=draft.source)


# --- command line ------------------------------------------------------------------------------

def _features_only(p):
  p.add_argument("--features-only", action="store_true", help="build the features and stop")

  def before(a, job):
    if a.features_only:
      print(build_head_features(job, show_progress=not a.quiet) if job.eagle_head
            else build_dflash_features(job, show_progress=not a.quiet) if job.dflash_drafter
            else build_features(job.feature_spec, show_progress=not a.quiet))
      return 0
    return None
  return before


def main(argv=None) -> int:
  return run_job_cli(argv, prog="python -m vocabjax.train.ranker", doc=__doc__,
                     configs="configs/train/ranker_*.yaml", what="ranker",
                     job_from_dict=job_from_dict, train=train, report=("final", "complete"),
                     extra=_features_only)


if __name__ == "__main__":
  sys.exit(main())
