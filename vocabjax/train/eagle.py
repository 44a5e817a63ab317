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
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.calibrate.counts import Counts
from vocabjax.checkpoints.eagle3 import head_target_ids, load_eagle3, save_eagle3
from vocabjax.checkpoints.loader import load_model
from vocabjax.io import atomic_write_json
from vocabjax.kernels import cpu_matmul
from vocabjax.lowering import Lowering, with_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import (EagleConfig, default_feature_layers, eagle_forward,
                                   fuse_features, init_eagle)
from vocabjax.models.llamalike import forward_features, lm_head, lm_head_weight, rms_norm
from vocabjax.train.features import (files_key, forward_len, heldout_records, job_fingerprint,
                                     model_identity, pending_shards, read_records, read_shards,
                                     write_shards)
from vocabjax.train.loop import (OptimConfig, TrainError, TrainRun, TrainState, apply_grads,
                                 check_settings, job_fields, make_optimizer, optimizer_of,
                                 run_job_cli, step_rng, train_fingerprint)
from vocabjax.train.losses import (blocked_probs_cross_entropy, soft_cross_entropy,
                                   teacher_prob_blocks, vocab_cross_entropy)
from vocabjax.vocab.subset import VocabSubset
from vocabjax.checkpoints.torch_model import load_torch_model


# soft labels: the teacher's probabilities at every slot of a batch are computed once and held
# (f32, [B, T + J, Vd]) when they take at most this many bytes (~0.6 GB for 4 x 260 slots of the
# 1.5B target's 151,936 tokens); past it each depth recomputes them block by block (3x the products)
TEACHER_PROBS_BYTES = 2 << 30


