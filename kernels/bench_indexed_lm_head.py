"""Microbenchmark of the indexed LM head on SpecVocab's grid (their table of
`fused_batched_gather_dot`): B = 10 rows, (d, V) in {(1024, 100352), (4096, 100352),
(2560, 151936), (4096, 151936)}, k = 128 ... 8192; `--shapes`/`--batch`/`--ks` for others
(the real drafters' widths at B = 1 or 4).

    python kernels/bench_indexed_lm_head.py --out kernels/results/kernels/<machine>

Per (d, V, k), each timed two ways:
  device  N calls with distinct inputs (h and index sets) inside one compiled program, N chosen
          so that the program runs ~`--target-ms` (at most `--calls`), timed whole, less the
          host time of a program that does nothing with the same arguments, divided by N: the
          host's ~55-60 us per program (which made every host-timed figure under ~0.2 ms a
          measure of the host) becomes a small subtracted share. Consecutive kernels still pay
          the GPU's launch gap, as they do inside a decoding step. (A first try, a
          slope between programs of 4 and 8 calls, drowned in the host's jitter and reported
          impossible times: not used.)
  host    the median of `--repeats` single calls with `block_until_ready` (what earlier tables
          reported), beside it.
Of:
  kernel      the Pallas kernel of this platform (GPU: Triton, every configuration of the tuning
              grid timed on the device, the fastest kept; TPU: Mosaic; absent on CPU)
  xla_gather  XLA gather + einsum (`indexed_lm_head_reference`)
  full        the full head h @ U^T (what the candidates replace), with its achieved GB/s.
Achieved GB/s = bytes that must move (B*k*d weights + h + idx + the output) / device time,
against a COPY bandwidth measured in the same run (an elementwise bf16 kernel over 2 and 6 GiB,
read + written bytes, slope between the two sizes) and a READ bandwidth (bf16 row sums, slope
between the same sizes; the kernel reads and barely writes, so this is its ceiling).
The kernel's output is checked on the device against the f32 reference (`max err`, relative to
the largest |logit|; a row over `--tolerance` fails the run).

`--hlo-dump`: the compiled HLO of XLA's reference at the first shape's largest k (and at every
other k, one file each), and whether it writes the gathered [B, k, d] rows to memory (a buffer
of that shape outside a fusion).
`--update-table PATH`: after the run, merge each row's (kernel, XLA) device times and the best
blocks into the dispatch table at PATH (`vocabjax/kernels/dispatch_table.json` ships with the
package; `impl="auto"` reads it). `dispatch.json` in `--out` holds the same entries.
`--interpret` runs the GPU kernel in Pallas's interpret mode on any backend (slow: for checking
this script on CPU with small shapes; its times mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import platform
import re
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
TUNE_GRID = {"variant": ("fma", "dot"), "block_k": (64, 128), "block_d": (128, 256),
             "num_warps": (4, 8), "num_stages": (3,), "split_d": (1, 4), "persist": (0,)}
INT_KNOBS = ("block_k", "block_d", "num_warps", "num_stages", "split_d", "persist")


def gpu_candidates(d: int, k: int, grid: dict = TUNE_GRID, B: int | None = None,
                   sms: int | None = None) -> list[dict]:
  """Configurations of the Triton kernel worth timing for width d and k candidates: block_d at
  most d, block_k at most k rounded up to a power of two, split_d at most d's chunk count, and
  (given B and the SM count) split_d > 1 only where B * K / block_k programs fill fewer than
  two waves of the SMs; a persistent grid (persist > 0) only with split_d 1 and (given B) at
  most one program per tile."""
  from vocabjax.kernels.indexed_lm_head_gpu import aligned_block_d, tiles

  kp = 1 << max(0, (k - 1).bit_length())
  out, seen = [], set()
  for v in grid["variant"]:
    for bk in grid["block_k"]:
      for bd in grid["block_d"]:
        for nw in grid["num_warps"]:
          for ns in grid["num_stages"]:
            for sd, pp in itertools.product(grid["split_d"], grid.get("persist", (0,))):
              if bd > max(d, grid["block_d"][0]) or bk > max(kp, grid["block_k"][0]):
                continue
              if sd > -(-d // aligned_block_d(d, bd)):
                continue
              if sd > 1 and B and sms and tiles(B, k, bk) >= 2 * sms:
                continue
              if pp and (sd > 1 or (B and pp > tiles(B, k, bk))):  # persist: split 1, <= tiles
                continue
              c = {"variant": v, "block_k": bk, "block_d": bd, "num_warps": nw,
                   "num_stages": ns, "split_d": sd, "persist": pp}
              if tuple(c.values()) not in seen:
                seen.add(tuple(c.values()))
                out.append(c)
  return out


def max_rel_err(out, ref) -> float:
  """max |out - ref| / max |ref| (f32)."""
  ref = jnp.asarray(ref, jnp.float32)
  return float(jnp.max(jnp.abs(jnp.asarray(out, jnp.float32) - ref)) /
               jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30))


def many_calls(fn, n: int):
  """A jitted program of n calls fn(hs[i], U, idxs[i]), each output summed whole (so none can
  be simplified away), one after another: call i's inputs pass an optimization barrier with the
  running total, so each call depends on the one before. Distinct inputs alone do not keep XLA
  from merging the calls: its DotMerger pass fuses dots that share an operand (the full head's
  N products with U became one read of U on the H200, 13.7 TB/s "measured")."""
  def prog(hs, U, idxs):
    tot = jnp.zeros((), jnp.float32)
    for i in range(n):
      tot, h, idx = jax.lax.optimization_barrier((tot, hs[i], idxs[i]))
      tot = tot + jnp.sum(fn(h, U, idx))
    return tot
  return jax.jit(prog)


def dispatch_s(hs, U, idxs, repeats: int) -> float:
  """Host time of a program that takes the same arguments and does (almost) nothing: what a
  call costs the host before the device works (subtracted from `device_s`'s programs)."""
  return median_s(jax.jit(lambda hs, U, idxs: jnp.sum(hs[0, 0]).astype(jnp.float32)), hs, U,
                  idxs, repeats=repeats)


def device_s(fn, hs, U, idxs, repeats: int, target_s: float = 2e-3,
             overhead_s: float | None = None) -> tuple[float, int]:
  """(seconds one call takes on the device, N): a program of N calls with distinct inputs,
  N chosen so that it runs ~`target_s` (at most len(idxs)), timed whole (median of `repeats`),
  less one dispatch (`dispatch_s`), over N. The host's ~55-60 us per program is then a small,
  subtracted share instead of the whole figure (as host-timed single calls were)."""
  overhead = dispatch_s(hs, U, idxs, 3) if overhead_s is None else overhead_s
  one = median_s(many_calls(fn, 1), hs, U, idxs, repeats=3)
  n = int(min(len(idxs), max(4, -(-target_s // max(one - overhead, 1e-6)))))
  t = median_s(many_calls(fn, n), hs, U, idxs, repeats=repeats)
  return max(t - overhead, 1e-9) / n, n


def copy_bandwidth(repeats: int, mib=(2048, 6144)) -> float:
  """GB/s of an elementwise bf16 kernel (read + write counted), from the slope between arrays
  of mib[0] and mib[1] MiB (what a copy adds per byte, free of dispatch)."""
  return 2 * _slope_GBps(jax.jit(lambda x: x * 2), repeats, mib)


def _slope_GBps(f, repeats: int, mib) -> float:
  """GB (of the array) per second that f adds between bf16 arrays of mib[0] and mib[1] MiB:
  the per-byte cost free of dispatch."""
  ts = []
  for m in mib:
    x = jnp.ones(((m << 20) // 2,), jnp.bfloat16)
    ts.append(median_s(f, x, repeats=repeats))
    del x
  return ((mib[1] - mib[0]) << 20) / max(ts[1] - ts[0], 1e-9) / 1e9


def read_slope_bandwidth(repeats: int, mib=(2048, 6144)) -> float:
  """GB/s of reading bf16 arrays (row sums over 2048 columns: the writes are 1/2048 of the
  reads), from the slope between arrays of mib[0] and mib[1] MiB. The older read probe
  (`read_bandwidth`: one f32 sum over 1 GiB, host-timed, dispatch included) gave 2666 GB/s on
  the H200 against a copy reference of 3361 GB/s read + write: a probe, not a ceiling."""
  return _slope_GBps(jax.jit(lambda x: jnp.sum(x.reshape(-1, 2048), axis=1, dtype=jnp.float32)),
                     repeats, mib)


def sm_count() -> int | None:
  """Streaming multiprocessors of the first device (None where JAX does not say)."""
  return getattr(jax.devices()[0], "core_count", None)


def tune_gpu(hs, U, idxs, candidates: list[dict], repeats: int, interpret: bool = False,
             overhead_s: float | None = None):
  """(fastest config, its device seconds, every config's seconds) of the Triton kernel, each
  timed on the device (`device_s`)."""
  from vocabjax.kernels.indexed_lm_head import indexed_lm_head_gpu

  times = []
  for c in candidates:
    f = functools.partial(indexed_lm_head_gpu, interpret=interpret, **c)
    try:
      times.append((device_s(f, hs, U, idxs, repeats, overhead_s=overhead_s)[0], c))
    except Exception as e:  # a configuration the compiler refuses (shared memory, registers)
      print(f"[bench] skipping {c}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
  if not times:
    raise RuntimeError(f"no block configuration of {candidates} compiled")
  best_s, best = min(times, key=lambda t: t[0])
  return best, best_s, [{**c, "s": t} for t, c in times]


def contiguous_indices(key, calls: int, B: int, k: int, V: int):
  """(calls, B, k) index sets of k consecutive rows each, at random offsets: the same bytes as
  random indices, read in long runs (`--contiguous`: what random row order costs)."""
  start = jax.random.randint(key, (calls, B, 1), 0, max(V - k, 1), jnp.int32)
  return (start + jnp.arange(k, dtype=jnp.int32)) % V


def bench(d: int, V: int, ks, B: int, dtype, repeats: int, with_kernel: bool, seed: int = 0,
          tune: bool = False, interpret: bool = False, tolerance: float = 1e-2,
          tune_grid: dict = TUNE_GRID, calls: int = 64, target_s: float = 2e-3,
          contiguous: bool = False):
  from vocabjax.kernels import indexed_lm_head as ilh

  key = jax.random.key(seed)
  U = jax.random.normal(key, (V, d), jnp.float32).astype(dtype) * 0.02
  hs = jax.random.normal(jax.random.fold_in(key, 1), (calls, B, d), jnp.float32).astype(dtype)
  h = hs[0]
  isz = jnp.dtype(dtype).itemsize
  full = lambda h, U, idx: jnp.einsum("BD,VD->BV", h, U,  # noqa: E731
                                      preferred_element_type=jnp.float32)
  zero = jnp.zeros((calls, B, 1), jnp.int32)
  over = dispatch_s(hs, U, zero, repeats)
  t_full, n_full = device_s(full, hs, U, zero, repeats, target_s, over)
  t_full_host = median_s(jax.jit(full), h, U, zero[0], repeats=repeats)
  rows = []
  for k in ks:
    idxs = jax.random.randint(jax.random.fold_in(key, k), (calls, B, k), 0, V, jnp.int32)
    idx = idxs[0]
    nbytes = B * k * d * isz + B * d * isz + B * k * 4 + B * k * 4  # rows, h, idx, out
    over = dispatch_s(hs, U, idxs, repeats)
    xla_s, xla_n = device_s(ilh.indexed_lm_head_reference, hs, U, idxs, repeats, target_s, over)
    row = {"d": d, "V": V, "k": k, "B": B, "bytes": nbytes, "full_s": t_full,
           "full_calls": n_full, "full_host_s": t_full_host,
           "full_bytes": V * d * isz + B * d * isz + B * V * 4, "dispatch_s": over,
           "xla_gather_s": xla_s, "xla_calls": xla_n,
           "xla_gather_host_s": median_s(jax.jit(ilh.indexed_lm_head_reference), h, U, idx,
                                         repeats=repeats)}
    if with_kernel:
      if tune:
        best, row["kernel_s"], row["tuning"] = tune_gpu(hs, U, idxs,
                                                        gpu_candidates(d, k, tune_grid, B,
                                                                       sm_count()),
                                                        repeats, interpret, over)
        kern = functools.partial(ilh.indexed_lm_head_gpu, interpret=interpret, **best)
        row["kernel_blocks"] = best
      else:
        kern = (functools.partial(ilh.indexed_lm_head_gpu, interpret=True) if interpret
                else functools.partial(ilh.indexed_lm_head, impl="tpu"
                                       if jax.default_backend() == "tpu" else "gpu"))
        row["kernel_s"] = device_s(kern, hs, U, idxs, repeats, target_s, over)[0]
      row["kernel_host_s"] = median_s(jax.jit(kern), h, U, idx, repeats=repeats)
      ref = ilh.indexed_lm_head_reference(h.astype(jnp.float32), U.astype(jnp.float32), idx)
      row["kernel_max_err"] = max_rel_err(jax.jit(kern)(h, U, idx), ref)
      if row["kernel_max_err"] > tolerance:
        raise AssertionError(f"the kernel differs from the f32 reference at d={d} V={V} k={k}: "
                             f"max relative error {row['kernel_max_err']:.2e} > {tolerance}")
    if contiguous:  # the same sizes with consecutive rows: what random row order costs each
      cidx = contiguous_indices(jax.random.fold_in(key, (1 << 20) + k), calls, B, k, V)
      row["xla_contig_s"] = device_s(ilh.indexed_lm_head_reference, hs, U, cidx, repeats,
                                     target_s, over)[0]
      if with_kernel:
        row["kernel_contig_s"] = device_s(kern, hs, U, cidx, repeats, target_s, over)[0]
    rows.append(row)
  del U
  return rows


def hlo_report(d: int, V: int, k: int, B: int, dtype, out: Path) -> dict:
  """Compiled HLO of XLA's reference at (B, k, d): written to `out`; does the entry computation
  hold a [B, k, d] buffer (the gathered rows written to memory, then read by the product)?"""
  from vocabjax.kernels.indexed_lm_head import indexed_lm_head_reference

  args = (jax.ShapeDtypeStruct((B, d), dtype), jax.ShapeDtypeStruct((V, d), dtype),
          jax.ShapeDtypeStruct((B, k), jnp.int32))
  text = jax.jit(indexed_lm_head_reference).lower(*args).compile().as_text()
  atomic_write_text(out, text)
  shape = f"{jnp.dtype(dtype).name.replace('bfloat16', 'bf16').replace('float32', 'f32')}" \
          f"[{B},{k},{d}]"
  entry = text[text.find("ENTRY"):]
  entry = entry[:entry.find("\n}")]
  hits = [ln.strip() for ln in entry.splitlines() if shape in ln.split("=", 1)[-1][:80]
          and re.search(r"=\s*" + re.escape(shape), ln)]
  return {"file": out.name, "shape": shape, "materialized": bool(hits),
          "instructions": hits[:4]}


def dispatch_entries(res: dict) -> list[dict]:
  """Entries for `vocabjax.kernels.dispatch`: rows with a tuned kernel, not interpret mode."""
  if res["interpret"] or not res["with_kernel"]:
    return []
  return [{"device_kind": res["device"], "dtype": res["dtype"], "B": r["B"], "K": r["k"],
           "D": r["d"], "V": r["V"], "kernel_s": r["kernel_s"], "xla_s": r["xla_gather_s"],
           "kernel_host_s": r["kernel_host_s"], "xla_host_s": r["xla_gather_host_s"],
           "config": r["kernel_blocks"], "commit": res["commit"], "date": res["date"]}
          for r in res["rows"] if r.get("kernel_blocks")]


def merge_into_table(res: dict, table: str, history: bool, label: str = "") -> None:
  """A run's dispatch entries merged into the dispatch table at `table` (`dispatch.merge`)."""
  from vocabjax.kernels import dispatch

  entries = dispatch_entries(res)
  print(f"[bench] {label}{len(entries)} entries merged into "
        f"{dispatch.merge(entries, table, history=history)}", file=sys.stderr)


def markdown(res: dict) -> str:
  bw = res["copy_GBps"]
  kern = res["with_kernel"]
  head = ["B", "d", "V", "k", "full ms", "full GB/s", "xla ms", "xla GB/s", "xla host ms"]
  if kern:
    head += ["kernel ms", "kernel GB/s", "kernel / copy bw", "kernel / read bw", "kernel vs xla",
             "kernel host ms",
             "config (variant, k, d, warps, stages, split, persist)", "max err"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in res["rows"]:
    cells = [r["B"], r["d"], r["V"], r["k"], f"{r['full_s'] * 1e3:.4f}",
             f"{r['full_bytes'] / r['full_s'] / 1e9:.0f}", f"{r['xla_gather_s'] * 1e3:.4f}",
             f"{r['bytes'] / r['xla_gather_s'] / 1e9:.0f}", f"{r['xla_gather_host_s'] * 1e3:.3f}"]
    if kern:
      gbps = r["bytes"] / r["kernel_s"] / 1e9
      b = r.get("kernel_blocks")
      cells += [f"{r['kernel_s'] * 1e3:.4f}", f"{gbps:.0f}", f"{gbps / bw:.0%}",
                f"{gbps / res['read_GBps']:.0%}" if res.get("read_GBps") else "-",
                f"{r['xla_gather_s'] / r['kernel_s']:.2f}x", f"{r['kernel_host_s'] * 1e3:.3f}",
                config_cell(b) if b else "default",
                f"{r['kernel_max_err']:.1e}"]
    lines.append("| " + " | ".join(map(str, cells)) + " |")
  contig = [r for r in res["rows"] if r.get("xla_contig_s")]
  if contig:
    read = res.get("read_GBps")
    lines += ["", "The same sizes with consecutive rows (`--contiguous`: each index set k rows in "
              "a row at a random offset): what random row order costs.", "",
              "| B | d | k | xla random ms | xla consecutive ms | xla consecutive / read bw | "
              "kernel random ms | kernel consecutive ms | kernel consecutive / read bw |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in contig:
      share = lambda s: f"{r['bytes'] / s / 1e9 / read:.0%}" if read else "-"  # noqa: E731
      ks_ = r.get("kernel_contig_s")
      lines.append(f"| {r['B']} | {r['d']} | {r['k']} | {r['xla_gather_s'] * 1e3:.4f} | "
                   f"{r['xla_contig_s'] * 1e3:.4f} | {share(r['xla_contig_s'])} | "
                   + (f"{r['kernel_s'] * 1e3:.4f} | {ks_ * 1e3:.4f} | {share(ks_)} |" if ks_
                      else "- | - | - |"))
  lines += persist_table(res)
  return "\n".join(lines)


def config_cell(c: dict) -> str:
  """A kernel configuration as the reports print it: variant, block_k, block_d, warps, stages,
  split, persist."""
  return (f"{c['variant']}, {c['block_k']}, {c['block_d']}, {c['num_warps']}, "
          f"{c['num_stages']}, {c['split_d']}, {c.get('persist', 0)}")


def persist_table(res: dict) -> list[str]:
  """Markdown lines comparing, per row whose tuning timed both, the best persistent grid
  (persist > 0) with the best one-program-per-tile configuration, each against XLA, and whether
  the bar (>= 1.3x XLA at B = 10, d >= 2560, k >= 2048) holds; [] if none did."""
  out, read = [], res.get("read_GBps")
  for r in res["rows"]:
    timed = [c for c in r.get("tuning") or [] if c.get("s")]
    tile = [c for c in timed if not c.get("persist")]
    pers = [c for c in timed if c.get("persist")]
    if not (tile and pers):
      continue
    a, b = min(tile, key=lambda c: c["s"]), min(pers, key=lambda c: c["s"])
    bars = r["B"] == 10 and r["d"] >= 2560 and r["k"] >= 2048
    x = r["xla_gather_s"]
    best = min(a["s"], b["s"])
    out.append(f"| {r['B']} | {r['d']} | {r['k']} | {x * 1e3:.4f} | {a['s'] * 1e3:.4f} | "
               f"{x / a['s']:.2f}x | {config_cell(a)} | {b['s'] * 1e3:.4f} | {x / b['s']:.2f}x | "
               + (f"{r['bytes'] / b['s'] / 1e9 / read:.0%}" if read else "-")
               + f" | {config_cell(b)} | " + (("yes" if x / best >= 1.3 else "no") if bars else "-")
               + " |")
  if not out:
    return []
  return ["", "The persistent grid (`persist` > 0) against one program per tile, the best of "
          "each in this run's tuning (device-timed, ms); bar: >= 1.3x XLA at B = 10, "
          "d >= 2560, k >= 2048.", "",
          "| B | d | k | xla ms | per-tile ms | per-tile vs xla | per-tile config | "
          "persistent ms | persistent vs xla | persistent / read bw | persistent config | "
          "bar |", "|" + "---|" * 12] + out


def write_reports(res: dict, out: Path) -> str:
  """results.json, results.md and dispatch.json in `out` (atomic); returns the markdown."""
  atomic_write_text(out / "results.json", json.dumps(res, indent=1))
  atomic_write_text(out / "dispatch.json", json.dumps(dispatch_entries(res), indent=1))
  mode = " (kernel in INTERPRET mode: not a GPU timing)" if res["interpret"] else ""
  hlo = res.get("hlo")
  md = (f"# Indexed LM head microbenchmark: {res['device']} ({res['backend']}), {res['dtype']}"
        f"{mode}\n\nCommand: `{res['command']}`  \ncommit {res['commit']}, {res['date']}, jax "
        f"{res['jax']}. Device times: N calls (distinct inputs) in one program of about "
        f"{res.get('target_ms', 2.0)} ms (N <= {res['calls']}), less one dispatch, / N; host: "
        f"median single call. Copy bandwidth {res['copy_GBps']:.0f} GB/s "
        f"(read + write), read bandwidth {res.get('read_GBps', 0):.0f} GB/s (bf16 row sums, "
        f"slope), old read probe {res['bandwidth_GBps']:.0f} GB/s.\n\n{markdown(res)}\n")
  if hlo:
    md += (f"\nXLA reference's compiled HLO ({hlo['file']}): the gathered rows {hlo['shape']} "
           f"{'ARE' if hlo['materialized'] else 'are NOT'} a buffer of the entry computation"
           + ("".join(f"\n    {i}" for i in hlo["instructions"]) if hlo["instructions"] else "")
           + "\n")
  for k, h in sorted((res.get("hlo_by_k") or {}).items(), key=lambda kv: int(kv[0])):
    md += (f"- at k = {k}: the gathered rows {h['shape']} "
           f"{'ARE' if h['materialized'] else 'are NOT'} a buffer"
           + (f" (`{h['instructions'][0]}`)" if h["instructions"] else "") + "\n")
  atomic_write_text(out / "results.md", md)
  return md


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", help="directory for results.json / results.md (required unless "
                 "--from-results)")
  p.add_argument("--dtype", choices=("bfloat16", "float32"))
  p.add_argument("--batch", type=int, default=10)
  p.add_argument("--ks", type=int, nargs="+", default=list(KS))
  p.add_argument("--shapes", nargs="+", help="d:V pairs (default: SpecVocab's grid)")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--calls", type=int, default=64,
                 help="most calls in one device-timed program (N is chosen per shape so that "
                      "the program runs about --target-ms)")
  p.add_argument("--target-ms", type=float, default=2.0,
                 help="device-timed programs run about this long")
  p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                 help="tune the Triton kernel's configuration per shape (default: on GPU)")
  p.add_argument("--tune-variant", nargs="+", default=list(TUNE_GRID["variant"]),
                 choices=("fma", "dot"))
  for name in INT_KNOBS:
    vals = TUNE_GRID[name]
    p.add_argument(f"--tune-{name.replace('_', '-')}", type=int, nargs="+", default=list(vals),
                   help=f"{name} values tried when tuning (default {' '.join(map(str, vals))})")
  p.add_argument("--tune-persist-per-sm", type=int, nargs="+", default=[],
                 help="persistent grids of N programs per SM (N x this GPU's SM count), added "
                      "to --tune-persist (the SM count differs between GPUs: 132 on an H100 "
                      "SXM or H200, 114 on an H100 PCIe)")
  p.add_argument("--interpret", action="store_true",
                 help="run the GPU kernel in interpret mode (any backend; small shapes only)")
  p.add_argument("--tolerance", type=float, default=1e-2,
                 help="largest relative error of the kernel against the f32 reference")
  p.add_argument("--copy-mib", type=int, nargs=2,
                 help="array sizes (MiB) of the copy-bandwidth slope (default: 2048 6144 on an "
                      "accelerator, 256 512 on the CPU)")
  p.add_argument("--hlo-dump", action="store_true",
                 help="write XLA's compiled reference at the first shape's largest k, and say "
                      "at every k whether it writes the gathered rows to memory")
  p.add_argument("--contiguous", action="store_true",
                 help="also time XLA and the kernel (its tuned configuration) with index sets "
                      "of consecutive rows: the same bytes in long runs, to separate the cost "
                      "of random row order from the kernel's")
  p.add_argument("--update-table", metavar="PATH",
                 help="merge the measured entries into this dispatch table after the run")
  p.add_argument("--table-history", action=argparse.BooleanOptionalAction, default=True,
                 help="keep the replaced entries' timings in the table (the dispatcher then "
                      "needs the kernel to have won every recorded run; default); "
                      "--no-table-history after a change to the kernel")
  p.add_argument("--from-results", nargs="+", metavar="RESULTS_JSON",
                 help="measure nothing: merge these earlier runs' results.json, oldest first, "
                      "into --update-table (a GPU run's results, recorded, merged here)")
  a = p.parse_args(argv)
  if a.from_results:
    if not a.update_table:
      p.error("--from-results needs --update-table PATH")
    for f in a.from_results:
      try:
        res = json.loads(Path(f).read_text())
      except (OSError, json.JSONDecodeError) as e:
        p.error(f"--from-results {f}: cannot read a results.json ({e})")
      merge_into_table(res, a.update_table, a.table_history, f"{f}: ")
    return 0
  if not a.out:
    p.error("--out is required (unless --from-results)")
  if a.calls < 1 or a.repeats < 1 or a.batch < 1:
    p.error(f"--calls {a.calls}, --repeats {a.repeats} and --batch {a.batch} must be >= 1")
  backend = jax.default_backend()
  dtype = jnp.dtype(a.dtype or ("float32" if backend == "cpu" else "bfloat16"))
  try:
    grid = [tuple(map(int, s.split(":"))) for s in a.shapes] if a.shapes else GRID
  except ValueError:
    p.error(f"--shapes {a.shapes}: each must be d:V, two integers")
  with_kernel = backend in ("gpu", "tpu") or a.interpret
  tune = a.tune if a.tune is not None else backend == "gpu"
  if tune and backend == "tpu":
    p.error("--tune covers the Triton (GPU) kernel only")
  tune_grid = {"variant": tuple(a.tune_variant),
               **{name: tuple(getattr(a, f"tune_{name}")) for name in INT_KNOBS}}
  if a.tune_persist_per_sm:
    sms = sm_count()
    if not sms:
      p.error("--tune-persist-per-sm: this device does not say its SM count; give "
              "--tune-persist program counts instead")
    tune_grid["persist"] = tuple(dict.fromkeys(
        tune_grid["persist"] + tuple(n * sms for n in a.tune_persist_per_sm)))
  mib = tuple(a.copy_mib or ((256, 512) if backend == "cpu" else (2048, 6144)))
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  res = {"command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
         "commit": commit, "backend": backend, "device": str(jax.devices()[0].device_kind),
         "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "jax": jax.__version__, "dtype": str(dtype), "with_kernel": with_kernel,
         "interpret": a.interpret, "tuned": tune, "tune_grid": tune_grid if tune else None,
         "calls": a.calls, "target_ms": a.target_ms, "bandwidth_GBps": read_bandwidth(1 << 30, a.repeats),
         "copy_GBps": copy_bandwidth(a.repeats, mib), "read_GBps": read_slope_bandwidth(
             a.repeats, mib), "rows": []}
  print(f"[bench] {backend} ({res['device']}), {dtype}, copy bandwidth {res['copy_GBps']:.0f} "
        f"GB/s, read bandwidth {res['read_GBps']:.0f} GB/s", file=sys.stderr)
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  if a.hlo_dump:
    d, V = grid[0]
    res["hlo"] = hlo_report(d, V, max(a.ks), a.batch, dtype, out / "xla_reference_hlo.txt")
    res["hlo_by_k"] = {str(k): hlo_report(d, V, k, a.batch, dtype,
                                          out / f"xla_reference_hlo_k{k}.txt")
                       for k in sorted(set(a.ks)) if k != max(a.ks)}
  md = write_reports(res, out)
  for d, V in grid:  # the reports are rewritten after each shape: a run cut short keeps them
    res["rows"] += bench(d, V, a.ks, a.batch, dtype, a.repeats, with_kernel, tune=tune,
                         interpret=a.interpret, tolerance=a.tolerance, tune_grid=tune_grid,
                         calls=a.calls, target_s=a.target_ms / 1e3,
                         contiguous=a.contiguous)
    print(f"[bench] B={a.batch} d={d} V={V} done", file=sys.stderr)
    md = write_reports(res, out)
  print(md)
  if a.update_table:
    merge_into_table(res, a.update_table, a.table_history)
  return 0


if __name__ == "__main__":
  sys.exit(main())
