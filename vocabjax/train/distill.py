"""`python -m vocabjax.train.distill --config configs/distill_*.yaml`: hybrid distillation of a
cross-vocabulary drafter (OmniDraft section 3.3), full fine-tuning or LoRA, and the SpecDec++
acceptance head (adaptive draft length).

Letters: Ld drafter sequence, Kd direct-mapped positions, Kn n-gram sub-token positions,
I vocabulary intersection, Dd / Dt drafter / target hidden sizes.

Data: target completions (`prompt` text + `completion_ids`, the jsonl of
`python -m vocabjax.calibrate count --generate`, or what an online run generated). The drafter
reads the prompt retokenized as a whole and each completion token by its reverse translation
(`vocabjax.vocab.translate.Translator`): the same context it has when drafting. Completion
token i of the target is then
  * direct-mapped (the drafter spells it with one shared token): the drafter's distribution at
    the position before it, restricted to the intersection and renormalized (q_I), is pulled
    towards the target's restricted the same way (p_I) by the reverse KL
    L_DM = KL(q_I || p_I) (mode-seeking: the drafter concentrates where the target is sure);
  * an n-gram token (the drafter spells it with k >= 2 tokens): L_ngram = NLL of the drafter's
    k sub-tokens (the n-gram cache can only merge what the drafter proposes in that order).
  L = L_DM + lambda * L_ngram (lambda = 0.2 in OmniDraft; 0 gives the "+ L_DM" row).
The target's side is computed once per record (`features/`, resumable): its final hidden
states at the completion positions (the intersection logits are recomputed from them with its
LM head's intersection rows, so no 150K-wide distribution is stored), the log-normalizer of its
full softmax there, and its argmax.

Acceptance head (SpecDec++, `acceptance: joint | interleaved`): at each direct-mapped position
the drafter's greedy proposal x (argmax of q_I); label y = min(1, p(x) / q_I(x)) (`acceptance_
label: ratio`, the acceptance probability of speculative sampling, p the target's full softmax)
or 1[x is the target's argmax] (`greedy`, what greedy verification accepts); weighted BCE
-[y log a + w (1 - y) log(1 - a)] with w = `rejection_weight`. `joint`: one loss
L + mu * L_acc, gradients into the drafter too; `interleaved`: alternate steps, the head's with
the drafter frozen.

LoRA (`lora_rank: 32`): adapters on every attention and MLP projection
(`vocabjax.train.lora`), the base frozen; otherwise every drafter weight trains.

Output `out/`: `checkpoints/` (orbax, resumable: rerun the command), `log.jsonl`,
`curves.png`, and `drafter/` (`distill.json`, `drafter.safetensors` = the LoRA adapter or the
full params, `head.safetensors` when an acceptance head was trained), read by
`load_distilled` and the eval method `crossvocab` (`drafter: out/drafter`).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.decoding.autoregressive import bucket
from vocabjax.checkpoints.zoo import atomic_write_bytes
from vocabjax.generate import atomic_write_json
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.train.features import (files_key, job_fingerprint, read_records,
                                     sequence_hidden)
from vocabjax.train.loop import (Checkpoints, OptimConfig, TrainError, TrainState,
                                 append_log, job_argparser, job_fields, make_optimizer,
                                 plot_curves, progress, read_job_yaml, read_log)


@dataclasses.dataclass(frozen=True)
class DistillJob:
  target: str  # registry name, HF dir or .gguf
  drafter: str
  data: tuple[str, ...]  # completion jsonl files
  out: str
  features: str | None = None  # target-side cache (default: out/features)
  lam: float = 0.2  # lambda of L_ngram
  lora_rank: int = 0  # 0: full fine-tuning
  lora_alpha: float = 32.0
  acceptance: str = "none"  # none | joint | interleaved
  acceptance_label: str = "ratio"  # ratio: min(1, p/q); greedy: 1[x == target argmax]
  rejection_weight: float = 3.0
  acceptance_mu: float = 1.0  # weight of L_acc in the joint loss
  head_width: int = 256
  steps: int = 100
  lr: float = 5e-5
  head_lr: float = 1e-3
  warmup_steps: int = 10
  clip_norm: float = 1.0
  weight_decay: float = 0.0
  max_records: int | None = None
  max_tokens: int = 512  # drafter tokens per sequence (longer prompts keep their end)
  heldout: float = 0.1  # last fraction of records, for the held-out figures
  eval_every: int = 25
  checkpoint_every: int = 25
  seed: int = 0

  def __post_init__(self):
    if self.acceptance not in ("none", "joint", "interleaved"):
      raise TrainError(f"acceptance={self.acceptance!r} must be none, joint or interleaved")
    if self.acceptance_label not in ("ratio", "greedy"):
      raise TrainError(f"acceptance_label={self.acceptance_label!r} must be ratio or greedy")
    if self.lam < 0 or self.lora_rank < 0 or self.steps < 1:
      raise TrainError(f"need lam >= 0, lora_rank >= 0, steps >= 1; got lam={self.lam}, "
                       f"lora_rank={self.lora_rank}, steps={self.steps}")
    if not 0 <= self.heldout < 1:
      raise TrainError(f"heldout={self.heldout} must be in [0, 1)")

  @property
  def features_dir(self) -> Path:
    return Path(self.features or Path(self.out) / "features")

  def feature_fingerprint(self) -> str:
    return job_fingerprint("distill-features", self.target, self.drafter,
                           files_key(self.data), self.max_records, self.max_tokens)

  def train_fingerprint(self) -> str:
    d = dataclasses.asdict(self)
    for k in ("out", "features", "eval_every", "checkpoint_every", "steps"):
      d.pop(k)
    return job_fingerprint(self.feature_fingerprint(), d)


# --- data ----------------------------------------------------------------------------------------

def align(translator, prompt_ids, completion_ids, max_tokens: int) -> dict | None:
  """The drafter's view of one record (module doc): tokens, and per completion token its kind.

  Returns {"tokens" [Ld] drafter ids, "dm_pos"/"dm_row" (drafter position predicting a direct
  token, its completion index), "ng_pos"/"ng_label" (sub-token positions and labels)}; None
  when nothing is left to learn from."""
  d_prompt = translator.prompt_to_drafter(prompt_ids)
  toks = list(d_prompt)
  dm_pos, dm_row, ng_pos, ng_label = [], [], [], []
  for i, t in enumerate(completion_ids):
    ids = translator.to_drafter([t])
    start = len(toks)
    if len(ids) == 1 and translator.t2d[int(t)] >= 0:
      dm_pos.append(start - 1)
      dm_row.append(i)
    else:
      ng_pos += list(range(start - 1, start - 1 + len(ids)))
      ng_label += list(ids)
    toks += ids
  cut = max(0, len(toks) - max_tokens)  # keep the end: drop prompt tokens first
  if cut > len(d_prompt) - 1:
    raise TrainError(f"a completion needs {len(toks) - len(d_prompt)} drafter tokens, more "
                     f"than max_tokens={max_tokens}; raise max_tokens")
  shift = lambda xs: np.asarray([x - cut for x in xs], np.int32)  # noqa: E731
  out = {"tokens": np.asarray(toks[cut:], np.int32), "dm_pos": shift(dm_pos),
         "dm_row": np.asarray(dm_row, np.int32), "ng_pos": shift(ng_pos),
         "ng_label": np.asarray(ng_label, np.int32)}
  return out if len(dm_pos) + len(ng_pos) else None


def _target_side(params, tokens, first, n, *, config):
  """Final hidden [n, Dt] at positions first..first+n-1, the full-softmax log-normalizer [n]
  and argmax [n] there."""
  h = sequence_hidden(params, tokens, config=config)[0]
  h = jax.lax.dynamic_slice_in_dim(h, first, n, axis=0)
  logits = h @ lm_head_weight(params, config).T.astype(h.dtype)
  return h, jax.nn.logsumexp(logits.astype(jnp.float32), -1), jnp.argmax(logits, -1)


def build_target_side(job: DistillJob, target, records, *, show_progress=True) -> Path:
  """Per record `rec-NNNNN.npz` (target hidden f16, lse, argmax); existing files are kept, so
  an interrupted build resumes; refused when made by another job."""
  fdir = job.features_dir
  fdir.mkdir(parents=True, exist_ok=True)
  meta_path = fdir / "meta.json"
  fp = job.feature_fingerprint()
  if meta_path.exists() and json.loads(meta_path.read_text()).get("fingerprint") != fp:
    raise TrainError(f"{fdir} holds target features of another job (other target, drafter or "
                     f"data); use another 'features' directory")
  atomic_write_json(meta_path, {"fingerprint": fp, "target": job.target, "records": len(records)})
  run = jax.jit(functools.partial(_target_side, config=target.config), static_argnums=(3,))
  tok = target.tokenizer

  todo = [i for i in range(len(records)) if not (fdir / f"rec-{i:05d}.npz").exists()]
  for i in progress(todo, desc="target side", enabled=show_progress):
    r = records[i]
    prompt = tok(r["prompt"], add_special_tokens=False)["input_ids"]
    comp = r["completion_ids"][:N_MAX]
    seq = prompt + comp
    L, n = len(seq), len(comp)
    if not prompt or not n:
      raise TrainError(f"record {i} has an empty prompt or completion")
    nb = bucket(n)
    padded = np.zeros((1, bucket(len(prompt) - 1 + nb)), np.int32)
    padded[0, :L] = seq
    h, lse, am = run(target.params, jnp.asarray(padded), jnp.int32(len(prompt) - 1), nb)
    buf = io.BytesIO()
    np.savez(buf, hidden=np.asarray(h[:n], np.float16), lse=np.asarray(lse[:n]),
             argmax=np.asarray(am[:n], np.int32), prompt=np.asarray(prompt, np.int32),
             completion=np.asarray(comp, np.int32))
    atomic_write_bytes(fdir / f"rec-{i:05d}.npz", buf.getvalue())
  return fdir


N_MAX = 256  # completion tokens per record used (the eval suites generate 128)


@dataclasses.dataclass
class Example:
  tokens: np.ndarray
  dm_pos: np.ndarray
  dm_row: np.ndarray
  ng_pos: np.ndarray
  ng_label: np.ndarray
  hidden: np.ndarray  # [n, Dt] f16 target hidden at the completion positions
  lse: np.ndarray
  argmax: np.ndarray


def load_examples(job: DistillJob, translator, n_records: int) -> list[Example]:
  out = []
  for i in range(n_records):
    path = job.features_dir / f"rec-{i:05d}.npz"
    try:
      z = dict(np.load(path))
    except (OSError, ValueError, EOFError) as e:
      raise TrainError(f"target-side file {path} is missing or corrupt ({e}); delete it and "
                       f"rerun to recompute it") from None
    a = align(translator, z["prompt"].tolist(), z["completion"].tolist(), job.max_tokens)
    if a is not None:
      out.append(Example(**a, hidden=z["hidden"], lse=z["lse"], argmax=z["argmax"]))
  if not out:
    raise TrainError("no training positions in the data (empty completions?)")
  return out


def make_batch(ex: Example) -> dict:
  """One record padded to bucketed sizes (few compiled shapes); masks mark the real entries."""
  def pad(x, n, fill=0):
    y = np.full((n,) + x.shape[1:], fill, x.dtype)
    y[:len(x)] = x
    return y
  Ld, Kd, Kn, Nr = (bucket(len(ex.tokens)), bucket(len(ex.dm_pos)), bucket(len(ex.ng_pos)),
                    bucket(len(ex.hidden)))
  return {"tokens": pad(ex.tokens, Ld)[None], "dm_pos": pad(ex.dm_pos, Kd),
          "dm_row": pad(ex.dm_row, Kd), "dm_mask": pad(np.ones(len(ex.dm_pos), bool), Kd),
          "ng_pos": pad(ex.ng_pos, Kn), "ng_label": pad(ex.ng_label, Kn),
          "ng_mask": pad(np.ones(len(ex.ng_pos), bool), Kn),
          "hidden": pad(ex.hidden, Nr).astype(np.float32), "lse": pad(ex.lse, Nr),
          "argmax": pad(ex.argmax, Nr, -1)}


# --- losses --------------------------------------------------------------------------------------

def _masked_mean(x, mask):
  m = mask.astype(jnp.float32)
  return (x * m).sum() / jnp.maximum(m.sum(), 1.0)


def distill_terms(dparams, batch, frozen, *, config: LlamaLikeConfig):
  """(L_DM, L_ngram, drafter hidden at direct positions [Kd, Dd], log q_I [Kd, I],
  log p_I [Kd, I]) of one batch (module doc). `frozen` holds the intersection rows of both LM
  heads: "int_d" / "int_t" [I] the paired ids, "wt_I" [I, Dt] the target's rows."""
  h = sequence_hidden(dparams, batch["tokens"], config=config)[0]  # [Ld, Dd]
  hd = h[batch["dm_pos"]]
  wd_I = lm_head_weight(dparams, config)[frozen["int_d"]]  # the drafter's current head rows
  log_q = jax.nn.log_softmax((hd @ wd_I.T).astype(jnp.float32), -1)
  ht = batch["hidden"][batch["dm_row"]]
  log_p = jax.nn.log_softmax((ht @ frozen["wt_I"].T).astype(jnp.float32), -1)
  rkl = (jnp.exp(log_q) * (log_q - log_p)).sum(-1)
  l_dm = _masked_mean(rkl, batch["dm_mask"])
  hn = h[batch["ng_pos"]]
  logits = (hn @ lm_head_weight(dparams, config).T).astype(jnp.float32)
  nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
      logits, batch["ng_label"][:, None], -1)[:, 0]
  l_ng = _masked_mean(nll, batch["ng_mask"])
  return l_dm, l_ng, hd, log_q, log_p


