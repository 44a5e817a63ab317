"""Compare two eval runs record by record (behaviour unchanged after a refactor):

  python eval/compare_records.py eval/results/default runs/default_check

Each run's `questions.jsonl` holds one record per (method, question); a record is equal when its
output token ids, steps, accepted and drafted counts, finish reason and token count are. Prints
the differing records and a summary line; exit status 1 when any differs or is missing."""

import argparse
import json
import sys
from pathlib import Path

FIELDS = ("output_ids", "steps", "accepted", "drafted", "finish_reason", "num_tokens")


def records(run: str) -> dict:
  path = Path(run) / "questions.jsonl"
  out = {}
  for line in path.read_text().splitlines():
    r = json.loads(line)
    out[(r["method"], r["qid"])] = r
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("reference")
  ap.add_argument("new")
  a = ap.parse_args(argv)
  ref, new = records(a.reference), records(a.new)
  bad = 0
  for key, r in ref.items():
    n = new.get(key)
    diff = ["missing"] if n is None else [f for f in FIELDS if r.get(f) != n.get(f)]
    if diff:
      bad += 1
      print(f"{key}: {', '.join(diff)}")
  print(f"{len(ref) - bad} equal, {bad} differ or missing, of {len(ref)} reference records "
        f"({len(new)} in {a.new})")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
