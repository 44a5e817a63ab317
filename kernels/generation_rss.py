"""Resident memory after each generation of the default suite's methods over prompts of given
lengths (random tokens, no EOS), the program count beside it: which generations compile
programs that stay resident, and whether anything grows without new programs.

    python kernels/generation_rss.py --lengths 51,709,84,671,152 --new-tokens 32 --passes 1

Results: kernels/results/program_memory/ (the host and the command in its README).
"""

from __future__ import annotations

import argparse
import gc
import json
import time


def rss() -> dict:
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      key = line.split(":")[0]
      if key in ("VmRSS", "RssAnon", "RssFile"):
        out[key] = round(int(line.split()[1]) / 2**20, 3)  # GiB
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--suite", default="default")
  p.add_argument("--lengths", default="51,56,709,39,84,671,152",
                 help="prompt lengths (the default suite's)")
  p.add_argument("--new-tokens", type=int, default=32)
  p.add_argument("--passes", type=int, default=1)
  a = p.parse_args(argv)
  import numpy as np

  from vocabjax.backends import trim_heap
  from vocabjax.decoding.engine import PROGRAMS
  from vocabjax.eval.config import load_config
  from vocabjax.eval.runner import load_models
  from vocabjax.methods import METHODS

  def note(what: str, **extra) -> None:
    gc.collect()
    trim_heap()
    print(json.dumps({"what": what, **rss(), "programs": len(PROGRAMS), **extra}), flush=True)

  note("start")
  cfg = load_config(a.suite)
  models = load_models(cfg, progress=False)
  note("models loaded")
  decoders = {}
  for m in cfg.methods:
    method = METHODS[m.method]
    decoders[m.name] = method.make(models.target, models.draft if method.needs_draft else None,
                                   m.kwargs, None)
  rng = np.random.default_rng(0)
  for i in range(a.passes):
    for n in (int(x) for x in a.lengths.split(",")):
      x = rng.integers(100, 20000, n).tolist()
      for name, dec in decoders.items():
        t = time.perf_counter()
        dec.generate([x], max_new_tokens=a.new_tokens, max_len=cfg.max_len)
        note(f"pass {i} n={n} {name}", s=round(time.perf_counter() - t, 1))


if __name__ == "__main__":
  main()
