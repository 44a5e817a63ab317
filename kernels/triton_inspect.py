"""What the Triton kernel of the indexed LM head compiles to for a Hopper GPU, without a GPU.

Pallas lowers the kernel to Triton IR (TTIR) on any host (`lowering_platforms=("cuda",)`).
This script captures that IR for each configuration, compiles it with the `triton` package's
own compiler for sm_90a (H100 / H200) in a subprocess, assembles the PTX with the `ptxas` that
package ships (`-v`: registers, spills), and reports per configuration:

  shared     shared memory per program (bytes; Triton's pipeliner stages tiles there)
  u_buffers  tiles of U the pipeline keeps in shared memory (the TTGIR's multi-buffered
             [N, block_k, block_d] allocation; 0: none, the loads go to registers)
  regs       registers per thread, spills (ptxas)
  cp.async   16-byte asynchronous global->shared copies in the PTX (the pipelined loads)
  ld.v4      16-byte global->register loads (vectorized, not pipelined across iterations)
  mma        MMA / wgmma instructions
  occ        programs an SM can hold: the least of registers (64K per SM, allocated per warp in
             units of 256), shared memory (228 KB, 1 KB reserved per program), threads (2048)
             and 32 programs
  programs   the grid's size, and its per-SM load: the most programs any SM must run against the
             mean (the busiest SMs finish last; "balance" = mean / most)

    pip download --no-deps triton==3.9.0 -d /tmp/tw
    pip install --no-deps --target /tmp/tritondir /tmp/tw/triton-3.9.0-*.whl   # 285 MB
    python kernels/triton_inspect.py --triton-path /tmp/tritondir \
        --out kernels/results/kernels/triton_inspect

Not what the device runs, but close to it: XLA compiles Pallas's TTIR with its own Triton
(another version, XLA's pass pipeline); this is Triton 3.9's pipeline. Times are not estimated.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REGS_PER_SM = 65536
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED = 1024  # per program (CUDA reserves 1 KB of shared memory per block)
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
PTX_COUNTS = {"cp_async": r"cp\.async\.cg\.shared\.global", "ld_v4": r"ld\.global(\.\w+)*\.v4",
              "ld_scalar16": r"ld\.global(\.\w+)*\.b16\b", "mma": r"\bmma\.sync",
              "wgmma": r"wgmma\.mma_async", "bar": r"bar\.sync"}


def occupancy(regs: int, smem: int, num_warps: int) -> dict:
  """Programs of `num_warps` warps an sm_90 SM holds at `regs` registers per thread and `smem`
  bytes of shared memory per program, and which resource limits it."""
  warp_regs = -(-regs * 32 // 256) * 256
  lim = {"regs": REGS_PER_SM // max(warp_regs * num_warps, 1),
         "smem": SMEM_PER_SM // (smem + SMEM_RESERVED),
         "threads": THREADS_PER_SM // (32 * num_warps), "blocks": BLOCKS_PER_SM}
  by = min(lim, key=lim.get)
  return {"programs_per_sm": lim[by], "limited_by": by, **{f"max_by_{k}": v for k, v in lim.items()}}


def grid_load(programs: int, sms: int, per_sm: int) -> dict:
  """How a grid of `programs` spreads over `sms` SMs holding `per_sm` each: waves, and the most
  programs one SM runs against the mean (balance = mean / most)."""
  most = -(-programs // sms)
  return {"programs": programs, "waves": round(programs / max(sms * per_sm, 1), 2),
          "most_per_sm": most, "balance": round(programs / sms / most, 3)}


def capture_ttir(fn, *args) -> list[str]:
  """The TTIR text of every Triton pallas_call in fn(*args), lowered for cuda on this host."""
  from vocabjax import jax_internals

  return jax_internals.triton_ir(fn, *args)


def kernel_ttir(B: int, D: int, V: int, K: int, config: dict, dtype: str = "bfloat16") -> str:
  """The TTIR of `indexed_lm_head_gpu` with `config` at (B, D, V, K)."""
  import jax
  import jax.numpy as jnp

  from vocabjax.kernels.indexed_lm_head_gpu import indexed_lm_head_gpu

  cfg = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
  sd = lambda *s, dt=dtype: jax.ShapeDtypeStruct(s, jnp.dtype(dt))  # noqa: E731
  mods = capture_ttir(functools.partial(indexed_lm_head_gpu, **cfg), sd(B, D), sd(V, D),
                      sd(B, K, dt="int32"))
  if len(mods) != 1:
    raise RuntimeError(f"expected one Triton kernel, lowered {len(mods)}")
  return mods[0]


def _compile_child(ttir: str, num_warps: int, num_stages: int, arch: int) -> None:
  """In the subprocess (triton importable): compile TTIR for sm_{arch}a, print JSON."""
  import triton
  from triton.backends.compiler import GPUTarget

  k = triton.compile(ttir, target=GPUTarget("cuda", arch, 32),
                     options={"num_warps": num_warps, "num_stages": num_stages})
  print(json.dumps({"shared": k.metadata.shared, "ptx": k.asm["ptx"], "ttgir": k.asm["ttgir"],
                    "triton": triton.__version__,
                    "bin": str(Path(triton.__file__).parent / "backends/nvidia/bin")}))


_PTXAS_OK: dict = {}  # bin directory -> the bundled ptxas that read its PTX last


def ptxas_info(ptx: str, bindir: str, arch: int) -> dict:
  """Registers and spill bytes of the PTX's kernel (`ptxas -v`, whichever bundled ptxas reads
  this PTX version)."""
  with tempfile.TemporaryDirectory() as tmp:
    src = Path(tmp, "k.ptx")
    src.write_text(ptx)
    errs = []
    for exe in sorted(("ptxas", "ptxas-blackwell"), key=lambda e: e != _PTXAS_OK.get(bindir)):
      r = subprocess.run([str(Path(bindir, exe)), f"-arch=sm_{arch}a", "-v", str(src), "-o",
                          str(Path(tmp, "k.cubin"))], capture_output=True, text=True)
      if r.returncode == 0:
        _PTXAS_OK[bindir] = exe  # tried first for the next configuration
        out = r.stdout + r.stderr
        regs = re.search(r"Used (\d+) registers", out)
        spill = re.search(r"(\d+) bytes spill stores", out)
        return {"regs": int(regs.group(1)) if regs else None,
                "spill_bytes": int(spill.group(1)) if spill else 0, "ptxas": exe}
      errs.append(f"{exe}: {r.stderr.strip()[-200:]}")
  raise RuntimeError("no bundled ptxas assembled the PTX: " + "; ".join(errs))


def inspect(B: int, D: int, V: int, K: int, config: dict, triton_path: str, arch: int = 90,
            sms: int = 132, keep: Path | None = None) -> dict:
  """One configuration's row (module doc)."""
  ttir = kernel_ttir(B, D, V, K, config)
  with tempfile.TemporaryDirectory() as tmp:
    f = Path(tmp, "kernel.ttir")
    f.write_text(ttir)
    env = {**os.environ, "PYTHONPATH": triton_path, "TRITON_DEFAULT_FP_FUSION": "1"}
    r = subprocess.run([sys.executable, __file__, "--compile-child", str(f),
                        str(config["num_warps"]), str(config["num_stages"]), str(arch)],
                       capture_output=True, text=True, env=env, timeout=600)
  if r.returncode:
    return {**config, "error": r.stderr.strip()[-600:]}
  c = json.loads(r.stdout.strip().splitlines()[-1])
  bufs = [int(n) for n in re.findall(
      rf"memdesc<(\d+)x{config['block_k']}x{_block_d(D, config)}x", c["ttgir"])]
  row = {**config, "triton": c["triton"], "shared": c["shared"],
         "u_buffers": max(bufs, default=0),
         **ptxas_info(c["ptx"], c["bin"], arch),
         **{n: len(re.findall(p, c["ptx"])) for n, p in PTX_COUNTS.items()}}
  row.update(occupancy(row["regs"], row["shared"], config["num_warps"]))
  from vocabjax.kernels.indexed_lm_head_gpu import programs as n_programs
  row.update(grid_load(n_programs(B, D, K, config), sms, row["programs_per_sm"]))
  if keep is not None:
    name = "_".join(f"{v}" for v in config.values())
    keep.mkdir(parents=True, exist_ok=True)
    for ext, text in (("ttir", ttir), ("ttgir", c["ttgir"]), ("ptx", c["ptx"])):
      Path(keep, f"{B}x{D}x{K}_{name}.{ext}").write_text(text)
  return row