@dataclasses.dataclass(frozen=True)
class EagleJob:
  target: str  # registry name or path of the target
  data: tuple[str, ...]  # completion jsonl files
  out: str  # output directory
  # feature shards directory (default <out>/features), or one directory per data file (a
  # list as long as `data`: each file's features are built and kept apart, so a job over
  # several files reuses the features another job built for one of them)
  features: str | tuple[str, ...] | None = None
  feature_layers: tuple[int, ...] | None = None  # default: (1, L/2 - 1, L - 4)
  feature_backend: str = "jax"  # "jax" (vocabjax's forward) or "torch" (transformers')
  feature_dtype: str = "float32"  # the torch backend's model dtype (float32 | bfloat16)
  final_hidden: bool = False  # also store the final normed hidden state (Medusa heads train on it)
  draft_vocab_size: int | None = 32768  # None: the full V
  vocab_subset: str | None = None  # a VocabSubset file instead of counting labels
  vocab_counts: tuple[str, ...] = ()  # calibration counts (.npz) counted beside the labels
  train_lm_head: bool = True
  intermediate_size: int | None = None  # the head's MLP width (default: the target's)
  ttt_steps: int = 4  # J (EAGLE-3 trains 7)
  step_decay: float = 0.8
  seq_len: int = 512  # window T
  batch_size: int = 2
  steps: int = 1000
  lr: float = 3e-4
  warmup_steps: int = 50
  weight_decay: float = 0.0
  clip_norm: float = 0.5
  heldout: float = 0.1
  heldout_split: str = "last"  # "last" prompts or a "random" sample of them (seed)
  eval_every: int = 100
  checkpoint_every: int = 100
  select_by: str | None = "heldout_loss"  # None: export the last step
  seed: int = 0
  vocab_block: int = 16384
  max_records: int | None = None
  train_fraction: float = 1.0  # train on a fraction of the training records (ablations)
  train_subset: str = "first"  # which fraction: the "first" records or a "random" (seed) sample
  pack: bool = False  # fill each window with several records' windows (`make_packed_batch`)
  init_head: str | None = None  # an exported head to start from (fine-tuning; module doc)
  compute_dtype: str = "float32"  # "bfloat16": mixed precision (`Lowering.bf16_dots`)
  prompt_labels: bool = False  # also train on the prompt's positions (module doc)
  soft_labels: bool = False  # the target's distribution as the label (needs final_hidden)

  def __post_init__(self):
    check_settings(self)
    if not self.data:
      raise TrainError("no data files given")
    if isinstance(self.features, list):  # YAML gives lists; a str stays a str (fingerprints)
      object.__setattr__(self, "features", tuple(self.features))
    if isinstance(self.features, tuple):
      if len(self.features) != len(self.data):
        raise TrainError(f"features lists {len(self.features)} directories for "
                         f"{len(self.data)} data files: give one per file, or one directory")
      if self.max_records is not None:
        raise TrainError(f"max_records={self.max_records} needs one features directory (it "
                         f"counts records over all data files)")
      if len({str(Path(f).resolve()) for f in self.features}) != len(self.features):
        raise TrainError(f"features={list(self.features)} names a directory twice")
    if not 0 < self.train_fraction <= 1:
      raise TrainError(f"train_fraction={self.train_fraction} must be in (0, 1]")
    if self.ttt_steps < 1:
      raise TrainError(f"ttt_steps={self.ttt_steps} must be >= 1")
    if self.seq_len < 2 or self.batch_size < 1:
      raise TrainError(f"need seq_len >= 2 and batch_size >= 1, got seq_len={self.seq_len}, "
                       f"batch_size={self.batch_size}")
    if not 0 < self.heldout < 1:
      raise TrainError(f"heldout={self.heldout} must be in (0, 1)")
    if self.train_subset not in ("first", "random"):
      raise TrainError(f"train_subset={self.train_subset!r} is not 'first' or 'random'")
    if self.heldout_split not in ("last", "random"):
      raise TrainError(f"heldout_split={self.heldout_split!r} is not 'last' or 'random'")
    if self.vocab_subset and self.draft_vocab_size is not None:
      raise TrainError("give either vocab_subset or draft_vocab_size, not both")
    if self.init_head and Path(self.init_head).resolve() == (Path(self.out) / "head").resolve():
      raise TrainError(f"init_head={self.init_head!r} is where this job exports its own head: "
                       f"copy it elsewhere or use another out")
    if self.init_head and (self.vocab_subset or self.vocab_counts):
      raise TrainError(f"init_head={self.init_head!r} keeps that head's vocabulary: drop "
                       f"vocab_subset and vocab_counts")
    if self.feature_backend not in ("jax", "torch"):
      raise TrainError(f"feature_backend={self.feature_backend!r} is not 'jax' or 'torch'")
    if self.feature_backend == "jax" and self.feature_dtype != "float32":
      raise TrainError(f"feature_dtype={self.feature_dtype!r} needs feature_backend: torch (the "
                       f"jax backend computes features with the target as loaded, f32)")
    if self.feature_dtype not in ("float32", "bfloat16"):
      raise TrainError(f"feature_dtype={self.feature_dtype!r} is not float32 or bfloat16")
    if self.compute_dtype not in ("float32", "bfloat16"):
      raise TrainError(f"compute_dtype={self.compute_dtype!r} is not float32 or bfloat16")
    if self.soft_labels and not self.final_hidden:
      raise TrainError("soft_labels: true needs final_hidden: true (the target's distribution "
                       "is computed from its final hidden states, stored with the features)")
    if self.select_by not in (None, "heldout_loss", "acc_0"):
      raise TrainError(f"select_by={self.select_by!r} is not 'heldout_loss', 'acc_0' or null")
    self.optim  # validated before any features are built

  @property
  def optim(self) -> OptimConfig:
    return OptimConfig(lr=self.lr, warmup_steps=self.warmup_steps, total_steps=self.steps,
                       weight_decay=self.weight_decay, clip_norm=self.clip_norm)

  @property
  def features_dir(self) -> Path:
    if isinstance(self.features, tuple):
      raise TrainError(f"this job keeps its features in {len(self.features)} directories, one "
                       f"per data file: read them with feature_parts")
    return Path(self.features) if self.features else Path(self.out) / "features"

  @property
  def feature_parts(self) -> list[tuple[Path, tuple[str, ...]]]:
    """(directory, data files) of each features directory: one for all files, or one each."""
    if isinstance(self.features, tuple):
      return [(Path(f), (d,)) for f, d in zip(self.features, self.data)]
    return [(self.features_dir, self.data)]

  @property
  def feature_location(self) -> Path | list[Path]:
    """What `load_eagle_features` reads for this job: its directory, or the list of them."""
    dirs = [d for d, _ in self.feature_parts]
    return dirs if isinstance(self.features, tuple) else dirs[0]

  def feature_fingerprint(self, layers, data=None) -> str:
    """The features of `data` (default: all the job's files) as this job computes them: a
    one-file directory of a per-file job is the features of a job over that file alone."""
    extra = (() if self.feature_backend == "jax"  # the defaults: the fingerprint as before
             else (self.feature_backend, self.feature_dtype)) + (
                 ("final_hidden",) if self.final_hidden else ())
    return job_fingerprint("eagle", self.target, files_key(self.data if data is None else data),
                           list(layers), self.max_records, *extra)

  def train_fingerprint(self) -> str:
    # init_head: the head's file and its export record (another head at the same path is
    # another job), so a resumed fine-tuning run starts from the head it started from
    replace = {"init_head": head_identity(self.init_head)} if self.init_head else None
    return train_fingerprint(self, replace=replace,
                             new_defaults={"train_fraction": 1.0, "pack": False,
                                           "init_head": None, "heldout_split": "last",
                                           "train_subset": "first",
                                           "compute_dtype": "float32",
                                           "prompt_labels": False, "soft_labels": False})


