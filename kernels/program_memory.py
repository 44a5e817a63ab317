"""Resident memory of the main job's compiled programs: the default suite's models and methods,
each method's programs for prompt blocks T, the process's resident set after each, each
program's generated code size (XLA's `memory_analysis`), and what emptying the program cache
gives back.

    python kernels/program_memory.py [--suite default] [--blocks 64 192]

Results: kernels/results/program_memory/ (the host and the command in its README).
"""

from __future__ import annotations

import argparse
import gc
import json
import time


def rss_gib() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 2**20
  return float("nan")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--suite", default="default", help="an eval suite (name or YAML path)")
  p.add_argument("--blocks", type=int, nargs="+", default=[64, 192], help="prompt blocks T")
  p.add_argument("--out", default="", help="write the rows as JSON here")
  a = p.parse_args(argv)
  import jax.numpy as jnp

  from vocabjax.backends import trim_heap
  from vocabjax.decoding import SamplingParams
  from vocabjax.decoding.engine import PROGRAMS
  from vocabjax.eval.config import load_config
  from vocabjax.eval.runner import load_models
  from vocabjax.methods import METHODS

  rows = []

  def note(what: str, **extra) -> None:
    trim_heap()
    rows.append({"what": what, "rss_gib": round(rss_gib(), 3), "programs": len(PROGRAMS),
                 **extra})
    print(json.dumps(rows[-1]), flush=True)

  cfg = load_config(a.suite)
  S = cfg.max_len or 1024
  note("start")
  models = load_models(cfg)
  note("models loaded")
  decoders = {}
  for m in cfg.methods:
    method = METHODS[m.method]
    draft = models.draft if method.needs_draft else None
    decoders[m.name] = method.make(models.target, draft, m.kwargs, None)
  note("decoders made")
  for T in a.blocks:
    for name, dec in decoders.items():
      t = time.perf_counter()
      dec.programs(SamplingParams(), 1, T, S, jnp.float32)
      note(f"{name} T={T}", seconds=round(time.perf_counter() - t, 1))
  sizes = []
  for (key, _scope, _), prog in list(PROGRAMS._table.items()):
    try:
      ma = prog.memory_analysis()
      code = getattr(ma, "generated_code_size_in_bytes", None)
      temp = getattr(ma, "temp_size_in_bytes", None)
    except Exception as e:  # noqa: BLE001 - a program kind without the analysis
      code = temp = repr(e)[:60]
    sizes.append({"program": key.program, "shapes": str(key.shapes)[:80],
                  "code_bytes": code, "temp_bytes": temp})
  for s in sizes:
    print(json.dumps(s), flush=True)
  PROGRAMS.clear()
  gc.collect()
  note("program cache emptied (decoders kept)")
  del decoders
  gc.collect()
  note("decoders dropped")
  if a.out:
    with open(a.out, "w") as f:
      json.dump({"rows": rows, "programs": sizes}, f, indent=1)


if __name__ == "__main__":
  main()