def _block_d(D: int, config: dict) -> int:
  from vocabjax.kernels.indexed_lm_head_gpu import aligned_block_d

  return aligned_block_d(D, config["block_d"])


def markdown(rows: list[dict], header: str) -> str:
  cols = ["variant", "block_k", "block_d", "num_warps", "num_stages", "split_d", "persist",
          "shared", "u_buffers", "regs", "spill_bytes", "cp_async", "ld_v4", "ld_scalar16", "mma",
          "wgmma", "programs_per_sm", "limited_by", "programs", "waves", "balance"]
  lines = [header, "", "| shape | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['shape']} | " + " | ".join(str(r.get(c, "")) for c in cols[:7]) +
                   f" | error: {r['error'][:150]} |")
    else:
      lines.append(f"| {r['shape']} | " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--compile-child":
    f, nw, ns, arch = sys.argv[2:6]
    return _compile_child(f, int(nw), int(ns), int(arch))
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--triton-path", required=True, help="a directory holding the triton package")
  p.add_argument("--shapes", nargs="+", default=["10:4096:151936:2048", "10:2560:151936:2048"],
                 help="B:D:V:K")
  p.add_argument("--variant", nargs="+", default=["fma", "dot"])
  p.add_argument("--block-k", type=int, nargs="+", default=[64, 128])
  p.add_argument("--block-d", type=int, nargs="+", default=[128])
  p.add_argument("--num-warps", type=int, nargs="+", default=[4, 8])
  p.add_argument("--num-stages", type=int, nargs="+", default=[3])
  p.add_argument("--split-d", type=int, nargs="+", default=[1])
  p.add_argument("--persist", type=int, nargs="+", default=[0],
                 help="programs of the persistent grid (0: one program per tile)")
  p.add_argument("--sms", type=int, default=132, help="SMs of the GPU (H100 SXM / H200: 132)")
  p.add_argument("--arch", type=int, default=90)
  p.add_argument("--out", required=True)
  p.add_argument("--keep-ir", action="store_true", help="write each TTIR / TTGIR / PTX to --out")
  a = p.parse_args(argv)
  import jax

  from vocabjax.io import atomic_write_text
  from vocabjax.kernels.indexed_lm_head_gpu import tiles

  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  rows = []
  names = ("variant", "block_k", "block_d", "num_warps", "num_stages", "split_d", "persist")
  for shape in a.shapes:
    B, D, V, K = map(int, shape.split(":"))
    for vals in itertools.product(a.variant, a.block_k, a.block_d, a.num_warps, a.num_stages,
                                  a.split_d, a.persist):
      cfg = dict(zip(names, vals))
      if cfg["persist"] and (cfg["split_d"] > 1 or cfg["persist"] > tiles(B, K, cfg["block_k"])):
        continue  # the kernel caps P at the tile count: that row is another persist's
      row = {"shape": shape, **inspect(B, D, V, K, cfg, a.triton_path, a.arch, a.sms,
                                       out / "ir" if a.keep_ir else None)}
      rows.append(row)
      print(json.dumps({k: v for k, v in row.items() if k != "error"} | (
          {"error": row["error"][:300]} if "error" in row else {})), flush=True)
  res = {"command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
         "jax": jax.__version__, "arch": f"sm_{a.arch}a", "sms": a.sms, "rows": rows}
  atomic_write_text(out / "results.json", json.dumps(res, indent=1) + "\n")
  triton_v = next((r["triton"] for r in rows if "triton" in r), "?")
  atomic_write_text(out / "results.md", markdown(
      rows, f"TTIR from jax {jax.__version__}'s Pallas, compiled by triton {triton_v} for "
      f"sm_{a.arch}a, {a.sms} SMs (`{res['command']}`)"))


if __name__ == "__main__":
  main()
