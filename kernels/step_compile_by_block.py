"""Seconds a speculative decoder spends compiling when a prompt of a new length bucket (prompt
block T) comes: the eval suite's chain and tree methods on its real models, `programs()` at
T = 64 and then T = 128 into one cache (the suite's `max_len`). The step is now
compiled once per (B, S) and a new block compiles only its prefills.

    python kernels/step_compile_by_block.py [--suite default] [--blocks 64 128]

Results: kernels/results/profile/step_compile_by_block.txt (before and after the change,
run back to back on one host).
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--suite", default="default", help="an eval suite (name or YAML path)")
  p.add_argument("--blocks", type=int, nargs="+", default=[64, 128], help="prompt blocks T")
  a = p.parse_args(argv)
  import jax.numpy as jnp

  from vocabjax.decoding import SamplingParams
  from vocabjax.eval.config import load_config
  from vocabjax.eval.runner import load_models
  from vocabjax.methods import METHODS

  cfg = load_config(a.suite)
  S = cfg.max_len or 1024
  models = load_models(cfg)
  for m in cfg.methods:
    if m.method not in ("chain", "tree"):
      continue
    method = METHODS[m.method]
    draft = models.draft if method.needs_draft else None
    dec = method.make(models.target, draft, m.kwargs, None)
    for T in a.blocks:
      t = time.perf_counter()
      dec.programs(SamplingParams(), 1, T, S, jnp.float32)
      print(f"{m.name}: T = {T}, S = {S}: programs() took {time.perf_counter() - t:.2f} s",
            flush=True)


if __name__ == "__main__":
  main()