def head_identity(directory) -> list:
  """What a training fingerprint remembers of an `init_head`: its weights file (path, size)
  and the record its exporter wrote (the job and the step it was exported at)."""
  directory = Path(directory)
  cfg, weights = directory / "config.json", directory / "model.safetensors"
  for f in (cfg, weights):
    if not f.is_file():
      raise TrainError(f"init_head={str(directory)!r}: {f} does not exist (not an exported "
                       f"EAGLE-3 head directory)")
  try:
    rec = json.loads(cfg.read_text()).get("vocabjax", {})
  except json.JSONDecodeError as e:
    raise TrainError(f"init_head={str(directory)!r}: {cfg} is not JSON ({e})") from None
  return files_key([weights]) + [{k: rec.get(k) for k in ("job", "row")}]


# --- features ----------------------------------------------------------------------------------

def _target_features(params, tokens, *, config, layers):
  """(fused features [1, T, Lf*Dt], teacher-forced argmax [1, T], final normed hidden [1, T, Dt])
  of one padded sequence."""
  B, T = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  # a throwaway cache: linear (no sliding layers' ring, `models.cache`), as only T is written
  cache = KVCache.init(config, B, T, ring_slack=T)
  h, _, feats = forward_features(params, tokens, pos, cache, config=config, layers=layers,
                                 fresh=True)
  return (feats.astype(jnp.float16), jnp.argmax(lm_head(params, h, config=config), -1),
          h.astype(jnp.float16))


def _torch_features(job: EagleJob, target, layers):
  """The torch backend: the same checkpoint through transformers (`feature_dtype`; bf16 runs
  on oneDNN's AVX512-BF16 kernels, about twice vocabjax's f32 prefill on a 2-core CPU), its
  `output_hidden_states` (entry i + 1 is the residual stream after layer i, as
  `forward_features` returns) and its argmax. One sequence per call, unpadded."""
  import torch

  if job.feature_dtype == "bfloat16" and not cpu_matmul.has_native_bf16():
    print("[vocabjax.train] warning: feature_dtype bfloat16 on a CPU without AVX512-BF16 or "
          "AMX: transformers' bf16 matmuls are far slower than its f32 ones here; "
          "feature_dtype: float32 (or feature_backend: jax) computes the features faster",
          file=sys.stderr)
  if max(layers) >= target.config.num_layers - 1:
    raise TrainError(f"feature_backend: torch reads transformers' hidden states, whose last "
                     f"entry is normed: layers {list(layers)} must stay below the last layer "
                     f"{target.config.num_layers - 1}")
  model = load_torch_model(job.target, job.feature_dtype)
  if model.config.vocab_size != target.config.vocab_size:
    raise TrainError(f"transformers' {job.target} has V={model.config.vocab_size}, vocabjax's "
                     f"V={target.config.vocab_size}")

  def run_seq(toks):
    with torch.inference_mode():
      out = model(input_ids=torch.tensor([toks]), output_hidden_states=True)
      feats = torch.cat([out.hidden_states[i + 1][0] for i in layers], -1)
      return (feats.to(torch.float16).numpy(),
              out.logits[0].argmax(-1).to(torch.int32).numpy(),
              out.hidden_states[-1][0].to(torch.float16).numpy())  # normed, as lm_head reads

  return run_seq


def build_eagle_features(job: EagleJob, target, layers, *, show_progress=True
                         ) -> Path | list[Path]:
  """Target features and labels of every record (module doc); resumes, refuses others'.
  Returns the features directory, or the list of them of a job with one per data file
  (`EagleJob.feature_parts`); `load_eagle_features` reads either."""
  for fdir, files in job.feature_parts:
    _build_part(job, target, layers, fdir, files, show_progress=show_progress)
  return job.feature_location


