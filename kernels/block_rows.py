"""The CPU kernel's matmul on GGUF blocks by rows of x (M: 1 for a plain step, 2-16 for chain
and tree verification), against the same matrix in f32: milliseconds per call, median of
repeats, for the blocks types the registry's files and int4 use, at the MLP's shape of the
registry target ([8960, 1536], random weights quantized by gguf's own quantizer).

    python kernels/block_rows.py --out kernels/results/block_rows
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.eval.provenance import cpu_model
from vocabjax.io import atomic_write_text
from vocabjax.kernels import blocks, cpu_matmul
from vocabjax.lowering import Lowering

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0")
ROWS = (1, 2, 3, 4, 5, 9, 16, 33)


def time_call(fn, x, w, repeats: int, stat=np.median) -> float:
  fn(x, w).block_until_ready()  # compiles
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn(x, w).block_until_ready()
    ts.append(time.perf_counter() - t)
  return float(stat(ts))


def code_commit() -> str:
  """HEAD's short hash, with "+changes" where vocabjax/ differs from it."""
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  dirty = bool(subprocess.run(["git", "status", "--porcelain", "vocabjax"], capture_output=True,
                              text=True).stdout.strip())
  return commit + ("+changes" if dirty else "")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", type=Path, required=True, help="directory for results.json / .md")
  ap.add_argument("--shape", type=int, nargs=2, default=(8960, 1536), metavar=("F", "D"))
  ap.add_argument("--repeats", type=int, default=9)
  ap.add_argument("--types", nargs="+", default=list(TYPES))
  args = ap.parse_args(argv)
  F, D = args.shape
  rs = np.random.RandomState(0)
  w = (rs.randn(F, D) * 0.02).astype(np.float32)
  low = Lowering(platform="cpu", any_rows=True)
  fn = jax.jit(lambda x, w: cpu_matmul.linear(x, w, lowering=low))
  weights = {"f32": jnp.asarray(w)} | {q: blocks.quantize(w, q) for q in args.types}
  rows = {}
  for name, wt in weights.items():
    for m in ROWS:
      x = jnp.asarray(rs.randn(m, D).astype(np.float32))
      rows[f"{name}/{m}"] = time_call(fn, x, wt, args.repeats) * 1e3
      print(f"{name:5s} M={m:2d} {rows[f'{name}/{m}']:7.2f} ms", flush=True)
  meta = {"command": "python kernels/block_rows.py " + " ".join(argv or []) if argv else
          "python kernels/block_rows.py --out " + str(args.out),
          "commit": code_commit(), "cpu": cpu_model(),
          "march": cpu_matmul.march(), "date": datetime.date.today().isoformat(),
          "shape": [F, D], "repeats": args.repeats, "ms": rows}
  args.out.mkdir(parents=True, exist_ok=True)
  atomic_write_text(args.out / "results.json", json.dumps(meta, indent=1) + "\n")
  lines = [f"# GGUF blocks by rows of x, [{F}, {D}]", "",
           f"- command: `{meta['command']}`", f"- commit: {meta['commit']}",
           f"- host: {meta['cpu']}, kernel -march={meta['march']}", f"- date: {meta['date']}",
           "", "ms per call (median of %d); each M's ratio to M = 1 of the same weights" %
           args.repeats, "", "| weights | " + " | ".join(f"M={m}" for m in ROWS) + " |",
           "|---" * (len(ROWS) + 1) + "|"]
  for name in weights:
    base = rows[f"{name}/1"]
    lines.append(f"| {name} | " + " | ".join(
        f"{rows[f'{name}/{m}']:.2f} ({rows[f'{name}/{m}'] / base:.1f}x)" for m in ROWS) + " |")
  atomic_write_text(args.out / "results.md", "\n".join(lines) + "\n")
  print(args.out / "results.md")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
