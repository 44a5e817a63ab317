"""Grouped int4 on a TPU, deviceless (libtpu on this host, nothing runs): for a weight [D, F]
times x [M, D] (bf16), XLA's HBM count (`bench.tpu.HBM_COST_OPTIONS`: VMEM prefetches priced
out) over what the product must read (codes, scales, x, y), for the layouts XLA's own dot could
take, and whether the compiled program holds the weight widened (a float array of D x F values,
also inside a fusion) with `linear`'s path (the Pallas kernel where it fits). XLA's count does
not see inside a Pallas call, hence no ratio for the kernel.

    python kernels/grouped_int4_bytes.py --out kernels/results/tpu_bytes/grouped_int4.md
"""

from __future__ import annotations

import argparse
import datetime
import re

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.bench.tpu import HBM_COST_OPTIONS
from vocabjax.io import atomic_write_text
from vocabjax.kernels.blocks import BlockWeight, GroupedInt4, dequantize
from vocabjax.kernels.cpu_matmul import linear
from vocabjax.lowering import Lowering
from vocabjax.testing.tpu_aot import lower_for_tpu, not_cached

S = jax.ShapeDtypeStruct
SHAPES = ((4096, 14336), (14336, 4096), (896, 4864), (4864, 896), (256, 37984))
G = 32


def _dot(x, w):
  return jnp.einsum("MD,DF->MF", x, w, preferred_element_type=jnp.float32)


def in_out(scale_dtype):
  def f(x, q, s):  # codes [D, F], scales [D/32, F]
    D, F = q.shape
    w = q.astype(jnp.float32).reshape(D // G, G, F) * s.astype(jnp.float32)[:, None]
    return _dot(x, w.reshape(D, F).astype(x.dtype))
  return f


def out_in(x, q, s):  # codes [F, D], scales [F, D/32]
  F, D = q.shape
  w = q.astype(jnp.float32).reshape(F, D // G, G) * s[:, :, None]
  return _dot(x, w.reshape(F, D).T.astype(x.dtype))


def q4_0_bytes(x, data):  # Q4_0's own blocks [F, row bytes]
  D = x.shape[1]
  return _dot(x, dequantize(BlockWeight(data, "Q4_0", D)).T.astype(x.dtype))


def kernel(x, q, s):
  return linear(x, GroupedInt4(q, s), lowering=Lowering(platform="tpu"))


def widened(hlo: str, n: int) -> bool:
  return any(int(np.prod([int(d) for d in dims.split(",")])) >= n
             for dims in re.findall(r"= (?:bf16|f32|f16)\[([0-9,]+)\]", hlo))


def row(name, fn, args, need, n, topology):
  with not_cached():
    c = lower_for_tpu(fn, *args, topology=topology).compile(HBM_COST_OPTIONS)
  cost = c.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, list) else cost
  got = cost.get("bytes accessed")
  ratio = f"{got / need:.2f}" if got and name != "kernel" else "-"
  return ratio, "yes" if widened(c.as_text(), n) else "no"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--topology", default="v5e:1x1")
  p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
  p.add_argument("--out", help="write the table here (markdown)")
  a = p.parse_args(argv)
  lines = [f"# Grouped int4 on {a.topology}, deviceless", "",
           f"`python kernels/grouped_int4_bytes.py --topology {a.topology}` (jax {jax.__version__}; "
           f"{datetime.datetime.now().isoformat(timespec='seconds')}). HBM / must read: XLA's "
           "count with VMEM prefetches priced out, over codes + scales + x + y; widened: the "
           "program computes a float array of the weight's size.", "",
           "| D x F | M | [D,F] f32 scales | [D,F] f16 scales | [F,D] f32 scales | Q4_0 bytes "
           "| kernel: widened? |", "|---|---|---|---|---|---|---|"]
  for D, F in SHAPES:
    for M in a.rows:
      x = S((M, D), jnp.bfloat16)
      need = D * F // 2 + D // G * F * 4 + M * D * 2 + M * F * 4
      cells = []
      for name, fn, args, nd in (
          ("[D,F] f32", in_out(jnp.float32), (x, S((D, F), jnp.int4), S((D // G, F), jnp.float32)), need),
          ("[D,F] f16", in_out(jnp.float16), (x, S((D, F), jnp.int4), S((D // G, F), jnp.float16)),
           need - D // G * F * 2),
          ("[F,D] f32", out_in, (x, S((F, D), jnp.int4), S((F, D // G), jnp.float32)), need),
          ("Q4_0", q4_0_bytes, (x, S((F, D // 32 * 18), jnp.uint8)),
           F * D // 32 * 18 + M * D * 2 + M * F * 4)):
        cells.append(row(name, fn, args, nd, D * F, a.topology)[0])
      _, kw = row("kernel", kernel, (x, S((D, F), jnp.int4), S((D // G, F), jnp.float32)), need,
                  D * F, a.topology)
      lines.append(f"| {D} x {F} | {M} | " + " | ".join(cells) + f" | {kw} |")
      print(lines[-1], flush=True)
  text = "\n".join(lines) + "\n"
  if a.out:
    atomic_write_text(a.out, text)
  else:
    print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