def _build_part(job: EagleJob, target, layers, fdir: Path, files, *, show_progress) -> None:
  fdir.mkdir(parents=True, exist_ok=True)
  records = read_records(files, job.max_records, vocab_size=target.config.vocab_size)
  fingerprint = job.feature_fingerprint(layers, files)
  todo = pending_shards(fdir, fingerprint, len(records))
  if not todo:
    return
  tok = target.tokenizer
  if tok is None:
    raise TrainError(f"{target.source} has no tokenizer: the prompts cannot be encoded")
  if job.feature_backend == "torch":
    run_seq = _torch_features(job, target, layers)
  else:
    run = jax.jit(lambda p, t: _target_features(p, t, config=target.config, layers=layers))

    def run_seq(toks):
      padded = np.zeros((1, forward_len(len(toks))), np.int32)
      padded[0, :len(toks)] = toks
      feats, label, h = run(target.params, jnp.asarray(padded))
      n = len(toks)
      return np.asarray(feats[0, :n]), np.asarray(label[0, :n], np.int32), np.asarray(h[0, :n])
  V = target.config.vocab_size

  def record_fn(rec):
    prompt = tok(rec["prompt"], add_special_tokens=False)["input_ids"]
    comp = rec["completion_ids"]
    if not prompt or not comp:
      return None
    toks = prompt + comp
    if max(toks) >= V:
      raise TrainError(f"a completion holds token id {max(toks)} >= the target's V={V}: the "
                       f"data was made with another tokenizer")
    feats, label, hidden = run_seq(toks)
    return {"feats": feats, "label": label, "tokens": np.asarray(toks, np.int32),
            "first_row": len(prompt) - 1, **({"hidden": hidden} if job.final_hidden else {})}

  meta = {"fingerprint": fingerprint, "kind": "eagle",
          "target": model_identity(target), "feature_layers": list(layers),
          "feature_backend": job.feature_backend, "feature_dtype": job.feature_dtype,
          "final_hidden": job.final_hidden,
          "data": [str(p) for p in files]}
  write_shards(fdir, meta, records, todo, record_fn, desc="target features (shards)",
               show_progress=show_progress)


@dataclasses.dataclass
class EagleData:
  seqs: list  # (record, tokens [L], first_row)
  feats: list  # per record [L, Lf*Dt] float16
  labels: list  # per record [L] int32 target argmax
  meta: dict
  hidden: list | None = None  # per record [L, Dt] float16 final normed hidden (`final_hidden`)


def load_eagle_features(fdir: Path | list[Path], target=None, layers=None, *,
                        hidden: bool = False) -> EagleData:
  """The shards of `fdir`, or of several directories (one per data file, in the data's order:
  their records are numbered on, as `read_records` numbers the files' records); with
  `target`/`layers`, TrainError when they were made by another target (identity and LM-head
  fingerprint) or from other layers. `hidden`: also the final hidden states (TrainError when
  the shards were built without `final_hidden`)."""
  if isinstance(fdir, (list, tuple)):
    parts = [load_eagle_features(d, target, layers, hidden=hidden) for d in fdir]
    if len({json.dumps(p.meta["target"], sort_keys=True) for p in parts}) > 1 or len(
        {tuple(p.meta["feature_layers"]) for p in parts}) > 1:
      raise TrainError(f"the features in {[str(d) for d in fdir]} were made by different "
                       f"targets or from different layers")
    seqs, offset = [], 0
    for p in parts:
      seqs += [(r + offset, toks, first) for r, toks, first in p.seqs]
      offset += p.meta["records"]
    meta = {**parts[0].meta, "data": [f for p in parts for f in p.meta["data"]],
            "records": offset, "seconds": sum(p.meta.get("seconds") or 0 for p in parts),
            "new_rows": sum(p.meta.get("new_rows") or 0 for p in parts),
            "directories": [str(d) for d in fdir]}
    return EagleData(seqs, [f for p in parts for f in p.feats],
                     [lab for p in parts for lab in p.labels], meta,
                     [h for p in parts for h in p.hidden] if hidden else None)
  cat, seqs, meta = read_shards(fdir, ("feats", "label") + (("hidden",) if hidden else ()))
  if hidden and "hidden" not in cat:
    raise TrainError(f"the features in {fdir} hold no final hidden states: build them with "
                     f"final_hidden: true")
  if meta.get("kind") != "eagle":
    raise TrainError(f"{fdir} holds {meta.get('kind') or 'ranker'} features, not EAGLE ones")
  if target is not None:
    want, got = meta["target"], model_identity(target)
    for key in ("hidden_size", "vocab_size", "num_layers", "fingerprint"):
      if want.get(key) != got[key]:
        raise TrainError(f"features in {fdir} were made by another target ({key}="
                         f"{want.get(key)} there, {got[key]} for {got['source']})")
  if layers is not None and list(layers) != meta["feature_layers"]:
    raise TrainError(f"features in {fdir} fuse layers {meta['feature_layers']}, the job "
                     f"wants {list(layers)}")
  feats, labels, hid = [], [], []
  off = 0
  for _, toks, _ in seqs:
    feats.append(cat["feats"][off:off + len(toks)])
    labels.append(cat["label"][off:off + len(toks)])
    if hidden:
      hid.append(cat["hidden"][off:off + len(toks)])
    off += len(toks)
  return EagleData(seqs, feats, labels, meta, hid if hidden else None)


