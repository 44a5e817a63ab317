"""EAGLE-3 training data (`vocabjax.train.eagle`): the target's fused features and
teacher-forced labels per position, built once into shards and read back (`build_eagle_features`,
`load_eagle_features`), and the training windows cut from them (`make_batch`,
`make_packed_batch`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
import sys

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.torch_model import load_torch_model
from vocabjax.kernels import cpu_matmul
from vocabjax.models.cache import KVCache
from vocabjax.models.llamalike import forward_features, lm_head
from vocabjax.train.eagle_job import EagleJob
from vocabjax.train.features import (forward_len, model_identity, pending_shards, read_records,
                                     read_shards, write_shards)
from vocabjax.train.loop import TrainError

# --- features ----------------------------------------------------------------------------------

def target_features(params, tokens, *, config, layers):
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
    run = jax.jit(lambda p, t: target_features(p, t, config=target.config, layers=layers))

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