def acceptance_terms(head, dparams, hd, log_q, batch, frozen, *, label: str, weight: float,
                     config: LlamaLikeConfig):
  """(weighted BCE, accuracy of a > 0.5 against y > 0.5, mean label) at the direct positions."""
  from vocabjax.decoding.adaptive import acceptance_logit

  x = jnp.argmax(log_q, -1)  # the drafter's greedy proposal, as an intersection index
  e = dparams["embed"][frozen["int_d"][x]]
  z = acceptance_logit(head, hd, e)
  ht = batch["hidden"][batch["dm_row"]]
  t = frozen["int_t"][x]
  logit_t = (ht * frozen["wt_full"][t]).sum(-1)
  log_p_x = logit_t - batch["lse"][batch["dm_row"]]
  if label == "ratio":
    y = jnp.minimum(1.0, jnp.exp(log_p_x - jnp.take_along_axis(log_q, x[:, None], -1)[:, 0]))
  else:
    y = (t == batch["argmax"][batch["dm_row"]]).astype(jnp.float32)
  y = jax.lax.stop_gradient(y)
  bce = -(y * jax.nn.log_sigmoid(z) + weight * (1 - y) * jax.nn.log_sigmoid(-z))
  m = batch["dm_mask"]
  acc = _masked_mean(((z > 0) == (y > 0.5)).astype(jnp.float32), m)
  return _masked_mean(bce, m), acc, _masked_mean(y, m)