def record_sources(paths, max_records=None) -> list[str]:
  """Per record (in `read_records` order) its source group: the part of a `source` field
  before the first "/" (`train.corpus`: gsm8k, stdlib, target_generated, ...), else the data
  file's directory name."""
  out = []
  for p in paths:
    for line in Path(p).read_text().splitlines():
      if line.strip():
        src = json.loads(line).get("source")
        out.append(src.split("/")[0] if src else Path(p).parent.name)
  return out[:max_records] if max_records else out


# --- the head and its vocabulary ---------------------------------------------------------------

def head_config(target: LlamaLikeConfig, layers, draft_vocab_size: int,
                intermediate_size: int | None = None) -> EagleConfig:
  """A one-layer llama head of the target's width, heads and RoPE (EAGLE-3's choice). A Gemma 3
  target's head is a llama layer too: SwiGLU, plain RMSNorm, global attention with the
  target's global RoPE (its local layers' window and base are the target's own business)."""
  layer = dataclasses.replace(target, arch="llama", num_layers=1, attention_bias=False,
                              qk_norm=False, tie_word_embeddings=False,
                              intermediate_size=intermediate_size or target.intermediate_size,
                              hidden_act="silu", norm_unit_offset=False, sandwich_norms=False,
                              scale_embeddings=False, query_pre_attn_scalar=None,
                              sliding_window=None, layer_types=None, rope_local_theta=None)
  return EagleConfig(layer=layer, target_hidden_size=target.hidden_size,
                     feature_layers=tuple(layers), draft_vocab_size=draft_vocab_size)


def choose_vocab(job: EagleJob, data: EagleData, train_recs: set, V: int) -> np.ndarray:
  """Ascending target ids of the head's vocabulary (module doc)."""
  if job.vocab_subset:
    sub = VocabSubset.load(job.vocab_subset)
    if sub.vocab_size != V:
      raise TrainError(f"{job.vocab_subset} is a subset of a V={sub.vocab_size} vocabulary, "
                       f"the target has V={V}")
    return np.asarray(sub.ids, np.int64)
  if job.draft_vocab_size is None:
    return np.arange(V)
  K = job.draft_vocab_size
  if not 1 <= K <= V:
    raise TrainError(f"draft_vocab_size={K} must be in [1, V={V}]")
  counts = np.zeros(V, np.int64)
  for (rec, _, first), lab in zip(data.seqs, data.labels):
    if rec in train_recs:
      np.add.at(counts, lab[first:], 1)
  if not counts.any():
    raise TrainError("no training labels to count the head's vocabulary from")
  freq = counts / counts.sum()
  for path in job.vocab_counts:  # each source weighs as one frequency distribution
    c = Counts.load(path, vocab_size=V).counts
    if not c.any():
      raise TrainError(f"{path} counts no tokens (empty calibration set?)")
    freq = freq + c / c.sum()
  order = np.lexsort((np.arange(V), -freq))  # most frequent first, ties by id
  return np.sort(order[:K])


def starting_head(job: EagleJob, target, layers) -> dict | None:
  """The params of `job.init_head` (None without one), checked against the target (its shapes
  and LM-head fingerprint) and against the job: same feature layers, MLP width and vocabulary
  size (TrainError naming both values)."""
  if not job.init_head:
    return None
  tc = target.config
  try:
    hc, params, _ = load_eagle3(job.init_head, target_config=tc, target_params=target.params)
  except (ValueError, OSError) as e:  # CheckpointError is a ValueError
    raise TrainError(f"init_head={job.init_head!r}: {e}") from None
  Vd = job.draft_vocab_size if job.draft_vocab_size is not None else tc.vocab_size
  width = job.intermediate_size or tc.intermediate_size
  for what, head, want in (("feature_layers", list(hc.feature_layers), list(layers)),
                           ("draft_vocab_size", hc.draft_vocab_size, Vd),
                           ("intermediate_size", hc.layer.intermediate_size, width)):
    if head != want:
      raise TrainError(f"init_head={job.init_head!r} has {what}={head}, this job {want}: set "
                       f"the job's {what} to the head's")
  return params


def target_to_head(ids, V: int) -> np.ndarray:
  """[V] head-vocabulary id of each target id (-1 outside the head's vocabulary `ids`)."""
  t2d = np.full(V, -1, np.int32)
  t2d[np.asarray(ids)] = np.arange(len(ids))
  return t2d


# --- the loss ----------------------------------------------------------------------------------

