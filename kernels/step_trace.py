"""Where one decoding step's time goes, op by op: the target's T-token step (body + LM head, the
cache donated, as `vocabjax.bench.engine.Programs` times it) run under JAX's profiler, its
trace's events summed by op (XLA:CPU's thunks: fusions, custom calls to the CPU kernels,
copies), each op's time per step and share of the step.

  python kernels/step_trace.py --model qwen2.5-coder-1.5b-instruct --dtype gguf-q8 \
      --out kernels/results/step_trace/q8_T1

A registry name or a path (`load_model`'s); `--dtype` as `load_model` takes it. Writes
trace.md (the table) and trace.json (the same numbers) under `--out`; the profiler's own files
go to a temporary directory. The profiler's events cost some time of their own: the step's
median wall time is measured before tracing, and the table's total beside it.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import gzip
import json
import re
import tempfile
import time
from pathlib import Path


def _group(name: str) -> str:
  """An op's group: the CPU kernel's targets by kind, XLA's fusions by what they are."""
  n = name.lower()
  if n.startswith("vjattention"):
    return "attention kernel"
  if "vjq8matmul" in n or "matmul" in n or "gemm" in n:
    return "matmul kernel"
  if "attention" in n:
    return "attention kernel"
  if n.startswith(("copy", "bitcast")):
    return "copy"
  if "dynamic-update-slice" in n or "dynamic_update_slice" in n or "scatter" in n:
    return "cache write"
  if "fusion" in n or n.startswith(("add", "multiply", "reduce", "rsqrt", "exp")):
    return "fusion / elementwise"
  return "other"


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--dtype", default="gguf-q8")
  ap.add_argument("--T", type=int, default=1, help="tokens per step (1: a plain step)")
  ap.add_argument("--context", type=int, default=512, help="cached tokens while timing")
  ap.add_argument("--max-len", type=int, default=1024)
  ap.add_argument("--steps", type=int, default=20, help="steps timed, then as many traced")
  ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
  ap.add_argument("--out", required=True)
  a = ap.parse_args(argv)

  import jax
  import numpy as np

  from vocabjax.bench.engine import Programs
  from vocabjax.checkpoints import load_model
  from vocabjax.eval.provenance import cpu_model

  model = load_model(a.model, dtype=a.dtype, load_tokenizer=False)
  # the engine's own T-token target step (body + LM head, the cache donated, every call the
  # same block over `context` cached tokens)
  run = Programs(model.config, model.params, context=a.context, max_len=a.max_len).target(1, a.T)
  prog = run.compiled
  # each op's custom-call target (the CPU kernel's entry points) from the compiled HLO
  targets = dict(re.findall(r"%?([\w.-]+) = [^\n]*custom_call_target=\"([\w]+)\"",
                            prog.as_text()))
  for _ in range(a.warmup):
    jax.block_until_ready(run())
  walls = []
  for _ in range(a.steps):
    t = time.perf_counter()
    jax.block_until_ready(run())
    walls.append(time.perf_counter() - t)
  wall_ms = float(np.median(walls)) * 1e3

  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(a.steps):
        jax.block_until_ready(run())
    (path,) = glob.glob(f"{tmp}/**/perfetto_trace.json.gz", recursive=True)
    with gzip.open(path, "rt") as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  threads = {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "thread_name":
      threads[(e["pid"], e["tid"])] = e["args"]["name"]
  per_op = collections.defaultdict(lambda: [0.0, 0])
  names = collections.Counter()
  for e in events:
    if e.get("ph") != "X":
      continue
    names[threads.get((e["pid"], e["tid"]), "?")] += 1
    thread = threads.get((e["pid"], e["tid"]), "")
    if not re.search(r"xla|tf_|cpu|Xla", thread, re.I) and "hlo_op" not in e.get("args", {}):
      continue
    op = e.get("args", {}).get("hlo_op") or e["name"]
    if op.startswith("ThunkExecutor"):  # the whole program, not an op
      continue
    op = targets.get(op, op).removeprefix("vocabjax_")
    per_op[op][0] += e["dur"] / 1e3
    per_op[op][1] += 1
  rows = sorted(((op, ms / a.steps, n // a.steps) for op, (ms, n) in per_op.items()),
                key=lambda r: -r[1])
  groups = collections.defaultdict(float)
  for op, ms, _ in rows:
    groups[_group(op)] += ms
  total = sum(ms for _, ms, _ in rows)

  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  meta = dict(model=a.model, dtype=a.dtype, T=a.T, context=a.context, steps=a.steps,
              warmup=a.warmup,
              wall_ms=wall_ms, traced_ms=total, date=datetime.date.today().isoformat(),
              host=cpu_model(), jax=jax.__version__,
              threads=dict(names))
  (out / "trace.json").write_text(json.dumps(dict(meta=meta, groups=groups, ops=rows), indent=1))
  lines = [f"# {a.model} [{a.dtype}], T={a.T} step over {a.context} cached tokens", "",
           f"`python kernels/step_trace.py --model {a.model} --dtype {a.dtype} --T {a.T} "
           f"--context {a.context} --steps {a.steps} --warmup {a.warmup} --out {a.out}`; "
           f"{meta['date']}, {meta['host']}, jax "
           f"{jax.__version__}. Step wall time (median, untraced): **{wall_ms:.2f} ms**; ops in "
           f"the trace sum to {total:.2f} ms a step.", "",
           "| group | ms a step | share |", "|---|---|---|"]
  for g, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
    lines.append(f"| {g} | {ms:.2f} | {ms / max(total, 1e-9):.0%} |")
  lines += ["", "| op | ms a step | events a step |", "|---|---|---|"]
  lines += [f"| `{op}` | {ms:.3f} | {n} |" for op, ms, n in rows[:60]]
  (out / "trace.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines[:40]))


if __name__ == "__main__":
  main()
