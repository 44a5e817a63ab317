"""Where a decoding program's time goes, on the machine it runs on: the target's one-token step,
chain verification blocks, tree verification blocks and the drafter's step, split into the
weight matmuls (every projection, the MLPs and the LM head) and the rest (attention over the
KV cache, cache writes, masks, RoPE, norms), with the bytes of weights read and the GB/s they
reach, for each matmul implementation and weight dtype.

  python kernels/profile_engine.py --out kernels/results/profile/cpu            # ~10 min on 2 cores

Random weights of the registry models' real shapes (timing does not depend on the values;
the same script runs on a GPU machine that cannot receive the real files). Every program is
compiled ahead of time, its cache donated, and timed as the median of `--repeats` calls;
programs of one row of the table are interleaved so that machine noise hits all alike.
`impl`: `kernel` = vocabjax's CPU weight-streaming matmul (`vocabjax.kernels.cpu_matmul`),
`xla` = XLA's dot with the layout the decoders used before it ([out, in] at T = 1, [in, out]
MLP weights for blocks); on the CPU its bf16 path is timed on the target step only (it is an
order of magnitude slower). bf16 on the CPU means bf16 weight matrices with f32 activations
and cache (what `load_model(dtype="bfloat16")` gives there). A memory copy of 1 GB measures
the machine's bandwidth in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np

SHAPES = {  # the registry's pair (Qwen2.5-Coder GGUF metadata)
    "qwen2.5-coder-1.5b-instruct": dict(arch="qwen2", vocab_size=151936, hidden_size=1536,
                                        intermediate_size=8960, num_layers=28, num_heads=12,
                                        num_kv_heads=2, head_dim=128, attention_bias=True),
    "qwen2.5-coder-0.5b-instruct": dict(arch="qwen2", vocab_size=151936, hidden_size=896,
                                        intermediate_size=4864, num_layers=24, num_heads=14,
                                        num_kv_heads=2, head_dim=64, attention_bias=True),
}
# (label, model, T): T = tokens per row the program runs
PROGRAMS = [("target step (T=1)", "qwen2.5-coder-1.5b-instruct", 1),
            ("chain-3 verification (T=4)", "qwen2.5-coder-1.5b-instruct", 4),
            ("chain-4 verification (T=5)", "qwen2.5-coder-1.5b-instruct", 5),
            ("tree 8 nodes verification (T=9)", "qwen2.5-coder-1.5b-instruct", 9),
            ("tree 16 nodes verification (T=17)", "qwen2.5-coder-1.5b-instruct", 17),
            ("drafter step (T=1)", "qwen2.5-coder-0.5b-instruct", 1)]


def memcopy_gbs(nbytes: int = 1 << 30) -> float:
  """numpy copy bandwidth, read + write counted (GB/s)."""
  a = np.ones(nbytes // 4, np.float32)
  b = np.empty_like(a)
  best = min(_wall(lambda: np.copyto(b, a)) for _ in range(5))
  return 2 * nbytes / best / 1e9


def _wall(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def build_programs(cfg, params, T: int, S: int, context: int, kernel: bool = True):
  """(full step: body + LM head with the cache donated, matmuls alone) for T tokens, with the
  CPU kernel (lowered as the decoders' steps) or XLA's dot."""
  import jax
  import jax.numpy as jnp

  from vocabjax.bench.engine import Programs
  from vocabjax.lowering import decoding_lowering, lowered, step_lowering
  from vocabjax.models.llamalike import _proj, compute_dtype, lm_head

  lw = step_lowering(decoding_lowering(mesh=False, cpu_kernel=kernel))

  def matmuls(p, x):  # the same projections on a dummy residual stream, chained
    acc = x
    for layer in p["layers"]:
      q, k, v = (_proj(acc, layer, n, lw) for n in ("wq", "wk", "wv"))
      att = q + jnp.pad(k + v, ((0, 0), (0, 0), (0, q.shape[-1] - k.shape[-1])))
      acc = acc + _proj(att, layer, "wo", lw)
      acc = acc + _proj(_proj(acc, layer, "w_gate", lw) * _proj(acc, layer, "w_up", lw), layer,
                        "w_down", lw)
    return lm_head(p, acc, config=cfg)

  dtype = compute_dtype(params)
  mm = jax.jit(lowered(matmuls, lw)).lower(params, jax.ShapeDtypeStruct(
      (1, T, cfg.hidden_size), dtype)).compile()
  x = jnp.full((1, T, cfg.hidden_size), 0.01, dtype)
  # the full step is the engine bench's target program (`vocabjax.bench.engine.Programs`)
  return (Programs(cfg, params, context=context, max_len=S, lowering=lw).target(1, T),
          lambda: mm(params, x))


def weight_bytes(params) -> int:
  """Bytes the matmuls read: every 2-D weight but the embedding table (only rows are read)."""
  import jax
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return sum(int(a.nbytes) for path, a in leaves if a.ndim == 2 and "embed" not in str(path[0]))


def render(meta: dict, rows: list[dict]) -> list[str]:
  """profile.md's lines."""
  bw, a_context, a_repeats = meta["memcopy_gbs"], meta["context"], meta["repeats"]
  lines = [f"# Decoding programs, op groups ({meta['device']}, {meta['date']})", "",
           f"`{meta['command']}`; jax {meta['jax']}; memory copy {bw:.1f} GB/s (read + write "
           f"counted); context {a_context} cached tokens; median of {a_repeats}. `floor` = "
           f"weight bytes / that copy bandwidth (the matmuls can beat it: reads alone are "
           f"faster than a copy).", "",
           "| program | dtype | impl | total ms | x T=1 step | matmuls ms | matmul GB/s | "
           "rest ms | weights MB | floor ms |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['program']} | {r['dtype']} | {r['impl']} | {r['full_ms']:.1f} | "
                 f"{r['x_step']:.2f} | {r['matmul_ms']:.1f} | {r['matmul_gbs']:.1f} | "
                 f"{r['rest_ms']:.1f} | {r['weight_mb']:.0f} | {r['floor_ms']:.1f} |")
  return lines


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="directory for profile.json and profile.md")
  p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
  p.add_argument("--impls", nargs="+", default=["kernel", "xla"])
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--max-len", type=int, default=1024)
  p.add_argument("--context", type=int, default=512, help="cached tokens while timing")
  a = p.parse_args(argv)

  import jax

  from vocabjax.models import LlamaLikeConfig, init_params
  from vocabjax.models.llamalike import cast_weights, with_mlp_layout

  on_cpu = jax.default_backend() == "cpu"
  impls = [i for i in a.impls if on_cpu or i == "xla"]
  bw = memcopy_gbs()
  print(f"backend {jax.default_backend()}, memory copy {bw:.1f} GB/s", flush=True)
  rows = []
  params = {}
  for model, kw in SHAPES.items():
    cfg = LlamaLikeConfig(**kw)
    base = init_params(jax.random.key(0), cfg)
    for dt in a.dtypes:  # what load_model(dtype=dt) gives on this backend
      params[model, dt] = (cfg, cast_weights(base, dt) if on_cpu else jax.tree.map(
          lambda x: x.astype(dt), base))
    del base
  for label, model, T in PROGRAMS:
    for dt in a.dtypes:
      cfg, prm = params[model, dt]
      runs = {}
      for impl in impls:
        if impl == "xla" and dt != "float32" and on_cpu and (T > 1 or model != PROGRAMS[0][1]):
          continue  # XLA:CPU's bf16 dot runs at ~1 GB/s: measured once, on the target step
        layout = "out_in" if impl == "kernel" or T == 1 or not on_cpu else "in_out"
        runs[impl] = build_programs(cfg, with_mlp_layout(prm, layout), T, a.max_len,
                                    a.context, kernel=impl == "kernel")
      times = {(impl, part): [] for impl in runs for part in ("full", "mm")}
      for fn in [f for pair in runs.values() for f in pair]:
        jax.block_until_ready(fn())  # warm-up
      for _ in range(a.repeats):
        for impl, (full, mm) in runs.items():
          times[impl, "full"].append(_wall(lambda: jax.block_until_ready(full())))
          times[impl, "mm"].append(_wall(lambda: jax.block_until_ready(mm())))
      nbytes = weight_bytes(prm)
      for impl in runs:
        full_s = float(np.median(times[impl, "full"]))
        mm_s = float(np.median(times[impl, "mm"]))
        rows.append(dict(program=label, model=model, T=T, dtype=dt, impl=impl,
                         full_ms=1e3 * full_s, matmul_ms=1e3 * mm_s,
                         rest_ms=1e3 * (full_s - mm_s), weight_mb=nbytes / 1e6,
                         matmul_gbs=nbytes / mm_s / 1e9, floor_ms=1e3 * nbytes / bw / 1e9))
        r = rows[-1]
        print(f"{label:36s} {dt:8s} {impl:6s} {r['full_ms']:7.1f} ms  matmuls "
              f"{r['matmul_ms']:7.1f} ms ({r['matmul_gbs']:5.1f} GB/s)  rest {r['rest_ms']:6.1f}",
              flush=True)
  # per-program ratio to the same model's T=1 step (same dtype and impl)
  for r in rows:
    base = [b for b in rows if b["model"] == r["model"] and b["T"] == 1 and
            b["dtype"] == r["dtype"] and b["impl"] == r["impl"]]
    r["x_step"] = r["full_ms"] / base[0]["full_ms"] if base else float("nan")
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  meta = dict(command="python kernels/profile_engine.py " + " ".join(argv or __import__(
      "sys").argv[1:]), date=datetime.datetime.now().isoformat(timespec="seconds"),
      machine=platform.platform(), processor=platform.processor(), cpus=__import__("os").cpu_count(),
      backend=jax.default_backend(), device=str(jax.devices()[0]), jax=jax.__version__,
      memcopy_gbs=bw, context=a.context, max_len=a.max_len, repeats=a.repeats)
  from vocabjax.io import atomic_write_text
  atomic_write_text(out / "profile.json", json.dumps(dict(meta=meta, rows=rows), indent=1))
  lines = render(meta, rows)
  atomic_write_text(out / "profile.md", "\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
