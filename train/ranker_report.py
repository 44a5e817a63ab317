"""Recall table of trained SpecVocab rankers (from their `recall.json`), with the complexity
check |V| d' + k d against the full head |V| d and VocabTrim's K d.

    python train/ranker_report.py train/ranker/d56 train/ranker/d112 \
        --vocabtrim-k 16384 32768 65536 > train/ranker/recall.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("runs", nargs="+")
  p.add_argument("--vocabtrim-k", type=int, nargs="*", default=[])
  a = p.parse_args(argv)
  runs = [json.loads((Path(r) / "recall.json").read_text()) for r in a.runs]
  ks = runs[0]["job"]["recall_k"]
  print("Held-out recall@k: share of held-out positions whose token is among the ranker's "
        "top-k (target = the target's next token, drafter = the drafter's own greedy token). "
        "Step 0 is the SVD initialization (no training).\n")
  head = ["d'", "ranker", "step"] + [f"@{k} target" for k in ks] + [f"@{k} drafter" for k in ks]
  print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
  for run in runs:
    R = run["job"]["rank"]
    for label, row in (("SVD init", run["start"]), ("trained (exported)", run["exported"])):
      cells = [R, label, row["step"]] + [f"{row[f'recall@{k}_target']:.3f}" for k in ks] + \
              [f"{row[f'recall@{k}_drafter']:.3f}" for k in ks]
      print("| " + " | ".join(map(str, cells)) + " |")
  r0 = runs[0]
  print(f"\nTrain rows {r0['train_rows']}, held-out rows {r0['heldout_rows']} "
        f"({r0['heldout_records']} of {r0['records']} completions, split by prompt).\n")
  from vocabjax.vocab.ranked import Ranker

  rk = Ranker.load(Path(a.runs[0]) / "ranker.safetensors")
  V, d = rk.vocab_size, rk.hidden_size
  print(f"Drafting cost per token in LM-head multiply-adds (V = {V}, d = {d}; SpecVocab "
        f"|V| d' + d' d + k d):\n")
  print("| head | multiply-adds | vs full |\n|---|---|---|")
  print(f"| full, V d | {V * d / 1e6:.1f}M | 1.000 |")
  for run in runs:
    R = run["job"]["rank"]
    for k in ks:
      cost = V * R + R * d + k * d
      print(f"| SpecVocab d'={R} k={k} | {cost / 1e6:.1f}M | {cost / (V * d):.3f} |")
  for K in a.vocabtrim_k:
    print(f"| VocabTrim K={K} | {K * d / 1e6:.1f}M | {K * d / (V * d):.3f} |")


if __name__ == "__main__":
  main()
