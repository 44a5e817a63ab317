"""Gemma-3-270M as a drafter: its LM head's share of a step, and what each vocabulary method
saves and keeps.

  python eval/gemma3_head_share.py > eval/results/gemma3/head_share.md

Reads what earlier commands recorded (each named in the output):
  - the drafter step's parts timed on this CPU with random weights of the 270M's shapes:
    `kernels/results/bench/gemma3-cpu/bench.json` (`python -m vocabjax.bench --target
    gemma-3-1b --draft gemma-3-270m ...`, its command inside): body over one token, and the LM
    head over one hidden row, full (262,144 rows), trimmed to K rows (VocabTrim / FR-Spec) or
    SpecVocab's k candidates chosen by a rank-40 ranker;
  - the held-out records of the 270M's ranker (`configs/train/ranker_gemma270m_d40.yaml`; its
    feature shards, not committed, are rebuilt by rerunning it): the drafter's own greedy token
    at each of their positions, and the ranker's recall of it (`recall.json`);
  - the FR-Spec-style subsets (top-K tokens of the Python standard library's code in the 270M's
    tokenizer, `eval/results/gemma3/calibration/stdlib_code/subset-k*.npz`): the share of
    the same greedy tokens inside them.
A drafter that drafts among fewer rows picks exactly the full head's token when that token is
among them, so the share kept bounds how often drafting with the smaller head changes nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "kernels/results/bench/gemma3-cpu/bench.json"
RANKER = ROOT / "train/ranker/gemma270m"
SUBSETS = ROOT / "eval/results/gemma3/calibration/stdlib_code"


def main(argv: list[str] | None = None) -> int:
  from vocabjax.train.features import heldout_records, load_features
  from vocabjax.vocab.subset import VocabSubset

  bench = json.loads(BENCH.read_text())
  meta = bench["meta"]
  rows = [r for r in bench["rows"] if r["role"] == "draft"]
  body = next(1e3 * r["s"] for r in rows if r["program"] == "drafter_body")
  heads = {r["head"]: 1e3 * r["s"] for r in rows if r["program"] == "drafter_head"}
  feats = load_features(RANKER / "features")
  held = heldout_records(feats, 0.1)
  mask = np.isin(feats.record, held)
  greedy = feats.draft_argmax[mask]
  recall = json.loads((RANKER / "d40" / "recall.json").read_text())
  final = recall.get("final", recall)

  def kept(head: str) -> str:
    if head == "full":
      return "100%"
    kind, n = head.split(":")
    if kind == "trim":
      sub = VocabSubset.load(SUBSETS / f"subset-k{n}.npz")
      return f"{np.isin(greedy, np.asarray(sub.ids)).mean():.1%}"
    key = f"recall@{n}_drafter"
    return f"{final[key]:.1%}" if key in final else "-"

  full_step = body + heads["full"]
  print("# Gemma-3-270M drafting: the LM head's share and what each head saves\n")
  print(f"Step parts: `{meta['command']}` ({meta['date']}, commit {meta['commit']}, "
        f"{meta['device']['host_cpu']}, {meta['device']['cpus']} cpus); kept: the 270M's own greedy token at {mask.sum():,} "
        f"positions of {len(held)} held-out records of its ranker's corpus. Command: "
        f"`python eval/gemma3_head_share.py`.\n")
  print(f"Body (18 layers, one token): {body:.2f} ms; full head (262,144 x 640): "
        f"{heads['full']:.2f} ms: **the head is {heads['full'] / full_step:.0%} of the "
        f"drafter's step** (f32, batch 1).\n")
  print("| head | rows read | head ms | drafter step ms | step vs full head | greedy token kept |")
  print("|---|---|---|---|---|---|")
  for head, ms in heads.items():
    if head == "full":
      what = "262,144"
    elif head.startswith("trim:"):
      what = f"{int(head.split(':')[1]):,} (VocabTrim / FR-Spec subset)"
    else:
      what = f"{int(head.split(':')[1]):,} candidates + rank-40 ranker (SpecVocab)"
    step = body + ms
    print(f"| {head} | {what} | {ms:.2f} | {step:.2f} | {full_step / step:.2f}x | "
          f"{kept(head)} |")
  print("\nThe subsets were counted over the whole standard library, whose chunks are a quarter "
        "of the corpus (held-out records included), so their share kept is optimistic for "
        "code; the ranker was trained on the other 90% of the records. Head times are of "
        "random weights of the real shapes; the drafter's step in a decoder adds its "
        "sampling and the host loop.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
