"""The q8 kernel (`--dtype gguf-q8`: 8-bit activations, integer dots) on random GGUF blocks of the
registry pair's shapes, 1 and 4 rows of x: milliseconds per call (median of `--repeats`) and
the weight bytes it streams per second. The LM heads (a 151,936-row Q6_K head of the 1.5B
target, the drafter's Q8_0 one: 191 and 145 MB) come from memory on every call; the layer
matrices (2-11 MB) may sit in the last-level cache between calls, as they do not in a
decoding step (kernels/step_trace.py times those).

    python kernels/q8_stream.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from tests.helpers.blocks import random_blocks  # run from the repository root (PYTHONPATH=.)
from vocabjax.kernels.blocks import from_numpy, with_arith
from vocabjax.kernels.cpu_matmul import linear
from vocabjax.lowering import Lowering

SHAPES = [("Q6_K", 151936, 1536, "1.5B target's head"), ("Q8_0", 151936, 896, "0.5B drafter's head"),
          ("Q6_K", 1536, 8960, "w_down"), ("Q4_K", 8960, 1536, "w_gate / w_up"),
          ("Q4_K", 1536, 1536, "wq / wo"), ("Q4_K", 256, 1536, "wk / wv")]


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--repeats", type=int, default=15)
  a = ap.parse_args(argv)
  cpu = Lowering(platform="cpu")
  f = jax.jit(lambda x, w: linear(x, w, lowering=cpu))
  print("| matrix | qtype | shape | M | ms | GB/s |\n|---|---|---|---|---|---|")
  for qtype, F, D, name in SHAPES:
    w = with_arith(from_numpy(random_blocks(qtype, F, D, seed=1), qtype), "q8")
    for M in (1, 4):
      x = jax.random.normal(jax.random.key(0), (M, D))
      f(x, w).block_until_ready()
      times = []
      for _ in range(a.repeats):
        t = time.perf_counter()
        f(x, w).block_until_ready()
        times.append(time.perf_counter() - t)
      ms = float(np.median(times)) * 1e3
      print(f"| {name} | {qtype} | [{F}, {D}] | {M} | {ms:.3f} | "
            f"{w.data.nbytes / ms / 1e6:.1f} |", flush=True)


if __name__ == "__main__":
  main()
