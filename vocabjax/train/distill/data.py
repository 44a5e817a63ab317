"""The distillation data: the drafter's view of each target completion (`align`) and the
target side computed once per record (hidden states, log-normalizer, argmax; resumable)."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.decoding.engine import bucket
from vocabjax.io import atomic_write_bytes, atomic_write_json
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.train.distill.job import DistillJob
from vocabjax.train.features import sequence_hidden
from vocabjax.train.loop import TrainError, progress


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
