"""Microbenchmark of the indexed LM head on SpecVocab's grid (their table of
`fused_batched_gather_dot`): B = 10 rows, (d, V) in {(1024, 100352), (4096, 100352),
(2560, 151936), (4096, 151936)}, k = 128 ... 8192.

    python kernels/bench_indexed_lm_head.py --out kernels/results/<machine>

Per (d, V, k): median time of
  kernel      the Pallas kernel of this platform (GPU: Triton, TPU: Mosaic; absent on CPU)
  xla_gather  XLA gather + einsum (`indexed_lm_head_reference`, the CPU path)
  full        the full head h @ U^T (what the candidates replace)
and achieved GB/s = bytes that must be read (B*k*d weights + h + idx, plus the output) / time,
against the memory bandwidth measured here (a read-only reduction over a 1 GiB array); the
"floor" is those bytes at that bandwidth. bf16 on GPU/TPU, f32 on CPU (DESIGN's rule), unless
--dtype says otherwise. Writes results.json and results.md (with the command, commit, machine).

On GPU the Triton kernel's block sizes are tuned per (d, V, k) (`--tune`, default on GPU: every
block_k x block_d x num_warps of `TUNE_GRID` that fits, the fastest kept and reported), and its
output is checked on the device against the f32 reference (`max err`, relative to the largest
|logit|; a row over `--tolerance` fails the run). `--interpret` runs the GPU kernel in Pallas's
interpret mode on any backend (slow: for checking this script on CPU with small shapes).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from vocabjax.bench.engine import read_bandwidth
from vocabjax.decoding.profile import median_s
from vocabjax.io import atomic_write_text

GRID = ((1024, 100352), (4096, 100352), (2560, 151936), (4096, 151936))
KS = tuple(128 * 2 ** i for i in range(7))  # 128 ... 8192
TUNE_GRID = {"block_k": (32, 64, 128, 256), "block_d": (64, 128, 256), "num_warps": (4, 8),
             "num_stages": (1,)}


def gpu_candidates(d: int, k: int, grid: dict = TUNE_GRID) -> list[dict]:
  """Block configurations of the Triton kernel worth timing for width d and k candidates:
  block_d at most d, block_k at most k rounded up to a power of two."""
  kp = 1 << max(0, (k - 1).bit_length())
  return [{"block_k": bk, "block_d": bd, "num_warps": nw, "num_stages": ns}
          for bk in grid["block_k"] for bd in grid["block_d"] for nw in grid["num_warps"]
          for ns in grid.get("num_stages", (1,))
          if bd <= max(d, grid["block_d"][0]) and bk <= max(kp, grid["block_k"][0])]


def max_rel_err(out, ref) -> float:
  """max |out - ref| / max |ref| (f32)."""
  ref = jnp.asarray(ref, jnp.float32)
  return float(jnp.max(jnp.abs(jnp.asarray(out, jnp.float32) - ref)) /
               jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))


def tune_gpu(h, U, idx, candidates: list[dict], repeats: int, interpret: bool = False):
  """(fastest block config, its median seconds, every config's seconds) of the Triton kernel."""
  from vocabjax.kernels.indexed_lm_head import indexed_lm_head_gpu

  times = []
  for c in candidates:
    f = jax.jit(functools.partial(indexed_lm_head_gpu, interpret=interpret, **c))
    try:
      times.append((median_s(f, h, U, idx, repeats=repeats), c))
    except Exception as e:  # a configuration the compiler refuses (shared memory, registers)
      print(f"[bench] skipping {c}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
  if not times:
    raise RuntimeError(f"no block configuration of {candidates} compiled")
  best_s, best = min(times, key=lambda t: t[0])
  return best, best_s, [{**c, "s": t} for t, c in times]


def bench(d: int, V: int, ks, B: int, dtype, repeats: int, with_kernel: bool, seed: int = 0,
          tune: bool = False, interpret: bool = False, tolerance: float = 1e-2,
          tune_grid: dict = TUNE_GRID):
  from vocabjax.kernels.indexed_lm_head import (indexed_lm_head, indexed_lm_head_gpu,
                                                indexed_lm_head_reference)

  key = jax.random.key(seed)
  U = jax.random.normal(key, (V, d), jnp.float32).astype(dtype) * 0.02
  h = jax.random.normal(jax.random.fold_in(key, 1), (B, d), jnp.float32).astype(dtype)
  isz = jnp.dtype(dtype).itemsize
  full = jax.jit(lambda h, U: jnp.einsum("BD,VD->BV", h, U,
                                         preferred_element_type=jnp.float32))
  t_full = median_s(full, h, U, repeats=repeats)
  rows = []
  for k in ks:
    idx = jax.random.randint(jax.random.fold_in(key, k), (B, k), 0, V, jnp.int32)
    nbytes = B * k * d * isz + B * d * isz + B * k * 4 + B * k * 4  # rows, h, idx, out
    row = {"d": d, "V": V, "k": k, "B": B, "bytes": nbytes, "full_s": t_full,
           "full_bytes": V * d * isz + B * d * isz + B * V * 4,
           "xla_gather_s": median_s(jax.jit(indexed_lm_head_reference), h, U, idx,
                                     repeats=repeats)}
    if with_kernel:
      if tune:
        best, row["kernel_s"], row["tuning"] = tune_gpu(h, U, idx, gpu_candidates(d, k, tune_grid),
                                                        repeats, interpret)
        kern = jax.jit(functools.partial(indexed_lm_head_gpu, interpret=interpret, **best))
        row["kernel_blocks"] = best
      else:
        kern = jax.jit(functools.partial(indexed_lm_head_gpu, interpret=True) if interpret
                       else functools.partial(indexed_lm_head, impl="auto"))
        row["kernel_s"] = median_s(kern, h, U, idx, repeats=repeats)
      ref = indexed_lm_head_reference(h.astype(jnp.float32), U.astype(jnp.float32), idx)
      row["kernel_max_err"] = max_rel_err(kern(h, U, idx), ref)
      if row["kernel_max_err"] > tolerance:
        raise AssertionError(f"the kernel differs from the f32 reference at d={d} V={V} k={k}: "
                             f"max relative error {row['kernel_max_err']:.2e} > {tolerance}")
    rows.append(row)
  del U
  return rows


def markdown(res: dict) -> str:
  bw = res["bandwidth_GBps"]
  kern = res["with_kernel"]
  head = ["d", "V", "k", "full ms", "xla gather ms", "xla GB/s"]
  if kern:
    head += ["kernel ms", "kernel GB/s", "kernel / floor", "kernel speedup vs xla",
             "blocks (k, d, warps, stages)", "max err"]
  head += ["floor ms", "candidates / full (xla)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in res["rows"]:
    floor = r["bytes"] / (bw * 1e9)
    cells = [r["d"], r["V"], r["k"], f"{r['full_s'] * 1e3:.3f}", f"{r['xla_gather_s'] * 1e3:.3f}",
             f"{r['bytes'] / r['xla_gather_s'] / 1e9:.1f}"]
    if kern:
      cells += [f"{r['kernel_s'] * 1e3:.3f}", f"{r['bytes'] / r['kernel_s'] / 1e9:.1f}",
                f"{floor / r['kernel_s']:.0%}", f"{r['xla_gather_s'] / r['kernel_s']:.2f}x"]
      b = r.get("kernel_blocks")
      cells += [f"{b['block_k']}, {b['block_d']}, {b['num_warps']}, {b.get('num_stages', 1)}"
                if b else "default",
                f"{r['kernel_max_err']:.1e}"]
    cells += [f"{floor * 1e3:.4f}", f"{r['xla_gather_s'] / r['full_s']:.2f}"]
    lines.append("| " + " | ".join(map(str, cells)) + " |")
  return "\n".join(lines)


def write_reports(res: dict, out: Path, batch: int) -> str:
  """results.json and results.md in `out` (atomic); returns the markdown."""
  atomic_write_text(out / "results.json", json.dumps(res, indent=1))
  mode = " (kernel in INTERPRET mode: not a GPU timing)" if res["interpret"] else ""
  md = (f"# Indexed LM head microbenchmark: {res['device']} ({res['backend']}), {res['dtype']}, "
        f"B={batch}{mode}\n\n"
        f"Command: `{res['command']}`  \ncommit {res['commit']}, {res['date']}, measured read "
        f"bandwidth {res['bandwidth_GBps']:.1f} GB/s (floor = bytes read / that bandwidth)."
        f"\n\n{markdown(res)}\n")
  atomic_write_text(out / "results.md", md)
  return md


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="directory for results.json / results.md")
  p.add_argument("--dtype", choices=("bfloat16", "float32"))
  p.add_argument("--batch", type=int, default=10)
  p.add_argument("--ks", type=int, nargs="+", default=list(KS))
  p.add_argument("--shapes", nargs="+", help="d:V pairs (default: SpecVocab's grid)")
  p.add_argument("--repeats", type=int, default=20)
  p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                 help="tune the Triton kernel's block sizes per shape (default: on GPU)")
  for name, vals in TUNE_GRID.items():
    p.add_argument(f"--tune-{name.replace('_', '-')}", type=int, nargs="+", default=list(vals),
                   help=f"{name} values tried when tuning (default {' '.join(map(str, vals))})")
  p.add_argument("--interpret", action="store_true",
                 help="run the GPU kernel in interpret mode (any backend; small shapes only)")
  p.add_argument("--tolerance", type=float, default=1e-2,
                 help="largest relative error of the kernel against the f32 reference")
  a = p.parse_args(argv)
  backend = jax.default_backend()
  dtype = jnp.dtype(a.dtype or ("float32" if backend == "cpu" else "bfloat16"))
  grid = [tuple(map(int, s.split(":"))) for s in a.shapes] if a.shapes else GRID
  with_kernel = backend in ("gpu", "tpu") or a.interpret
  tune = a.tune if a.tune is not None else backend == "gpu"
  if tune and backend == "tpu":
    p.error("--tune covers the Triton (GPU) kernel only")
  tune_grid = {name: tuple(getattr(a, f"tune_{name}")) for name in TUNE_GRID}
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  res = {"command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
         "commit": commit, "backend": backend, "device": str(jax.devices()[0].device_kind),
         "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "dtype": str(dtype), "with_kernel": with_kernel, "interpret": a.interpret,
         "tuned": tune, "tune_grid": tune_grid if tune else None,
         "bandwidth_GBps": read_bandwidth(1 << 30, a.repeats), "rows": []}
  print(f"[bench] {backend} ({res['device']}), {dtype}, measured read bandwidth "
        f"{res['bandwidth_GBps']:.1f} GB/s", file=sys.stderr)
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  for d, V in grid:  # the reports are rewritten after each shape: a run cut short keeps them
    res["rows"] += bench(d, V, a.ks, a.batch, dtype, a.repeats, with_kernel, tune=tune,
                         interpret=a.interpret, tolerance=a.tolerance, tune_grid=tune_grid)
    print(f"[bench] d={d} V={V} done", file=sys.stderr)
    md = write_reports(res, out, a.batch)
  print(md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
