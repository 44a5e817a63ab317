"""Is a trained DFlash drafter under- or over-fitting, and does it read the target's context?

    python train/dflash/diagnose.py --config configs/train/dflash_qwen15b_chat_16k.yaml \
        [--drafter DIR] [--train-records 60] [--out FILE.json]

Evaluates the exported drafter (default: the job's `out/drafter`) as the trainer's held-out
evaluation does (`train.dflash_step.evaluate_heldout`: tau, per-position accuracy, loss) on
three sets: the held-out records, the first N training records (the same figures on text it
was trained on: close to held-out means underfitting, far above it overfitting), and the
held-out records with the target's context features zeroed (what the drafter gets from the
context at all). Prints and writes one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import yaml

from vocabjax.checkpoints.dflash import load_dflash
from vocabjax.checkpoints.loader import load_model
from vocabjax.io import atomic_write_json
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.train.dflash import job_from_dict
from vocabjax.train.dflash_step import evaluate_heldout, row_map
from vocabjax.train.eagle_data import load_eagle_features
from vocabjax.train.features import heldout_records


def load_run(config_path: str, drafter: str | None):
  """(job, drafter dir, target, drafter config, drafter params, features, held-out record
  indices) of the DFlash training job `config_path` (its exported drafter by default)."""
  job = job_from_dict(yaml.safe_load(Path(config_path).read_text()))
  drafter = Path(drafter or Path(job.out) / "drafter")
  target = load_model(job.target, dtype="float32", progress=False)
  config, params = load_dflash(drafter, target_config=target.config)
  data = load_eagle_features(job.feature_job(config.target_layer_ids).features_dir, None,
                             config.target_layer_ids)
  held = set(heldout_records(data, job.heldout, job.heldout_split, job.seed).tolist())
  held_idx = [i for i, (r, _, _) in enumerate(data.seqs) if r in held]
  return job, drafter, target, config, params, data, held_idx


def run_parser(doc: str) -> argparse.ArgumentParser:
  """The DFlash lab scripts' common arguments: --config (the training job), --drafter, --out."""
  p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  p.add_argument("--config", required=True)
  p.add_argument("--drafter")
  p.add_argument("--out")
  return p


def main(argv=None) -> int:
  p = run_parser(__doc__)
  p.add_argument("--train-records", type=int, default=60)
  a = p.parse_args(argv)
  job, drafter, target, config, params, data, held_idx = load_run(a.config, a.drafter)
  embed, head = target.params["embed"], lm_head_weight(target.params, target.config)
  t2d = None
  if config.draft_vocab_size is not None:  # a head of its own: its rows, its map
    ids = np.asarray(params["d2t"]) + np.arange(config.draft_vocab_size)
    t2d, head = row_map(ids, target.config.vocab_size), None
  held = {data.seqs[i][0] for i in held_idx}
  train_idx = [i for i, (r, _, _) in enumerate(data.seqs) if r not in held][:a.train_records]
  kw = {"config": config, "batch_size": job.batch_size, "seq_len": job.seq_len,
        "anchors": job.anchors, "stride": job.eval_stride, "t2d": t2d}
  zero = dataclasses.replace(data, feats=[np.zeros_like(f) for f in data.feats])
  out = {"drafter": str(drafter), "config": a.config,
         "heldout": evaluate_heldout(params, embed, head, data, held_idx, **kw),
         f"train_first_{len(train_idx)}": evaluate_heldout(params, embed, head, data,
                                                            train_idx, **kw),
         "heldout_context_zeroed": evaluate_heldout(params, embed, head, zero, held_idx, **kw),
         "final_norm_mean": float(np.mean(params["final_norm"])),
         "target_final_norm_mean": float(np.mean(target.params["final_norm"]))}
  print(json.dumps(out, indent=1))
  if a.out:
    atomic_write_json(Path(a.out), out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
