"""What a drafting step's top-k over the real vocabulary compiles to on TPU (the
measurement before any change): `jax.lax.top_k` over [B, k, V] logits (a tree level: k
frontier nodes' children) at V = 151,936 (Qwen2.5) and 262,144 (Gemma 3), compiled deviceless
for a TPU chip (libtpu's compiler on this CPU host), against three alternatives that give the
same values and indices (ties: lower index first): k rounds of argmax (`sampling.top_k`'s
`split` form), a two-stage top-k (top-k of each block of the vocabulary, then of the block
winners), and `jax.lax.approx_max_k` (not exact; shown for its cost only).

    python kernels/tpu_topk.py --out kernels/results/tpu_topk [--topology v5e:1x1]

Per case: compile seconds (wall, one process, after a warm-up compile), whether the optimized
HLO holds a sort, XLA's flops and bytes accessed (cost analysis; XLA:TPU counts a custom call's
operands, not its work), and the program's temporary memory. Nothing runs: deviceless."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp


def one_stage(x, k):
  return jax.lax.top_k(x, k)


def argmax_rounds(x, k):
  from vocabjax.sampling import top_k

  return top_k(x, k, split=True)


def two_stage(x, k, block: int = 4096):
  """top-k of each `block` of the last axis, then of the winners: the same values and indices
  as one top-k (a winner of the whole row is a winner of its block; stage 2 sees blocks in
  index order and lax.top_k keeps lower positions first on ties, so ties still resolve to the
  lower index)."""
  V = x.shape[-1]
  nb = -(-V // block)
  pad = nb * block - V
  xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], constant_values=-jnp.inf)
  xb = xp.reshape(x.shape[:-1] + (nb, block))
  v1, i1 = jax.lax.top_k(xb, k)  # [..., nb, k]
  i1 = i1 + (jnp.arange(nb, dtype=i1.dtype) * block)[:, None]
  v2, j = jax.lax.top_k(v1.reshape(x.shape[:-1] + (nb * k,)), k)
  return v2, jnp.take_along_axis(i1.reshape(x.shape[:-1] + (nb * k,)), j, axis=-1)


def approx(x, k):
  return jax.lax.approx_max_k(x, k)


FORMS = {"lax.top_k": one_stage, "argmax rounds": argmax_rounds, "two-stage (4096)": two_stage,
         "approx_max_k (inexact)": approx}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True)
  p.add_argument("--topology", default="v5e:1x1")
  p.add_argument("--steps", action="store_true",
                 help="also the tree and EAGLE steps at V = 151,936 (a 2-layer target, 1-layer "
                      "drafter of Qwen2.5-0.5B's width), one top-k and two-stage")
  a = p.parse_args(argv)
  from vocabjax.testing.tpu_aot import compile_for_tpu, lower_for_tpu

  rows = []
  # exactness of the two exact alternatives on the CPU first (values and indices, with ties)
  x = jax.random.normal(jax.random.key(0), (2, 4, 151936)).astype(jnp.bfloat16)
  ref = one_stage(x, 4)
  for name in ("argmax rounds", "two-stage (4096)"):
    got = FORMS[name](x, 4)
    assert all(bool((r == g).all()) for r, g in zip(ref, got)), name
  compile_for_tpu(lambda x: one_stage(x, 4), jax.ShapeDtypeStruct((1, 4, 1024), jnp.float32),
                  topology=a.topology, name="warm-up")
  for V in (151936, 262144):
    for B, k in ((1, 1), (1, 4), (1, 10)):  # a chain's row; a tree level of 4 / 10 nodes
      shape = (B, k, V) if k > 1 else (B, V)
      for name, fn in FORMS.items():
        struct = jax.ShapeDtypeStruct(shape, jnp.float32)
        f = (lambda fn, k: lambda x: fn(x, k))(fn, k)
        t = time.perf_counter()
        compiled = compile_for_tpu(f, struct, topology=a.topology, name=f"{name} V={V}")
        secs = time.perf_counter() - t
        hlo = lower_for_tpu(f, struct, topology=a.topology).compile().as_text() \
            if a.topology.startswith("v5e") else ""
        cost = compiled.cost_analysis() or {}
        cost = cost[0] if isinstance(cost, list) else cost
        mem = compiled.memory_analysis()
        rows.append({"V": V, "shape": list(shape), "k": k, "form": name,
                     "compile_s": round(secs, 2), "sort_in_hlo": " sort(" in hlo or "sort." in hlo,
                     "flops": cost.get("flops"), "bytes_accessed": cost.get("bytes accessed"),
                     "temp_bytes": mem.temp_size_in_bytes})
        print(rows[-1], flush=True)
  steps = _steps(a.topology) if a.steps else []
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  cmd = "python kernels/tpu_topk.py " + " ".join(sys.argv[1:] if argv is None else argv)
  (out / "results.json").write_text(json.dumps({"command": cmd, "topology": a.topology,
                                                 "jax": jax.__version__, "rows": rows}, indent=1))
  lines = [f"# A drafting step's top-k over the vocabulary, compiled for TPU {a.topology} "
           f"(deviceless)", "", f"`{cmd}`", "",
           "f32 logits; 'shape' [B, k, V] is a tree level of k nodes ([B, V] a chain's row). "
           "Compile seconds are wall time in one process after a warm-up compile (this CPU host "
           "runs libtpu's compiler); flops and bytes are XLA's cost analysis.", "",
           "| V | shape | form | compile s | sort in HLO | flops | bytes accessed | temp bytes |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['V']:,} | {r['shape']} | {r['form']} | {r['compile_s']} | "
                 f"{'yes' if r['sort_in_hlo'] else 'no'} | {r['flops'] or 0:,.0f} | "
                 f"{r['bytes_accessed'] or 0:,.0f} | {r['temp_bytes']:,} |")
  if steps:
    lines += ["", "Whole drafting steps at the real vocabulary (`vocabjax.bench.tpu.lower_step`, "
              "S = 256; `TPU_TOP_K_BLOCK` 0 = one top-k, 4096 = two-stage):", "",
              "| method | top-k | compile s | flops | bytes accessed |", "|---|---|---|---|---|"]
    for r in steps:
      lines.append(f"| {r['method']} | {r['top_k']} | {r['compile_s']} | {r['flops'] or 0:,.0f} "
                   f"| {r['bytes_accessed'] or 0:,.0f} |")
    data = json.loads((out / "results.json").read_text())
    data["steps"] = steps
    (out / "results.json").write_text(json.dumps(data, indent=1))
  (out / "README.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


def _steps(topology: str) -> list[dict]:
  from vocabjax.bench import tpu
  from vocabjax.bench import stand_ins
  from vocabjax.models import LlamaLikeConfig

  def qwen2(V: int, L: int) -> LlamaLikeConfig:
    return LlamaLikeConfig(arch="qwen2", vocab_size=V, hidden_size=896, intermediate_size=4864,
                           num_layers=L, num_heads=14, num_kv_heads=2, head_dim=64,
                           attention_bias=True, tie_word_embeddings=True,
                           max_position_embeddings=32768)

  setup = stand_ins.Setup(qwen2(151936, 2), qwen2(151936, 1))
  rows = []
  for method in ("tree_k4d4n16", "eagle_k4d4n16"):
    for block in (0, 4096):
      tpu.TPU_TOP_K_BLOCK = block
      t = time.perf_counter()
      step = tpu.lower_step(method, setup, topology=topology, S=256, compile=True)
      secs = time.perf_counter() - t
      cost = step.programs["step"].compiled.cost_analysis() or {}
      cost = cost[0] if isinstance(cost, list) else cost
      rows.append({"method": method, "top_k": "two-stage (4096)" if block else "one top-k",
                   "compile_s": round(secs, 1), "flops": cost.get("flops"),
                   "bytes_accessed": cost.get("bytes accessed")})
      print(rows[-1], flush=True)
  tpu.TPU_TOP_K_BLOCK = 4096
  return rows


if __name__ == "__main__":
  sys.exit(main())
