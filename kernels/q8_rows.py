"""The CPU kernel on the registry target's own GGUF blocks by rows of x, on the exact arithmetic
(`--dtype gguf`) and on llama.cpp's (`--dtype gguf-q8`: 8-bit activations, integer dots):
milliseconds per call (median of repeats) for layer 0's MLP matrices of
qwen2.5-coder-1.5b-instruct's Q4_K_M file (w_gate: Q4_K [8960, 1536]; w_down: Q6_K [1536, 8960]),
at 1 row (a plain step), 4 and 9 (verification blocks), 64 and 709 (prefills; 709 is the
default suite's summarization prompt).

    python kernels/q8_rows.py --out kernels/results/q8_rows
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import jax
import numpy as np

from vocabjax.eval.provenance import cpu_model
from vocabjax.io import atomic_write_text
from vocabjax.kernels import cpu_matmul
from vocabjax.kernels.blocks import with_arith
from vocabjax.lowering import Lowering

from block_rows import code_commit, time_call  # kernels/: run as a script

ROWS = (1, 4, 9, 64, 709)
MATRICES = ("w_gate", "w_down")


def main(argv=None) -> int:
  from vocabjax.checkpoints.loader import load_model

  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", type=Path, required=True, help="directory for results.json / .md")
  ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--repeats", type=int, default=9)
  ap.add_argument("--rows", default=",".join(map(str, ROWS)),
                  help="rows of x, comma-separated (default %(default)s)")
  ap.add_argument("--arith", default="exact,q8", help="arithmetics, comma-separated")
  ap.add_argument("--all-layers", action="store_true",
                  help="each call multiplies x by the matrix of every layer (one program): a "
                       "step's worth of the matrix, timed as the minimum of the repeats (less "
                       "sensitive to a noisy host than one layer's median)")
  args = ap.parse_args(argv)
  rows = tuple(int(r) for r in args.rows.split(","))
  ariths = tuple(args.arith.split(","))
  layers = load_model(args.model, dtype="gguf", load_tokenizer=False).params["layers"]
  layer = layers[0]
  low = Lowering(platform="cpu", any_rows=True)
  if args.all_layers:
    fn = jax.jit(lambda x, ws: sum(cpu_matmul.linear(x, w, lowering=low).sum() for w in ws))
  else:
    fn = jax.jit(lambda x, w: cpu_matmul.linear(x, w, lowering=low))
  rs = np.random.RandomState(0)
  ms, kinds = {}, {}
  for name in MATRICES:
    w = layer[name]
    kinds[name] = f"{w.qtype} {list(w.shape)}"
    for arith in ariths:
      wa = ([with_arith(layer_[name], arith) for layer_ in layers] if args.all_layers
            else with_arith(w, arith))
      for m in rows:
        x = rs.randn(m, w.shape[1]).astype(np.float32)
        key = f"{name}/{arith}/{m}"
        ms[key] = time_call(fn, x, wa, args.repeats if m < 64 else max(3, args.repeats // 3),
                            stat=min if args.all_layers else np.median) * 1e3
        print(f"{name} {kinds[name]} {arith:5s} M={m:3d} {ms[key]:8.2f} ms", flush=True)
  meta = {"command": "python kernels/q8_rows.py " + " ".join(argv) if argv else
          "python kernels/q8_rows.py --out " + str(args.out),
          "commit": code_commit(), "cpu": cpu_model(),
          "march": cpu_matmul.march(), "date": datetime.date.today().isoformat(),
          "model": args.model, "matrices": kinds, "repeats": args.repeats, "ms": ms}
  args.out.mkdir(parents=True, exist_ok=True)
  atomic_write_text(args.out / "results.json", json.dumps(meta, indent=1) + "\n")
  lines = [f"# {args.model}'s GGUF blocks by rows of x, exact and q8 arithmetic", "",
           f"- command: `{meta['command']}`", f"- commit: {meta['commit']}",
           f"- host: {meta['cpu']}, kernel -march={meta['march']}", f"- date: {meta['date']}",
           "", (f"ms per call over all {len(layers)} layers' matrices (minimum of repeats; "
                "64 rows or more: a third of them)" if args.all_layers else
                "ms per call (median of repeats; 64 rows or more: a third of them)"), "",
           "| matrix | arithmetic | " + " | ".join(f"M={m}" for m in rows) + " |",
           "|---|---" + "|---" * len(rows) + "|"]
  for name in MATRICES:
    for arith in ariths:
      lines.append(f"| {name} {kinds[name]} | {arith} | " + " | ".join(
          f"{ms[f'{name}/{arith}/{m}']:.2f}" for m in rows) + " |")
  atomic_write_text(args.out / "results.md", "\n".join(lines) + "\n")
  print(args.out / "results.md")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
