"""One table over the papers' pairs projected for TPUs (`python -m vocabjax.bench tpu --paper`):
per pair, topology and row, does it fit, the largest cache, the PROJECTED weight-stream and
roofline step times and speedups from the paper's tau, read from each directory's tpu.json;
for a row with no published tau (a trimmed head the paper did not measure), the tau it would
need to match the pair's published row on the same topology (`break_even`: published tau x
its weight-stream step time / the published row's).

    python eval/tpu_papers_summary.py eval/results/tpu_papers
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def table(root: Path) -> str:
  lines = ["| pair | topology | row | fits (GiB per chip of HBM) | max cache slots | tau "
           "(published) | PROJECTED weight-stream step us | PROJECTED speedup (weight-stream) "
           "| PROJECTED roofline step us | PROJECTED speedup (roofline) | tau to match the "
           "published row (weight-stream) |",
           "|" + "---|" * 11]
  for path in sorted(root.glob("*/tpu.json")):
    d = json.loads(path.read_text())
    pair = path.parent.name.split("_", 1)[1]
    for r in d["rows"]:
      need = break_even(d["rows"], r)
      if "error" in r:
        lines.append(f"| {pair} | {d['topology']} | {r.get('label', r['method'])} | error | "
                     + "- | " * 7)
        continue
      tau = f"{r['tau']:.2f}" if r.get("tau") is not None and r["method"] != "ar" else "-"
      sp = lambda k: f"{r[k]:.2f}x" if r.get(k) is not None and r["method"] != "ar" else "-"  # noqa: E731
      lines.append(
          f"| {pair} | {d['topology']} | {r.get('label', r['method'])} | "
          f"{'yes' if r['fits'] else 'NO'} ({r['total_bytes'] / 2**30:.1f} of "
          f"{r['hbm_bytes'] / 2**30:.0f}) | {r['max_cache_slots']:,} | {tau} | "
          f"{r['stream_s'] * 1e6:,.0f} | {sp('stream_speedup')} | {r['roofline_s'] * 1e6:,.0f} | "
          f"{sp('projected_speedup')} | {'-' if need is None else f'{need:.2f}'} |")
  return "\n".join(lines) + "\n"


def break_even(rows: list, row: dict) -> float | None:
  """For a row without a published tau: the tau at which its PROJECTED weight-stream speedup
  equals that of the first row with one (published tau x this row's step / that row's)."""
  if row["method"] == "ar" or row.get("tau") is not None or "error" in row:
    return None
  ref = next((r for r in rows if r["method"] != "ar" and r.get("tau_from") == "published"
              and "error" not in r), None)
  if ref is None or not row.get("stream_s") or not ref.get("stream_s"):
    return None
  return ref["tau"] * row["stream_s"] / ref["stream_s"]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("root", help="a directory of `bench tpu --paper` outputs")
  a = p.parse_args(argv)
  root = Path(a.root)
  if not any(root.glob("*/tpu.json")):
    print(f"error: no */tpu.json under {root}", file=sys.stderr)
    return 2
  print(table(root), end="")
  return 0


if __name__ == "__main__":
  sys.exit(main())
