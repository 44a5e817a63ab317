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

Online mode (`--online`, OmniDraft's fig. 2 setting, `online`): the drafter serves a prompt
stream and learns from it as it goes; each prompt is decoded with the drafter of that moment
(trained only on earlier prompts), so acceptance and speedup are prequential. Output
`online.jsonl` (one row per prompt), `online.png`, `online_summary.json`, and for resuming
`checkpoints/`, `online_side/` (the target side of every completion learned from) and
`online_ngram/` (the n-gram cache after each update). `online_steps: 0` runs the control: the
same stream with the drafter frozen.
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
from vocabjax.train.loop import check_finite_loss
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
  # online mode (`--online`): generate over a prompt stream with the cross-vocabulary decoder
  # and update the drafter after every `online_every` sequences (OmniDraft fig. 2)
  online: tuple = ()  # eval dataset specs, e.g. ({kind: gsm8k, limit: 16},)
  online_every: int = 4
  online_steps: int = 8  # optimizer steps per update, on records drawn from all seen so far;
  # 0: the control (the same stream, the drafter frozen)
  gamma: int = 4
  max_new_tokens: int = 128

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
    if self.online_every < 1 or self.online_steps < 0:
      raise TrainError(f"need online_every >= 1 and online_steps >= 0; got online_every="
                       f"{self.online_every}, online_steps={self.online_steps}")

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

  def online_fingerprint(self) -> str:
    """What an online run's checkpoints depend on (the stream, not `data`)."""
    d = dataclasses.asdict(self)
    for k in ("out", "features", "eval_every", "checkpoint_every", "steps", "data",
              "max_records"):
      d.pop(k)
    return job_fingerprint("distill-online", d)


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
  run = target_side_runner(target)
  todo = [i for i in range(len(records)) if not (fdir / f"rec-{i:05d}.npz").exists()]
  for i in progress(todo, desc="target side", enabled=show_progress):
    save_side(fdir / f"rec-{i:05d}.npz",
              target_side_record(run, target, records[i], where=f"record {i}"))
  return fdir


def save_side(path: Path, z: dict) -> None:
  """One record's target side as an .npz, written atomically."""
  buf = io.BytesIO()
  np.savez(buf, **z)
  atomic_write_bytes(path, buf.getvalue())


def target_side_runner(target):
  return jax.jit(functools.partial(_target_side, config=target.config), static_argnums=(3,))


def target_side_record(run, target, rec: dict, *, where: str) -> dict:
  """The target side of one completion record (`build_target_side`'s file contents)."""
  prompt = target.tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"]
  comp = list(rec["completion_ids"])[:N_MAX]
  seq = prompt + comp
  L, n = len(seq), len(comp)
  if not prompt or not n:
    raise TrainError(f"{where} has an empty prompt or completion")
  nb = bucket(n)
  # room for the whole sequence and for the nb-long slice from the last prompt position
  padded = np.zeros((1, bucket(max(L, len(prompt) - 1 + nb))), np.int32)
  padded[0, :L] = seq
  h, lse, am = run(target.params, jnp.asarray(padded), jnp.int32(len(prompt) - 1), nb)
  return {"hidden": np.asarray(h[:n], np.float16), "lse": np.asarray(lse[:n]),
          "argmax": np.asarray(am[:n], np.int32), "prompt": np.asarray(prompt, np.int32),
          "completion": np.asarray(comp, np.int32)}


def example_of(translator, z: dict, max_tokens: int) -> "Example | None":
  a = align(translator, z["prompt"].tolist(), z["completion"].tolist(), max_tokens)
  return None if a is None else Example(**a, hidden=z["hidden"], lse=z["lse"],
                                        argmax=z["argmax"])


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
  out = read_sides(job.features_dir, n_records, translator, job.max_tokens,
                   remedy="delete it and rerun to recompute it")
  if not out:
    raise TrainError("no training positions in the data (empty completions?)")
  return out


def read_sides(directory: Path, n: int, translator, max_tokens: int, *,
               remedy: str) -> list[Example]:
  """The examples of the saved target sides `rec-00000.npz`.. of `n` records (those with
  something to learn); a missing or corrupt file is a TrainError ending with `remedy`."""
  out = []
  for i in range(n):
    path = directory / f"rec-{i:05d}.npz"
    try:
      z = dict(np.load(path))
    except (OSError, ValueError, EOFError) as e:
      raise TrainError(f"target-side file {path} is missing or corrupt ({e}); {remedy}") from None
    ex = example_of(translator, z, max_tokens)
    if ex is not None:
      out.append(ex)
  return out


def batch_sizes(examples, floor: tuple = (0, 0, 0, 0)) -> tuple[int, int, int, int]:
  """(Ld, Kd, Kn, Nr) padded sizes covering `examples` (and at least `floor`): drafter tokens
  rounded up to 128, the position lists to powers of two. One size for a whole data set means
  one compiled training step (each new shape would recompile the drafter's backward)."""
  Ld = max([len(e.tokens) for e in examples] + [1])
  sizes = (-(-Ld // 128) * 128, bucket(max(len(e.dm_pos) for e in examples)),
           bucket(max(len(e.ng_pos) for e in examples)),
           bucket(max(len(e.hidden) for e in examples)))
  return tuple(max(a, b) for a, b in zip(sizes, floor))


def make_batch(ex: Example, sizes: tuple[int, int, int, int]) -> dict:
  """One record padded to `sizes` (`batch_sizes`); masks mark the real entries."""
  def pad(x, n, fill=0):
    y = np.full((n,) + x.shape[1:], fill, x.dtype)
    y[:len(x)] = x
    return y
  Ld, Kd, Kn, Nr = sizes
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

class Distiller:
  """The trainable drafter (full or LoRA) [+ acceptance head], its optimizer and jitted steps;
  shared by the offline `train` and the `online` loop."""

  def __init__(self, job: DistillJob, target, draft, translator):
    import optax

    from vocabjax.decoding.adaptive import init_acceptance_head
    from vocabjax.train.lora import init_lora, merge
    from vocabjax.vocab.ranked import drafter_identity

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
    opt_d = make_optimizer(OptimConfig(lr=job.lr, warmup_steps=job.warmup_steps,
                                       total_steps=job.steps, weight_decay=job.weight_decay,
                                       clip_norm=job.clip_norm))
    opt_h = make_optimizer(OptimConfig(lr=job.head_lr, warmup_steps=0, total_steps=job.steps,
                                       weight_decay=0.0, clip_norm=job.clip_norm))
    self.opt = optax.multi_transform(
        {"drafter": opt_d, "head": opt_h},
        lambda params: {k: jax.tree.map(lambda _, k=k: k, v) for k, v in params.items()})
    self.state = TrainState.create(trainable, self.opt)
    self.base_arg = self.base if job.lora_rank else None
    parts = ("drafter", "head") if job.acceptance == "interleaved" else ("both",)
    self._steps = {p: jax.jit(functools.partial(self._step, part=p), donate_argnums=(0,))
                   for p in parts}
    self._eval = jax.jit(self._eval_fn)
    self._merge = merge

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
           "agree": _masked_mean(hit.astype(jnp.float32), batch["dm_mask"])}
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

  def _step(self, st, batch, frozen, base, *, part):
    import optax

    (loss, aux), grads = jax.value_and_grad(self.loss_fn, has_aux=True)(
        st.params, batch, frozen, base, part)
    updates, opt_state = self.opt.update(grads, st.opt_state, st.params)
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
                                      self.base_arg)
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
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.vocab.translate import Translator

  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  records = read_records(job.data, job.max_records)
  target, draft = models or (_load(job.target, "target"), _load(job.drafter, "drafter"))
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
  dist = Distiller(job, target, draft, tr)
  dist.fit_sizes(examples)
  del target  # only its LM head (in the distiller) is needed from here on

  ckpt = Checkpoints(out / "checkpoints", job.train_fingerprint(), every=job.checkpoint_every)
  dist.state = ckpt.restore_or(dist.state)
  start = int(dist.state.step)
  log_path = out / "log.jsonl"
  rows = read_log(log_path, upto_step=start)
  if log_path.exists():
    log_path.write_text("".join(json.dumps(r) + "\n" for r in rows))

  def evaluate(step, train_row):
    row = {"step": step, **{f"train_{k}": v for k, v in train_row.items()},
           **{f"held_{k}": v for k, v in dist.evaluate(held_ex or train_ex[-4:]).items()}}
    append_log(log_path, row)
    rows.append(row)

  if start == 0 and not rows:
    evaluate(0, {})
  rng = np.random.default_rng(job.seed)  # the order depends on the seed alone: resumable
  order = np.concatenate([rng.permutation(len(train_ex)) for _ in
                          range(job.steps // max(len(train_ex), 1) + 1)])
  t1 = time.perf_counter()
  bar = progress(range(start, job.steps), total=job.steps, initial=start, desc="distill",
                 enabled=show_progress)
  ran = 0
  for step in bar:
    m = dist.step(train_ex[order[step]])
    check_finite_loss(float(m["loss"]), step + 1, "train.distill", ckpt)
    bar.set_postfix_str(f"loss {m['loss']:.3f}")
    ran += 1
    last_one = step + 1 == job.steps or (stop_after is not None and ran >= stop_after)
    ckpt.save(step + 1, dist.state, force=last_one)
    if (step + 1) % job.eval_every == 0 or step + 1 == job.steps:
      evaluate(step + 1, m)
    if last_one:
      break
  ckpt.close()
  train_s = time.perf_counter() - t1
  plot_curves(rows, [k for k in ("held_l_dm", "held_l_ngram", "held_agree", "held_acc_head")
                     if any(k in r for r in rows)], out / "curves.png",
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


def online(job: DistillJob, *, show_progress: bool = True, models=None,
           stop_after: int | None = None) -> dict:
  """Online hybrid distillation over `job.online`'s prompts (module doc): each prompt is
  generated by the cross-vocabulary decoder with the current drafter and by plain decoding
  (speedup in the same run; outputs must match), then kept; after every `online_every` prompts
  the target side of the new completions is computed and `online_steps` updates run on records
  drawn from all seen so far. The learning-rate schedule spans the whole stream
  (`steps` = updates x `online_steps`, whatever the config says). Writes `online.jsonl` (one
  row per prompt), `online.png` (acceptance rate, tau and speedup over the stream) and
  `online_summary.json`.

  Resumable: each update saves the drafter's training state (`checkpoints/`) and the target
  side of the completions it learned from (`online_side/`) and the decoder's n-gram cache
  (`online_ngram/`); a rerun restores the last update and goes on with the next prompt
  (prompts decoded after it are decoded again). `online_steps: 0` is the control: the same
  stream with the drafter frozen (nothing trained or saved but the rows).
  `stop_after`: stop after this many prompts of this run (tests)."""
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding.autoregressive import Decoder
  from vocabjax.decoding.crossvocab import CrossVocabDecoder
  from vocabjax.decoding.speculative import block_layout
  from vocabjax.eval.config import DatasetSpec
  from vocabjax.eval.datasets import load_prompts
  from vocabjax.generate import encode_prompts
  from vocabjax.vocab.translate import Translator

  if not job.online:
    raise TrainError("online mode needs `online`: the prompt stream (eval dataset specs)")
  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  prompts = load_prompts([DatasetSpec(**{k: tuple(v) if isinstance(v, list) else v
                                         for k, v in d.items()}) for d in job.online])
  n_updates = len(prompts) // job.online_every
  if n_updates == 0:
    raise TrainError(f"the online stream has {len(prompts)} prompts, fewer than "
                     f"online_every={job.online_every}: no update would run")
  learn = job.online_steps > 0  # else the control: nothing trains
  if learn:
    job = dataclasses.replace(job, steps=n_updates * job.online_steps)
  target, draft = models or (_load(job.target, "target"), _load(job.drafter, "drafter"))
  tr = Translator(target.tokenizer, draft.tokenizer, target_vocab=target.config.vocab_size,
                  draft_vocab=draft.config.vocab_size)
  ids = encode_prompts(target.tokenizer, [p.text for p in prompts], True)
  done = 0  # updates already made
  if learn:
    dist = Distiller(job, target, draft, tr)
    ckpt = Checkpoints(out / "checkpoints", job.online_fingerprint(), every=1, keep=1)
    dist.state = ckpt.restore_or(dist.state)
    done = int(dist.state.step) // job.online_steps
  start = done * job.online_every  # the first prompt after the last update
  side_dir = out / "online_side"  # the target side of every completion learned from
  ngram_dir = out / "online_ngram"  # the n-gram cache after each update
  if learn:
    side_dir.mkdir(exist_ok=True)
    ngram_dir.mkdir(exist_ok=True)
  seen = read_sides(side_dir, start, tr, job.max_tokens,
                    remedy=f"resuming after update {done} needs it; delete {out} to start the "
                           f"stream over")
  dec = CrossVocabDecoder(target.in_layout(block_layout()), target.config, dist.drafter_params()
                          if done else draft.params, draft.config,
                          target_tokenizer=target.tokenizer, draft_tokenizer=draft.tokenizer,
                          gamma=job.gamma, vocab_map=tr.vm)
  ar = Decoder(target.params, target.config)
  run = target_side_runner(target)
  kw = dict(max_new_tokens=job.max_new_tokens, eos_token_ids=target.eos_token_ids)
  for d in (dec, ar):  # compile outside the timings
    d.generate([ids[0]], **{**kw, "max_new_tokens": 8})
  dec.reset_ngram()  # forget what the warm-up taught it
  if done:
    ngram_path = ngram_dir / f"update-{done:04d}.json"
    try:
      dec.load_ngram(json.loads(ngram_path.read_text())["entries"])
    except (OSError, ValueError, KeyError) as e:
      raise TrainError(f"resuming after update {done} needs {ngram_path}, which is missing or "
                       f"corrupt ({e}); delete {out} to start the stream over") from None
  log_path = out / "online.jsonl"
  rows = [r for r in read_log(log_path) if r["seq"] < start]
  log_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  new, updates, ran = [], done, 0
  for k in progress(range(start, len(prompts)), total=len(prompts), initial=start,
                    desc="online", enabled=show_progress):
    r = dec.generate([ids[k]], **kw)
    a = ar.generate([ids[k]], **kw)
    st = r.stats
    row = {"seq": k, "qid": prompts[k].qid, "updates": updates,
           "acceptance_rate": st.acceptance_rate, "tau": st.tau,
           "ngram_per_step": st.ngram_hits_per_step, "tokens_per_s": r.tokens_per_s,
           "ar_tokens_per_s": a.tokens_per_s, "speedup": r.tokens_per_s / a.tokens_per_s,
           "identical": r.tokens == a.tokens, "tokens": r.num_generated,
           "ngram_entries": len(dec.ngram.entries)}
    new.append((k, {"prompt": target.tokenizer.decode(ids[k]), "completion_ids": r.tokens[0]}))
    if learn and (k + 1) % job.online_every == 0:
      t0 = time.perf_counter()
      for i, rec in new:
        z = target_side_record(run, target, rec, where=prompts[i].qid)
        save_side(side_dir / f"rec-{i:05d}.npz", z)
        ex = example_of(tr, z, job.max_tokens)
        if ex is not None:
          seen.append(ex)
      new = []
      # the records of update u depend on (seed, u) alone: a resumed stream draws the same
      rng = np.random.default_rng([job.seed, updates])
      losses = [dist.step(seen[rng.integers(len(seen))]) for _ in range(job.online_steps)]
      for m in losses:
        check_finite_loss(float(m["loss"]), int(dist.state.step), "train.distill online",
                          ckpt)
      atomic_write_json(ngram_dir / f"update-{updates + 1:04d}.json",
                        {"entries": dec.ngram_entries()})
      ckpt.save(int(dist.state.step), dist.state, force=True)
      dec.set_drafter(dist.drafter_params(), head=None)
      updates += 1
      row.update(update_s=time.perf_counter() - t0,
                 train_loss=float(np.mean([m["loss"] for m in losses])))
    append_log(log_path, row)
    rows.append(row)
    ran += 1
    if stop_after is not None and ran >= stop_after:
      break
  if learn:
    ckpt.close()
  plot_curves([{"step": r["seq"], **r} for r in rows], ["acceptance_rate", "tau", "speedup"],
              out / "online.png",
              f"online distillation {Path(job.drafter).name} -> {Path(job.target).name} "
              f"(update every {job.online_every} sequences)")
  half = len(rows) // 2
  mean = lambda rs, k: float(np.mean([r[k] for r in rs])) if rs else None  # noqa: E731
  keys = ("acceptance_rate", "tau", "speedup")
  summary = {"job": dataclasses.asdict(job), "sequences": len(rows), "updates": updates,
             "complete": len(rows) == len(prompts),
             "identical": sum(r["identical"] for r in rows),
             "first_half": {k: mean(rows[:half], k) for k in keys},
             "second_half": {k: mean(rows[half:], k) for k in keys}}
  atomic_write_json(out / "online_summary.json", summary)
  return summary


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
  raw = job_fields({"data": (), **raw}, DistillJob, ("target", "drafter", "out"), where=where)
  if raw.get("online"):
    raw["online"] = tuple(raw["online"])
  return DistillJob(**raw)


def _load(source: str, what: str):
  """`load_model`, with a missing or unreadable model as a TrainError naming it."""
  from vocabjax.checkpoints.loader import load_model

  try:
    return load_model(source)
  except Exception as e:  # noqa: BLE001 -- any loader failure (missing, truncated, corrupt)
    raise TrainError(f"cannot load the {what} {source!r}: {type(e).__name__}: {e}") from e


def main(argv=None) -> int:
  p = job_argparser("python -m vocabjax.train.distill", __doc__, "configs/distill_*.yaml")
  p.add_argument("--online", action="store_true",
                 help="online mode: generate over the config's `online` prompts, update the "
                      "drafter every `online_every` sequences, write online.jsonl/png")
  args = p.parse_args(argv)
  try:
    raw = read_job_yaml(args.config, "distillation", {"out": args.out, "steps": args.steps})
    job = job_from_dict(raw, where=str(args.config))
    if args.online:
      summary = online(job, show_progress=not args.quiet)
      print(json.dumps({k: summary[k] for k in ("sequences", "updates", "identical",
                                                 "first_half", "second_half")}, indent=1))
      return 0
    summary = train(job, show_progress=not args.quiet, stop_after=args.stop_after)
  except TrainError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps({k: summary[k] for k in ("step", "complete", "last")}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
