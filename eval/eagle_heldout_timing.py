"""How long a finished EAGLE run's held-out evaluation takes with one window per call (the code
before d219630) and with `batch_size` windows per call (now), on its own held-out records and
exported head, and that both give the same figures. Run it on an idle machine (the chat_all
run: ~4 minutes to read its 6.3 GB of features, then ~5 minutes):

    python eval/eagle_heldout_timing.py --run train/results/eagle/qwen15b_chat_all_cont \
        --out eval/results/eagle/heldout_timing.md
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import jax


def main(argv=None) -> int:
  sys.path.insert(0, str(Path(__file__).parent))
  from eagle_data_source import held_out, run_job  # local: a sibling script

  from vocabjax.checkpoints.eagle3 import head_target_ids, load_eagle3
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.eval.provenance import cpu_model
  from vocabjax.io import atomic_write_text
  from vocabjax.models.eagle import default_feature_layers
  from vocabjax.train.eagle import evaluate_heldout, load_eagle_features, target_to_head

  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--run", required=True, help="a finished train.eagle output directory")
  ap.add_argument("--out", required=True, help="markdown report")
  a = ap.parse_args(argv)
  run = Path(a.run)
  job = run_job(run)
  target = load_model(job.target, dtype="float32", progress=False)
  tc = target.config
  layers = tuple(job.feature_layers or default_feature_layers(tc.num_layers))
  target = dataclasses.replace(target, params={k: v for k, v in target.params.items()
                                               if k != "layers"}, _layouts={})
  data = load_eagle_features(job.feature_location, target, layers)
  held_idx = held_out(data, job)[0]
  hc, head, _ = load_eagle3(run / "head", target_config=tc)
  t2d = target_to_head(head_target_ids(head["d2t"]), tc.vocab_size)
  frozen = {"embed": target.params["embed"]}
  rows = []
  for B in (1, job.batch_size):
    t0 = time.perf_counter()
    res = evaluate_heldout(head, frozen, data, held_idx, dataclasses.replace(job, batch_size=B),
                           t2d, hc, {})
    rows.append((B, time.perf_counter() - t0, res))
  lines = [f"# Held-out evaluation of {run}: one window per call against {job.batch_size}", "",
           f"Command: `python eval/eagle_heldout_timing.py --run {a.run} --out {a.out}`", "",
           f"Machine: {cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__}; "
           f"{len(held_idx)} held-out records, windows of {job.seq_len} tokens, "
           f"{job.ttt_steps} TTT steps, f32; each time includes its one compilation.", "",
           "| windows per call | seconds | acc_0 | acc_3 | held-out loss |", "|---|---|---|---|---|"]
  for B, sec, res in rows:
    lines.append(f"| {B} | {sec:.1f} | {res['acc_0']:.4f} | {res[f'acc_{job.ttt_steps - 1}']:.4f} "
                 f"| {res['heldout_loss']:.4f} |")
  text = "\n".join(lines) + "\n"
  atomic_write_text(a.out, text)
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