def ttt_masks(n: int, steps: int):
  """Per step j: (block mask [E, E] among its own new entries, prefix mask [E, S] over the
  cache's earlier slots); step j' entries occupy slots j' n .. j' n + n - 1 (S = steps n)."""
  i = np.arange(n)
  out = []
  for j in range(steps):
    block = np.tril(np.ones((n, n), bool)) if j == 0 else np.eye(n, dtype=bool)
    prefix = np.zeros((n, steps * n), bool)
    if j:
      prefix[:, :n] = i[None, :] <= i[:, None]
      for jp in range(1, j):
        prefix[i, jp * n + i] = True
    out.append((jnp.asarray(block)[None], jnp.asarray(prefix)[None]))
  return out


def ttt_outputs(params, embed, batch, *, config: EagleConfig, steps: int):
  """The head's normed outputs per step: list of [B, E, D], and the label/weight [B, E] each
  predicts (module doc). batch: tokens [B, T], feats [B, T, Lf*Dt], dlabel [B, T] head-vocab ids
  (-1: none), weight [B, T]."""
  tokens, w, dl = batch["tokens"], batch["weight"], batch["dlabel"]
  B, T = tokens.shape
  n = T - 1
  c = config.layer
  h = fuse_features(params, batch["feats"][:, :n].astype(embed.dtype))
  cache = KVCache(k=jnp.zeros((1, B, steps * n, c.num_kv_heads, c.head_dim), embed.dtype),
                  v=jnp.zeros((1, B, steps * n, c.num_kv_heads, c.head_dim), embed.dtype),
                  lengths=jnp.zeros((B,), jnp.int32))
  pad = lambda x: jnp.pad(x, ((0, 0), (0, steps)))  # noqa: E731
  tok_p, w_p, dl_p = pad(tokens), pad(w), jnp.pad(dl, ((0, 0), (0, steps)), constant_values=-1)
  seg = batch.get("segment")  # packed windows (`make_packed_batch`)
  if seg is None:
    base = jnp.broadcast_to(jnp.arange(n), (B, n))
  else:
    # a query sees only its own segment's positions, starts RoPE at its segment's window start,
    # and a label past its segment's end (the next segment's token) counts nothing
    base = batch["position"][:, :n]
    same = seg[:, :n, None] == seg[:, None, :n]  # [B, n, n]
    same_all = jnp.tile(same, (1, 1, steps))  # [B, n, steps n]: every step's slots of a query
    seg_p = jnp.pad(seg, ((0, 0), (0, steps)), constant_values=-1)
  outs = []
  for j, (block, prefix) in enumerate(ttt_masks(n, steps)):
    sl = slice(1 + j, 1 + j + n)
    if seg is not None:
      block, prefix = block & same, prefix & same_all
    x, cache = eagle_forward(params, embed, tok_p[:, sl], h, base + j,
                             cache.with_lengths(jnp.full((B,), j * n, jnp.int32)), block,
                             config=config, prefix_mask=prefix)
    label = dl_p[:, sl]
    weight = w_p[:, sl] * (label >= 0)
    if seg is not None:
      weight = weight * (seg_p[:, sl] == seg[:, :n])
    outs.append((rms_norm(x, params["final_norm"], c.rms_norm_eps), label, weight))
    h = x
  return outs


def ttt_loss(trainable, frozen, batch, *, config: EagleConfig, steps: int, decay: float,
             block: int, teacher=None, lowering: Lowering = Lowering()):
  """sum_j decay^j CE_j (module doc); returns (loss, per-step CE [steps]). `teacher` [Vd, Dt]:
  the target's LM-head rows of the head's vocabulary; then each CE_j is against the target's
  distribution from batch["hidden"] [B, T, Dt] at the label's slot (`soft_labels`).
  `lowering`: `Lowering(bf16_dots=True)` for mixed precision (every product, losses included)."""
  params = with_lowering({**frozen, **trainable}, lowering)
  bf16 = lowering.bf16_dots
  ces = []
  shared = None
  if teacher is not None:
    hid = batch["hidden"]
    hid = jnp.pad(hid, ((0, 0), (0, steps), (0, 0))).astype(jnp.float32)
    B, Tp, Dt = hid.shape
    V = teacher.shape[0]
    if B * Tp * V * 4 <= TEACHER_PROBS_BYTES:
      # the target's distribution at every slot once (one product), shared by the depths'
      # slices: each depth then costs 3 products of its outputs with the head, not 9
      shared = teacher_prob_blocks(hid.reshape(B * Tp, Dt), teacher, block=block, bf16=bf16)
      shared = shared.reshape(shared.shape[0], B, Tp, shared.shape[-1])
  for j, (hn, label, weight) in enumerate(ttt_outputs(params, frozen["embed"], batch,
                                                      config=config, steps=steps)):
    B, n, D = hn.shape  # step j's labels sit at slots 1 + j .. n + j, as in ttt_outputs
    x, w = hn.reshape(-1, D), weight.reshape(-1)
    if teacher is None:
      ces.append(vocab_cross_entropy(x, params["lm_head"], jnp.maximum(label, 0).reshape(-1),
                                     w, block=block, bf16=bf16))
    elif shared is not None:
      pb = shared[:, :, 1 + j:1 + j + n].reshape(shared.shape[0], B * n, -1)
      ces.append(blocked_probs_cross_entropy(x, params["lm_head"], pb, w, bf16=bf16))
    else:  # too large to hold: one [X, block] tile of the teacher at a time, per depth
      h = hid[:, 1 + j:1 + j + n].reshape(B * n, -1)
      ces.append(soft_cross_entropy(x, params["lm_head"], h, teacher, w, block=block,
                                    bf16=bf16))
  ces = jnp.stack(ces)
  return jnp.sum(ces * decay ** jnp.arange(steps)), ces


