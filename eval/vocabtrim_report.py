"""Tables for VocabTrim's calibration: calibration sources, and how much of the target's own
greedy output each top-K subset covers (the AR records of the eval run).

    python eval/vocabtrim_report.py [--calibration train/calibration]
                                    [--eval eval/results/vocabtrim] > train/calibration/table.md
Also writes overlaid rank_frequency.png / coverage.png into the calibration directory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vocabjax.calibrate import Counts, coverage, plot

KS = (8192, 16384, 32768, 65536)


def topk_ids(counts: np.ndarray, k: int) -> set:
  order = np.lexsort((np.arange(counts.size), -counts))
  return set(order[:k].tolist())


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--calibration", default="train/calibration")
  ap.add_argument("--eval", default="eval/results/vocabtrim")
  args = ap.parse_args(argv)
  cal = Path(args.calibration)
  named = {d.name: Counts.load(d / "counts.npz") for d in sorted(cal.iterdir())
           if (d / "counts.npz").exists()}
  plot(named, cal)
  ar_out = []
  rec = Path(args.eval) / "questions.jsonl"
  if rec.exists():
    for line in rec.read_text().splitlines():
      r = json.loads(line)
      if r["method"] == "ar":
        ar_out += r["output_ids"]

  print("| source | kind | tokens | distinct | documents | tokenize tok/s | count tok/s | "
        "generate tok/s | " + " | ".join(f"own cov. top-{k // 1024}K" for k in KS) + " |")
  print("|---" * (8 + len(KS)) + "|")
  for name, c in named.items():
    t = c.meta.get("timing", {})
    cov = coverage(c.counts)
    docs = c.meta.get("documents")
    if c.meta.get("units_done") is not None and c.meta["units_done"] < c.meta["units_total"]:
      docs = f"{docs} (stopped at unit {c.meta['units_done']}/{c.meta['units_total']})"
    print(f"| {name} | {c.meta.get('kind')} | {c.total:,} | {int((c.counts > 0).sum()):,} | "
          f"{docs} | {t.get('tokenize_tokens_per_s') or '-'} | "
          f"{t.get('count_tokens_per_s') or '-'} | {t.get('generate_tokens_per_s') or '-'} | "
          + " | ".join(f"{cov[k - 1]:.1%}" for k in KS) + " |")
  if ar_out:
    print(f"\nShare of the target's greedy output tokens in the eval run ({len(ar_out):,} tokens, "
          f"AR records of {rec}) that lie inside each top-K subset (specials not added):\n")
    print("| source | " + " | ".join(f"top-{k // 1024}K" for k in KS) + " |")
    print("|---" * (1 + len(KS)) + "|")
    arr = np.asarray(ar_out)
    for name, c in named.items():
      cells = []
      for k in KS:
        ids = topk_ids(c.counts, k)
        cells.append(f"{np.mean([x in ids for x in arr]):.1%}")
      print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
