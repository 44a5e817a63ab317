"""Seconds `load_model` takes for the default suite's registry models (GGUF), and a sha1 of
every loaded tensor, so two commits' loaders can be compared for speed and for identical
weights.

    python kernels/gguf_load_time.py --out /tmp/h.json [--models NAME:DTYPE ...]

Results: kernels/results/profile/gguf_load.txt (before and after the faster
GGUF reading, dequantization and finiteness check; the same bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

DEFAULT = ("qwen2.5-coder-1.5b-instruct:float32", "qwen2.5-coder-0.5b-instruct:int8")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True, help="JSON: model -> tensor path -> sha1")
  p.add_argument("--models", nargs="+", default=list(DEFAULT), help="NAME:DTYPE (registry)")
  a = p.parse_args(argv)
  import jax
  import numpy as np

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.io import atomic_write_text

  out = {}
  for spec in a.models:
    name, dtype = spec.rsplit(":", 1)
    t = time.perf_counter()
    m = load_model(name, dtype=dtype, progress=False)
    seconds = time.perf_counter() - t
    flat = jax.tree_util.tree_flatten_with_path(m.params)[0]
    out[spec] = {jax.tree_util.keystr(k): hashlib.sha1(np.asarray(v).tobytes()).hexdigest()
                 for k, v in flat}
    print(f"{spec}: load_model {seconds:.1f} s, {len(flat)} tensors", file=sys.stderr,
          flush=True)
  atomic_write_text(a.out, json.dumps(out))


if __name__ == "__main__":
  main()