# --- batches -----------------------------------------------------------------------------------

def make_batch(data: EagleData, idx, rs, job: EagleJob, t2d: np.ndarray, *, window_start=None,
               prompt: bool = False, hidden: bool = False):
  """B windows of <= seq_len tokens from records `idx` (random ones, a random window start
  unless given: one for all or a list, one per record); weight 1 where the label predicts a
  completion token (`prompt`: any token of the window); `hidden`: also the target's final
  hidden states [B, T, Dt] (`soft_labels`)."""
  B, T = len(idx), job.seq_len
  out = _empty_batch(data, B, T, hidden)
  for b, r in enumerate(idx):
    L = len(data.seqs[r][1])
    if window_start is not None:
      s = window_start[b] if isinstance(window_start, (list, tuple)) else window_start
    else:
      s = rs.randint(0, max(1, L - T + 1))  # any window of the record (completions included)
    put_window(out, data, t2d, b, 0, r, s, min(L, s + T) - s, prompt=prompt)
  return out


def _empty_batch(data: EagleData, B: int, T: int, hidden: bool) -> dict:
  F = data.feats[0].shape[1]
  out = {"tokens": np.zeros((B, T), np.int32), "feats": np.zeros((B, T, F), np.float16),
         "dlabel": np.full((B, T), -1, np.int32), "weight": np.zeros((B, T), np.float32)}
  if hidden:
    if data.hidden is None:
      raise TrainError("soft labels need the target's final hidden states: load the features "
                       "with hidden=True")
    out["hidden"] = np.zeros((B, T, data.hidden[0].shape[1]), np.float16)
  return out


def put_window(out: dict, data: EagleData, t2d: np.ndarray, b: int, o: int, r: int, s: int,
               m: int, *, prompt: bool = False) -> None:
  """Write record r's tokens s .. s + m - 1 into row b of a batch at slots o .. o + m - 1:
  tokens, features, head-vocabulary labels, weight 1 where the label predicts a completion
  token (`prompt`: every slot, the prompt's positions too; `EagleJob.prompt_labels`)."""
  _, toks, first = data.seqs[r]
  sl = slice(o, o + m)
  out["tokens"][b, sl] = toks[s:s + m]
  out["feats"][b, sl] = data.feats[r][s:s + m]
  out["dlabel"][b, sl] = t2d[data.labels[r][s:s + m]]
  if "hidden" in out:
    out["hidden"][b, sl] = data.hidden[r][s:s + m]
  out["weight"][b, o + (0 if prompt else max(first, s) - s):o + m] = 1.0


PACK_MIN = 32  # a packed row takes no window shorter than this (the rest stays padding)


def make_packed_batch(data: EagleData, train_idx, rs, job: EagleJob, t2d: np.ndarray):
  """B rows of seq_len slots, each filled with windows of random training records one after
  another (a whole record where it fits, else a random window of the room left) until fewer
  than PACK_MIN slots remain; `segment` [B, T] numbers a row's windows (-1: padding) and
  `position` [B, T] counts from each window's start, so `ttt_outputs` keeps windows apart. With
  one window per row it is `make_batch`'s batch. The mix's records have a median of 222 tokens,
  so unpacked 256-token windows carry ~127 label positions on average; packed ones ~2x that."""
  B, T = job.batch_size, job.seq_len
  out = {**_empty_batch(data, B, T, job.soft_labels),
         "segment": np.full((B, T), -1, np.int32), "position": np.zeros((B, T), np.int32)}
  for b in range(B):
    o, k = 0, 0
    while T - o >= min(PACK_MIN, T) or k == 0:
      r = train_idx[rs.randint(0, len(train_idx))]
      L = len(data.seqs[r][1])
      m = min(L, T - o)
      s = rs.randint(0, L - m + 1)
      put_window(out, data, t2d, b, o, r, s, m, prompt=job.prompt_labels)
      out["segment"][b, o:o + m] = k
      out["position"][b, o:o + m] = np.arange(m)
      o, k = o + m, k + 1
  return out