# --- training ------------------------------------------------------------------------------------

def train(job: DistillJob, *, show_progress: bool = True, stop_after: int | None = None,
          models=None) -> dict:
  """Build the target side (once), then distill; returns the summary (also summary.json)."""
  import optax

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding.adaptive import init_acceptance_head
  from vocabjax.train.lora import init_lora, merge
  from vocabjax.vocab.translate import Translator

  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  records = read_records(job.data, job.max_records)
  if models is None:
    target = load_model(job.target)
    draft = load_model(job.drafter)
  else:
    target, draft = models
  for m, what in ((target, "target"), (draft, "drafter")):
    if m.tokenizer is None:
      raise TrainError(f"the {what} {m.source} has no tokenizer")
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

  dcfg = draft.config
  int_d, int_t = tr.intersection()
  frozen = {"wt_I": lm_head_weight(target.params, target.config)[int_t],
            "wt_full": lm_head_weight(target.params, target.config),
            "int_d": jnp.asarray(int_d, jnp.int32), "int_t": jnp.asarray(int_t, jnp.int32)}
  base = draft.params
  from vocabjax.vocab.ranked import drafter_identity

  base_identity = drafter_identity(base, dcfg)  # before training donates the buffers
  del target  # only its LM head (in `frozen`) is needed from here on
  key = jax.random.key(job.seed)
  # full fine-tuning trains a copy: the step donates its buffers, the caller keeps its model
  trainable = {"drafter": init_lora(key, base, rank=job.lora_rank) if job.lora_rank
               else jax.tree.map(jnp.copy, base)}
  use_head = job.acceptance != "none"
  if use_head:
    trainable["head"] = init_acceptance_head(jax.random.fold_in(key, 1), dcfg.hidden_size,
                                             job.head_width)
  opt_d = make_optimizer(OptimConfig(lr=job.lr, warmup_steps=job.warmup_steps,
                                     total_steps=job.steps, weight_decay=job.weight_decay,
                                     clip_norm=job.clip_norm))
  opt_h = make_optimizer(OptimConfig(lr=job.head_lr, warmup_steps=0, total_steps=job.steps,
                                     weight_decay=0.0, clip_norm=job.clip_norm))
  opt = optax.multi_transform(
      {"drafter": opt_d, "head": opt_h},
      lambda params: {k: jax.tree.map(lambda _, k=k: k, v) for k, v in params.items()})

  def effective(tr_, base):
    return merge(base, tr_["drafter"], alpha=job.lora_alpha) if job.lora_rank else tr_["drafter"]

  # big arrays (the frozen base, the target's head rows) are arguments, never jit constants
  def loss_fn(tr_, batch, frozen, base, part):
    """part: "both" (joint or no head), "drafter", "head" (interleaved)."""
    dp = effective(tr_, base)
    if part == "head":
      dp = jax.lax.stop_gradient(dp)
    l_dm, l_ng, hd, log_q, _ = distill_terms(dp, batch, frozen, config=dcfg)
    loss = l_dm + job.lam * l_ng
    aux = {"l_dm": l_dm, "l_ngram": l_ng}
    if use_head:
      l_acc, acc, ybar = acceptance_terms(
          tr_["head"], dp, jax.lax.stop_gradient(hd) if part != "both" else hd,
          jax.lax.stop_gradient(log_q), batch, frozen, label=job.acceptance_label,
          weight=job.rejection_weight, config=dcfg)
      aux.update(l_acc=l_acc, acc_head=acc, label_mean=ybar)
      if part == "head":
        loss = l_acc
      elif part == "both":
        loss = loss + job.acceptance_mu * l_acc
    return loss, aux

  def make_step(part):
    def step(st, batch, frozen, base):
      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(st.params, batch, frozen,
                                                                     base, part)
      if part != "both":  # interleaved: only one part moves this step
        keep = "head" if part == "head" else "drafter"
        grads = {k: (g if k == keep else jax.tree.map(jnp.zeros_like, g))
                 for k, g in grads.items()}
        updates, opt_state = opt.update(grads, st.opt_state, st.params)
        updates = {k: (u if k == keep else jax.tree.map(jnp.zeros_like, u))
                   for k, u in updates.items()}
      else:
        updates, opt_state = opt.update(grads, st.opt_state, st.params)
      new = TrainState(step=st.step + 1, params=optax.apply_updates(st.params, updates),
                       opt_state=opt_state, aux=st.aux)
      return new, {"loss": loss, **aux}
    return jax.jit(step, donate_argnums=(0,))

  steps = {p: make_step(p) for p in (("drafter", "head") if job.acceptance == "interleaved"
                                     else ("both",))}
  eval_fn = jax.jit(lambda tr_, b, fz, bs: loss_fn(tr_, b, fz, bs, "both")[1] | _agreement(
      effective(tr_, bs), b, fz, dcfg))
  base_arg = base if job.lora_rank else None

  state = TrainState.create(trainable, opt)
  ckpt = Checkpoints(out / "checkpoints", job.train_fingerprint(), every=job.checkpoint_every)
  state = ckpt.restore_or(state)
  start = int(state.step)
  log_path = out / "log.jsonl"
  rows = read_log(log_path, upto_step=start)
  if log_path.exists():
    log_path.write_text("".join(json.dumps(r) + "\n" for r in rows))

  def evaluate(step, train_row):
    agg: dict = {}
    for ex in held_ex or train_ex[-4:]:
      for k, v in eval_fn(state.params, make_batch(ex), frozen, base_arg).items():
        agg.setdefault(k, []).append(float(v))
    row = {"step": step, **{f"train_{k}": v for k, v in train_row.items()},
           **{f"held_{k}": float(np.mean(v)) for k, v in agg.items()}}
    append_log(log_path, row)
    rows.append(row)
    return row

  if start == 0 and not rows:
    evaluate(0, {})
  rng = np.random.default_rng(job.seed)
  order = np.concatenate([rng.permutation(len(train_ex)) for _ in
                          range(job.steps // max(len(train_ex), 1) + 1)])
  t1 = time.perf_counter()
  bar = progress(range(start, job.steps), total=job.steps, initial=start, desc="distill",
                 enabled=show_progress)
  ran = 0
  for step in bar:
    part = ("drafter" if step % 2 == 0 else "head") if job.acceptance == "interleaved" else "both"
    state, m = steps[part](state, make_batch(train_ex[order[step]]), frozen, base_arg)
    m = {k: float(v) for k, v in m.items()}
    bar.set_postfix_str(f"loss {m['loss']:.3f}")
    ran += 1
    last_one = step + 1 == job.steps or (stop_after is not None and ran >= stop_after)
    ckpt.save(step + 1, state, force=last_one)
    if (step + 1) % job.eval_every == 0 or step + 1 == job.steps:
      evaluate(step + 1, m)
    if last_one:
      break
  ckpt.close()
  train_s = time.perf_counter() - t1
  plot_curves(rows, [k for k in ("held_l_dm", "held_l_ngram", "held_agree", "held_acc_head")
                     if any(k in r for r in rows)], out / "curves.png",
              f"distill {Path(job.drafter).name} -> {Path(job.target).name}")
  done = int(state.step) >= job.steps
  if done:
    export(out / "drafter", state.params, job, base_identity)
  summary = {"job": dataclasses.asdict(job), "records": len(records),
             "train_records": len(train_ex), "heldout_records": len(held_ex),
             "intersection": int(len(int_d)), "target_side_s": round(target_side_s, 1),
             "train_s_this_run": round(train_s, 1), "step": int(state.step), "complete": done,
             "first": rows[0] if rows else None, "last": rows[-1] if rows else None,
             "trainable_params": int(sum(x.size for x in jax.tree.leaves(state.params)))}
  atomic_write_json(out / "summary.json", summary)
  return summary


def _agreement(dp, batch, frozen, config):
  """Share of direct positions where the drafter's greedy proposal over the intersection is
  the target's argmax: what greedy verification accepts there."""
  h = sequence_hidden(dp, batch["tokens"], config=config)[0][batch["dm_pos"]]
  x = jnp.argmax(h @ lm_head_weight(dp, config)[frozen["int_d"]].T, -1)
  hit = frozen["int_t"][x] == batch["argmax"][batch["dm_row"]]
  return {"agree": _masked_mean(hit.astype(jnp.float32), batch["dm_mask"])}


# --- the exported drafter ------------------------------------------------------------------------

def export(directory: Path, trainable, job: DistillJob, base_identity: dict) -> None:
  """`distill.json` + `drafter.safetensors` (LoRA adapter or full params) [+ head]."""
  from safetensors.numpy import save_file

  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  flat = _flatten(trainable["drafter"])
  tmp = directory / "drafter.safetensors.partial"
  save_file({k: np.asarray(v) for k, v in flat.items()}, str(tmp))
  tmp.replace(directory / "drafter.safetensors")
  if "head" in trainable:
    tmp = directory / "head.safetensors.partial"
    save_file({k: np.asarray(v) for k, v in trainable["head"].items()}, str(tmp))
    tmp.replace(directory / "head.safetensors")
  atomic_write_json(directory / "distill.json", {
      "mode": "lora" if job.lora_rank else "full", "lora_rank": job.lora_rank,
      "lora_alpha": job.lora_alpha, "base": base_identity,
      "drafter": job.drafter, "target": job.target, "lam": job.lam,
      "acceptance": job.acceptance, "acceptance_label": job.acceptance_label,
      "steps": job.steps})


def _flatten(tree, prefix=""):
  out = {}
  if isinstance(tree, dict):
    for k, v in tree.items():
      out.update(_flatten(v, f"{prefix}{k}."))
  elif isinstance(tree, (list, tuple)):
    for i, v in enumerate(tree):
      out.update(_flatten(v, f"{prefix}{i}."))
  else:
    out[prefix[:-1]] = tree
  return out


def _unflatten_like(flat: dict, like, prefix=""):
  if isinstance(like, dict):
    return {k: _unflatten_like(flat, v, f"{prefix}{k}.") for k, v in like.items()}
  if isinstance(like, (list, tuple)):
    return [_unflatten_like(flat, v, f"{prefix}{i}.") for i, v in enumerate(like)]
  name = prefix[:-1]
  if name not in flat:
    raise TrainError(f"the distilled drafter lacks tensor {name!r}")
  if tuple(flat[name].shape) != tuple(like.shape):
    raise TrainError(f"tensor {name!r} has shape {tuple(flat[name].shape)}, the drafter "
                     f"needs {tuple(like.shape)}")
  return jnp.asarray(flat[name], like.dtype)


def load_distilled(directory, base_params, base_config: LlamaLikeConfig):
  """(drafter params with the distillation applied, acceptance head or None). Refused when the
  directory was trained on another base drafter."""
  from safetensors import SafetensorError
  from safetensors.numpy import load_file

  from vocabjax.train.lora import init_lora, merge
  from vocabjax.vocab.ranked import drafter_identity

  directory = Path(directory)
  try:
    meta = json.loads((directory / "distill.json").read_text())
    flat = load_file(str(directory / "drafter.safetensors"))
  except (OSError, json.JSONDecodeError, SafetensorError) as e:
    raise TrainError(f"{directory} is not a readable distilled drafter ({e})") from None
  want, got = meta["base"], drafter_identity(base_params, base_config)
  if want != got:
    raise TrainError(f"{directory} was distilled from another drafter ({want}), not this one "
                     f"({got})")
  if meta["mode"] == "lora":
    like = init_lora(jax.random.key(0), base_params, rank=meta["lora_rank"])
    params = merge(base_params, _unflatten_like(flat, like), alpha=meta["lora_alpha"])
  else:
    params = _unflatten_like(flat, base_params)
  head = None
  if (directory / "head.safetensors").exists():
    head = {k: jnp.asarray(v) for k, v in load_file(str(directory / "head.safetensors")).items()}
  return params, head


# --- command line --------------------------------------------------------------------------------

def job_from_dict(raw: dict, *, where: str = "config") -> DistillJob:
  return DistillJob(**job_fields(raw, DistillJob, ("target", "drafter", "data", "out"),
                                 where=where))


def main(argv=None) -> int:
  p = job_argparser("python -m vocabjax.train.distill", __doc__, "configs/distill_*.yaml")
  args = p.parse_args(argv)
  try:
    raw = read_job_yaml(args.config, "distillation", {"out": args.out, "steps": args.steps})
    job = job_from_dict(raw, where=str(args.config))
    summary = train(job, show_progress=not args.quiet, stop_after=args.stop_after)
  except TrainError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps({k: summary[k] for k in ("step", "complete", "last")}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
