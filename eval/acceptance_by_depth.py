"""Acceptance by depth, proposal sizes and match lengths of a recorded eval run, per method and
report group: why one drafter beats another on a workload (docs/suffix.md).

From each record's per-step counts (`step_drafted`, `step_accepted`: a tree's accepted path
length) over the steps that drafted: how many drafted, the mean proposal size, the share of
them accepting at least d tokens for d = 1 .. `--depth` (a chain of n drafts reaches depth d
only if d <= n), and for SuffixDecoding the mean match length (`extra.mean_match_len`, weighted
by its matched steps). Plain decoding and steps without drafts are left out.

    python eval/acceptance_by_depth.py eval/results/suffix \
        --out eval/results/suffix/acceptance_by_depth.md
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from vocabjax.io import atomic_write_text


def table(records: list[dict], depth: int) -> list[str]:
  steps = defaultdict(list)  # (method, group) -> [(drafted, accepted)]
  match = defaultdict(lambda: [0.0, 0])  # (method, group) -> [sum of match x steps, steps]
  methods, groups = [], []
  for r in records:
    if not r.get("step_drafted"):
      continue
    key = (r["method"], r["group"])
    for k, v in ((r["method"], methods), (r["group"], groups)):
      if k not in v:
        v.append(k)
    steps[key] += [(d, a) for d, a in zip(r["step_drafted"], r["step_accepted"]) if d]
    extra = r.get("extra") or {}
    if "mean_match_len" in extra and extra.get("matched_steps"):
      match[key][0] += extra["mean_match_len"] * extra["matched_steps"]
      match[key][1] += extra["matched_steps"]
  head = ("| method | group | drafting steps | mean drafted | mean match | "
          + " | ".join(f">= {d}" for d in range(1, depth + 1)) + " |")
  lines = [head, "|" + "---|" * (4 + depth)]
  for m in methods:
    for g in groups + ["overall"]:
      rows = (steps[(m, g)] if g != "overall"
              else [x for (mm, _), v in steps.items() if mm == m for x in v])
      if not rows:
        continue
      ms = (match[(m, g)] if g != "overall" else
            [sum(v[0] for (mm, _), v in match.items() if mm == m),
             sum(v[1] for (mm, _), v in match.items() if mm == m)])
      mean_match = f"{ms[0] / ms[1]:.1f}" if ms[1] else "-"
      n = len(rows)
      share = [sum(1 for _, a in rows if a >= d) / n for d in range(1, depth + 1)]
      lines.append(f"| {m} | {g} | {n} | {sum(d for d, _ in rows) / n:.1f} | {mean_match} | "
                   + " | ".join(f"{s:.2f}" for s in share) + " |")
  return lines


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("run", help="a recorded eval run's directory (its questions.jsonl)")
  ap.add_argument("--depth", type=int, default=8)
  ap.add_argument("--out", help="write the table there (markdown); else print it")
  a = ap.parse_args(argv)
  path = Path(a.run) / "questions.jsonl"
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  lines = ["# Acceptance by depth", "",
           f"`python eval/acceptance_by_depth.py {a.run} --depth {a.depth}"
           + (f" --out {a.out}`" if a.out else "`") + f", from {path}: over the (row) steps that "
           "drafted, the mean proposal size, SuffixDecoding's mean match length, and the share "
           "of steps accepting at least d tokens.", "", *table(records, a.depth)]
  text = "\n".join(lines) + "\n"
  if a.out:
    atomic_write_text(a.out, text)
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