# --- evaluation --------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("config", "steps"))
def _heldout_sums(trainable, frozen, batch, *, config, steps):
  """Per TTT step: summed held-out cross-entropy, hits and label weight of one batch (one
  program per head config and steps, shared by every run of the process)."""
  p = {**frozen, **trainable}
  rows = []
  for hn, label, weight in ttt_outputs(p, frozen["embed"], batch, config=config, steps=steps):
    logits = jnp.einsum("BND,VD->BNV", hn, p["lm_head"], preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, -1)
    own = jnp.take_along_axis(logits, jnp.maximum(label, 0)[..., None], -1)[..., 0]
    hit = (jnp.argmax(logits, -1) == label)
    rows.append(jnp.stack([jnp.sum((lse - own) * weight), jnp.sum(hit * weight),
                           jnp.sum(weight)]))
  return jnp.stack(rows)


@functools.partial(jax.jit, static_argnames=("config", "steps", "decay", "block", "lowering"))
def _train_step(st, batch, embed, teacher, hyper, *, config, steps, decay, block, lowering):
  """One optimizer step of the TTT loss. Module level, its settings static: every run of the
  process with the same head config and settings shares its traced and compiled program (the
  embedding, the teacher's rows and the optimizer's numbers are arguments, never constants)."""
  (loss, ces), grads = jax.value_and_grad(
      lambda p: ttt_loss(p, {"embed": embed, **st.aux}, batch, config=config, steps=steps,
                         decay=decay, block=block, teacher=teacher, lowering=lowering),
      has_aux=True)(st.params)
  return apply_grads(st, grads, optimizer_of(hyper)), loss


def evaluate_heldout(params, frozen, data: EagleData, held_idx, job: EagleJob, t2d, config,
                     fn_cache: dict, *, all_windows: bool = False) -> dict:
  """Held-out per-step loss and top-1 accuracy (whole records, windows of seq_len, batch_size
  windows per call). Windows that end inside the prompt hold no scored label and are skipped
  (the chat-task records' long passages are most of their tokens); `all_windows`: score them
  too, the same figures slower (a test compares)."""
  if "fn" not in fn_cache:
    fn_cache["fn"] = functools.partial(_heldout_sums, config=config, steps=job.ttt_steps)
  tot = np.zeros((job.ttt_steps, 3))
  skipped = total = 0
  windows = []
  for r in held_idx:
    _, toks, first = data.seqs[r]
    lab = data.labels[r][first:]
    total += len(lab)
    skipped += int(np.sum(t2d[lab] < 0))
    # windows of seq_len tokens that share one position, so each label is scored once at
    # step 0 (deeper steps lose the j positions past a window's end)
    windows += [(r, s) for s in range(0, max(1, len(toks) - 1), job.seq_len - 1)
                if all_windows or s + job.seq_len > first]  # else every slot is < first
  # batch_size windows per call (one program: the last batch is padded with weightless rows)
  B = job.batch_size
  for i in range(0, len(windows), B):
    part = windows[i:i + B]
    b = make_batch(data, [r for r, _ in part], None, job, t2d,
                   window_start=[s for _, s in part])
    if len(part) < B:
      b = {k: np.concatenate([v, np.zeros((B - len(part),) + v.shape[1:], v.dtype)])
           for k, v in b.items()}
      b["dlabel"][len(part):] = -1
    tot += np.asarray(fn_cache["fn"](params, frozen, {k: jnp.asarray(v) for k, v in b.items()}))
  n = np.maximum(tot[:, 2], 1)
  ce = tot[:, 0] / n
  out = {"heldout_loss": float(np.sum(ce * job.step_decay ** np.arange(job.ttt_steps)))}
  for j in range(job.ttt_steps):
    out[f"ce_{j}"] = float(ce[j])
    out[f"acc_{j}"] = float(tot[j, 1] / n[j])
  out["labels_outside_vocab"] = skipped / max(total, 1)
  return out


# --- training ----------------------------------------------------------------------------------

def train(job: EagleJob, *, show_progress: bool = True, stop_after: int | None = None) -> dict:
  """Build features if needed, train (resuming from checkpoints), export; returns the summary."""
  out = Path(job.out)
  out.mkdir(parents=True, exist_ok=True)
  target = load_model(job.target, dtype="float32", progress=show_progress)
  tc = target.config
  layers = tuple(job.feature_layers or default_feature_layers(tc.num_layers))
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

  train_fn = functools.partial(_train_step, config=hc, steps=job.ttt_steps,
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
