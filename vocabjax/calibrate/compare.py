"""How far two `generated.jsonl` files (`calibrate count --generate`) agree on the prompts they
share: completions identical token for token, the mean common prefix, and the mean length.

What it is for: the torch backend (bf16) against vocabjax (f32) on the same prompts, or any two
generators; a greedy bf16 answer parts from the f32 one after a near tie and then goes its own
way, so the common prefix says how much of the text is the same.

    python -m vocabjax.calibrate.compare A/generated.jsonl B/generated.jsonl [--out report.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vocabjax.io import atomic_write_text


def read(path) -> dict[str, list[int]]:
  out = {}
  for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
    try:
      r = json.loads(line)
      out[r["prompt"]] = list(r["completion_ids"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise SystemExit(f"{path}:{n}: not a generated.jsonl record ({e})") from None
  return out


def compare(a: dict, b: dict) -> dict:
  shared = [p for p in a if p in b]
  if not shared:
    raise SystemExit("the two files share no prompt")
  prefix = []
  for p in shared:
    x, y = a[p], b[p]
    k = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
    prefix.append(k)
  n, len_a = len(shared), sum(len(a[p]) for p in shared)
  return {"shared_prompts": n, "identical": sum(a[p] == b[p] for p in shared),
          "mean_common_prefix": sum(prefix) / n, "mean_len_a": len_a / n,
          "mean_len_b": sum(len(b[p]) for p in shared) / n,
          "tokens_in_common_prefix": sum(prefix) / max(len_a, 1)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("a")
  ap.add_argument("b")
  ap.add_argument("--out", help="also write a markdown report (atomically)")
  args = ap.parse_args(argv)
  r = compare(read(args.a), read(args.b))
  print(json.dumps(r, indent=1))
  if args.out:
    cmd = "python -m vocabjax.calibrate.compare " + " ".join(argv if argv is not None else sys.argv[1:])
    atomic_write_text(args.out, f"Command: `{cmd}`\n\nA: `{args.a}`  \nB: `{args.b}`\n\n"
                      + "| " + " | ".join(r) + " |\n|" + "---|" * len(r) + "\n| "
                      + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v)
                                   for v in r.values()) + " |\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
