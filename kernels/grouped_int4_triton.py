"""The GPU grouped-int4 kernel (`vocabjax.kernels.grouped_int4_gpu`) compiled for a Hopper GPU
without a GPU: Pallas lowers it to Triton IR here, the `triton` package compiles that for
sm_90a and its `ptxas` assembles it (as kernels/triton_inspect.py does for the indexed LM head).
Per matrix shape of the real pairs and configuration (block_d, block_f, num_warps): whether it
compiles, registers per thread and spills, shared memory, 16-byte loads per loop body, the
programs an SM holds and the grid's size. What it does not give: times.

    pip download --no-deps triton==3.9.0 -d /tmp/tw
    pip install --no-deps --target /tmp/tritondir /tmp/tw/triton-3.9.0-*.whl
    python kernels/grouped_int4_triton.py --triton-path /tmp/tritondir \\
        --out kernels/results/grouped_int4_triton
"""

from __future__ import annotations

import argparse
import datetime
import functools
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import triton_inspect as ti  # noqa: E402

# (name, D, F): Qwen2.5-Coder-1.5B and Llama-3.1-8B's matrices ([in, out]), their LM heads
SHAPES = (("1.5B qkv/o", 1536, 1536), ("1.5B k/v", 1536, 256), ("1.5B gate/up", 1536, 8960),
          ("1.5B down", 8960, 1536), ("1.5B head", 1536, 151936), ("8B q/o", 4096, 4096),
          ("8B k/v", 4096, 1024), ("8B gate/up", 4096, 14336), ("8B down", 14336, 4096),
          ("8B head", 4096, 128256))


def compile_row(M: int, D: int, F: int, dtype: str, cfg: dict, triton_path: str,
                arch: int = 90) -> dict:
  import jax
  import jax.numpy as jnp

  from vocabjax.jax_internals import triton_ir
  from vocabjax.kernels import grouped_int4_gpu as g

  sd = jax.ShapeDtypeStruct
  fn = functools.partial(g.grouped_matmul, block_d=cfg["block_d"], block_f=cfg["block_f"])
  mods = triton_ir(fn, sd((M, D), jnp.dtype(dtype)), sd((D, F), jnp.int4),
                   sd((D // 32, F), jnp.float32))
  bd, bf = g.blocks_for(D, F, cfg["block_d"], cfg["block_f"])
  row = {"M": M, "D": D, "F": F, "dtype": dtype, **cfg, "block_d_used": bd, "block_f_used": bf,
         "splits": g.splits_for(D, F, bd, bf), "programs": M * (F // bf) * g.splits_for(
             D, F, bd, bf)}
  with tempfile.TemporaryDirectory() as tmp:
    f = Path(tmp, "k.ttir")
    f.write_text(mods[0])
    env = {**os.environ, "PYTHONPATH": triton_path, "TRITON_DEFAULT_FP_FUSION": "1"}
    r = subprocess.run([sys.executable, ti.__file__, "--compile-child", str(f),
                        str(cfg["num_warps"]), "3", str(arch)], capture_output=True, text=True,
                       env=env, timeout=600)
  if r.returncode:
    return {**row, "error": r.stderr.strip()[-600:]}
  c = json.loads(r.stdout.strip().splitlines()[-1])
  row.update(triton=c["triton"], shared=c["shared"], **ti.ptxas_info(c["ptx"], c["bin"], arch),
             ld_v4=len(re.findall(ti.PTX_COUNTS["ld_v4"], c["ptx"])))
  row.update(ti.occupancy(row["regs"], row["shared"], cfg["num_warps"]))
  return row


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", type=Path, required=True)
  p.add_argument("--triton-path", required=True, help="a directory holding the triton package")
  p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
  p.add_argument("--block-d", type=int, nargs="+", default=[32, 64])
  p.add_argument("--block-f", type=int, nargs="+", default=[64, 128])
  p.add_argument("--num-warps", type=int, nargs="+", default=[4, 8])
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  a = p.parse_args(argv)
  rows = []
  for (name, D, F), M in itertools.product(SHAPES, a.rows):
    for bd, bf, nw in itertools.product(a.block_d, a.block_f, a.num_warps):
      row = {"shape": name, **compile_row(M, D, F, a.dtype, {"block_d": bd, "block_f": bf,
                                                               "num_warps": nw}, a.triton_path)}
      rows.append(row)
      print(json.dumps({k: row.get(k) for k in ("shape", "M", "block_d", "block_f", "num_warps",
                                                  "regs", "spill_bytes", "programs_per_sm",
                                                  "programs", "error")}), flush=True)
  from vocabjax.io import atomic_write_text

  meta = {"command": "python kernels/grouped_int4_triton.py " + " ".join(
      sys.argv[1:] if argv is None else argv), "date": datetime.date.today().isoformat(),
      "rows": rows}
  a.out.mkdir(parents=True, exist_ok=True)
  atomic_write_text(a.out / "results.json", json.dumps(meta, indent=1) + "\n")
  lines = ["# The GPU grouped-int4 kernel compiled for sm_90a (no GPU)", "",
           f"`{meta['command']}` ({meta['date']}, Triton {rows[0].get('triton', '?')}, "
           f"x in {a.dtype})", "",
           "| shape | D x F | rows | block_d, block_f, warps | regs | spill B | shared B | "
           "ld.v4 | programs / SM (limit) | grid |", "|---" * 10 + "|"]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['shape']} | {r['D']} x {r['F']} | {r['M']} | {r['block_d']}, "
                   f"{r['block_f']}, {r['num_warps']} | FAILED: {r['error'][-120:]} |||||")
      continue
    lines.append(f"| {r['shape']} | {r['D']} x {r['F']} | {r['M']} | {r['block_d_used']}, "
                 f"{r['block_f_used']}, {r['num_warps']} | {r['regs']} | {r['spill_bytes']} | "
                 f"{r['shared']} | {r['ld_v4']} | {r['programs_per_sm']} ({r['limited_by']}) | "
                 f"{r['programs']} |")
  atomic_write_text(a.out / "results.md", "\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
