"""Where a plain step on GGUF blocks spends its time, per matrix: the CPU kernel's seconds per
call for each of the registry files' block types at their own shapes, one call after another
(each call's input depends on the one before, as in a model's layers, so XLA runs them one at a
time and every matrix is read from memory, not cache), on one thread and on two.

For each matrix: ms per call, weights per second, the bytes read per second, and the same
matrix in f32 for reference. A second part times an f32 matrix that stays in the core's L2
(compute alone, no memory traffic) to show what the second thread adds when nothing waits on
memory.

    python kernels/block_threads.py --out kernels/results/block_threads

The weights are the registry files' own tensors (one layer's of each type and shape), read
with `gguf`; each is copied `--copies` times so that a pass reads far more than the caches hold.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

FILES = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
         "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"}


def measure(copies: int, repeats: int) -> dict:
  """{name: {ms, weights_per_s, bytes_per_s, f32_ms}} for every (file, type, shape) of one
  layer's matrices, in this process (its CPU affinity decides XLA's threads)."""
  import time

  import gguf
  import jax
  import jax.numpy as jnp
  import numpy as np

  from vocabjax.checkpoints import zoo
  from vocabjax.kernels import blocks, cpu_matmul
  from vocabjax.lowering import Lowering

  low = Lowering(platform="cpu", any_rows=True)

  def chain(x, ws):  # each call's input depends on the call before (0 * y: the same x)
    acc = jnp.zeros((), jnp.float32)
    for w in ws:
      acc = acc + cpu_matmul.linear(x + 0 * acc, w, lowering=low).sum()
    return acc

  fn = jax.jit(chain)

  def per_call(ws, D):
    x = jnp.ones((1, D), jnp.float32)
    fn(x, ws).block_until_ready()
    ts = []
    for _ in range(repeats):
      t = time.perf_counter()
      fn(x, ws).block_until_ready()
      ts.append(time.perf_counter() - t)
    return float(np.median(ts)) / len(ws)

  out = {}
  for model, fname in FILES.items():
    reader = gguf.GGUFReader(zoo.resolve(model, progress=False))
    seen = set()
    for t in reader.tensors:
      if not t.name.startswith("blk.") or t.tensor_type.name == "F32":
        continue
      D, F = int(t.shape[0]), int(t.shape[1])
      key = (t.tensor_type.name, F, D)
      if key in seen:
        continue
      seen.add(key)
      data = np.asarray(t.data).reshape(F, -1)
      ws = [blocks.BlockWeight(jnp.asarray(data.copy()), key[0], D) for _ in range(copies)]
      s = per_call(ws, D)
      f32 = [jnp.asarray(blocks.dequantize(ws[0]) + i) for i in range(copies)]
      s32 = per_call(f32, D)
      name = f"{model} {t.name.split('.')[-2]} {key[0]} [{F}, {D}]"
      out[name] = {"ms": s * 1e3, "weights_per_s": F * D / s, "bytes_per_s": data.nbytes / s,
                   "f32_ms": s32 * 1e3}
      print(f"{name}: {s * 1e3:.3f} ms ({data.nbytes / s / 1e9:.2f} GB/s of blocks), f32 "
            f"{s32 * 1e3:.3f} ms", flush=True)
      del ws, f32
  # compute alone: an f32 matrix of 0.5 MB (in L2) called again and again
  w = [jnp.asarray(np.random.RandomState(0).randn(128, 1024).astype(np.float32))] * 400
  s = per_call(w, 1024)
  n = 128 * 1024
  out["f32 [128, 1024] in L2 (compute alone)"] = {"ms": s * 1e3, "weights_per_s": n / s,
                                                 "bytes_per_s": 4 * n / s, "f32_ms": s * 1e3}
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", type=Path, required=True)
  ap.add_argument("--copies", type=int, default=24)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.child is not None:  # one measurement at this process's affinity
    print("RESULT " + json.dumps(measure(args.copies, args.repeats)), flush=True)
    return 0
  cpus = sorted(os.sched_getaffinity(0))
  runs = {}
  for n in sorted({1, len(cpus)}):
    env = dict(os.environ)
    cmd = [sys.executable, __file__, "--out", str(args.out), "--copies", str(args.copies),
           "--repeats", str(args.repeats), "--child", str(n)]
    proc = subprocess.run(["taskset", "-c", ",".join(map(str, cpus[:n])), *cmd], env=env,
                          capture_output=True, text=True, check=True)
    runs[n] = json.loads(next(line[7:] for line in proc.stdout.splitlines()
                              if line.startswith("RESULT ")))
  from vocabjax.eval.provenance import cpu_model
  from vocabjax.io import atomic_write_text

  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  meta = {"command": "python kernels/block_threads.py --out " + str(args.out),
          "commit": commit, "cpu": cpu_model(), "date": datetime.date.today().isoformat(),
          "copies": args.copies, "threads": {str(n): r for n, r in runs.items()}}
  args.out.mkdir(parents=True, exist_ok=True)
  atomic_write_text(args.out / "results.json", json.dumps(meta, indent=1) + "\n")
  ns = sorted(runs)
  lines = ["# GGUF blocks one call after another, by threads", "",
           f"- command: `{meta['command']}`", f"- commit: {commit}", f"- host: {meta['cpu']}",
           f"- date: {meta['date']}", "",
           "ms per call (median of %d passes over %d copies of each matrix, each call waiting on "
           "the one before); GB/s of the blocks read; f32: the same values widened" %
           (args.repeats, args.copies), "",
           "| matrix | " + " | ".join(f"{n} thread{'s' * (n > 1)}: ms, GB/s, f32 ms"
                                      for n in ns) + " | speedup of " + f"{ns[-1]} threads |",
           "|---" * (len(ns) + 2) + "|"]
  for name in runs[ns[0]]:
    cells = [f"{runs[n][name]['ms']:.3f}, {runs[n][name]['bytes_per_s'] / 1e9:.2f}, "
             f"{runs[n][name]['f32_ms']:.3f}" for n in ns]
    lines.append(f"| {name} | " + " | ".join(cells) +
                 f" | {runs[ns[0]][name]['ms'] / runs[ns[-1]][name]['ms']:.2f}x |")
  atomic_write_text(args.out / "results.md", "\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
