"""Write the package's trimmed reference of each recorded suite run (vocabjax/eval/references/),
which `python -m vocabjax.eval` sets a run of the same suite beside.

    python eval/update_references.py                       # every eval/results/<suite>/
    python eval/update_references.py eval/results/default  # one recorded run

A directory counts when its summary.json is a run of a shipped suite (configs/eval/<suite>.yaml)
of the same name; re-run this after recording a suite's reference run anew.
"""

import argparse
import json
import sys
from pathlib import Path

from vocabjax.eval.report import REFERENCE_ROOT, write_reference

ROOT = Path(__file__).resolve().parents[1]


def recorded_runs() -> list[Path]:
  suites = {p.stem for p in (ROOT / "configs" / "eval").glob("*.yaml")}
  return sorted(d for d in (ROOT / "eval" / "results").iterdir()
                if d.name in suites and (d / "summary.json").is_file())


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("runs", nargs="*", type=Path, help="recorded run directories (default: all)")
  ap.add_argument("--root", type=Path, default=REFERENCE_ROOT, help="where to write them")
  args = ap.parse_args(argv)
  for run in args.runs or recorded_runs():
    summary = json.loads((run / "summary.json").read_text())
    if summary["suite"] != run.name:
      print(f"{run}: a run of suite {summary['suite']!r}, not {run.name!r}; skipped",
            file=sys.stderr)
      continue
    source = run.resolve().relative_to(ROOT).as_posix() if run.resolve().is_relative_to(ROOT) \
        else str(run)
    print(write_reference(run / "summary.json", args.root, source=source))
  return 0


if __name__ == "__main__":
  sys.exit(main())
