"""An indexed LM head over a GGUF file's blocks: each row's K candidate rows multiplied by the
CPU kernel from their bytes (`cpu_matmul.indexed_blocks`) against the rows gathered and widened
to f32 for XLA's einsum (`indexed_lm_head_reference`), on the registry target's own head
(151,936 rows of 1,536), batch 1, K as SpecVocab (1,024), MicroSpec (~3,072) and DynaSpec (4 of
64 clusters: ~9,500) draft over.

    python kernels/indexed_blocks.py [--repeats 30]

Results: kernels/results/indexed_blocks/ (host and command in its README).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
  p.add_argument("--ks", type=int, nargs="+", default=[1024, 3072, 9496])
  p.add_argument("--repeats", type=int, default=30)
  a = p.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.kernels._indexed_common import indexed_lm_head_reference
  from vocabjax.kernels.indexed_lm_head import indexed_lm_head
  from vocabjax.models.llamalike import lm_head_rows

  m = load_model(a.target, load_tokenizer=False, progress=False)
  U = lm_head_rows(m.params, m.config)[0]
  print(f"head: {U.shape} {getattr(U, 'qtype', U.dtype)}", flush=True)
  rows = []
  for K in a.ks:
    idx = jnp.asarray(np.random.RandomState(K).choice(U.shape[0], (1, K), replace=False))
    h = jax.random.normal(jax.random.key(K), (1, U.shape[1]))
    out = {}
    for name, fn in (("kernel", indexed_lm_head), ("widened", indexed_lm_head_reference)):
      f = jax.jit(fn)
      z = f(h, U, idx).block_until_ready()
      ts = []
      for _ in range(a.repeats):
        t = time.perf_counter()
        f(h, U, idx).block_until_ready()
        ts.append(time.perf_counter() - t)
      out[name] = (statistics.median(ts) * 1e3, np.asarray(z))
    diff = float(np.max(np.abs(out["kernel"][1] - out["widened"][1])))
    rows.append({"K": K, "kernel_ms": round(out["kernel"][0], 3),
                 "widened_ms": round(out["widened"][0], 3), "max_abs_diff": diff})
    print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
  main()
