"""How much of the KV cache a decoding step rewrites on an NVIDIA GPU, read from XLA:GPU's
compiled program without a GPU (`vocabjax.testing.gpu_aot`, deviceless).

A decoding step should read each layer's cache once (attention) and write one slot per layer
in place. This compiles (1) the library's plain decoding step at a real model's shapes and
(2) a small stand-alone model of its cache use (stacked [L, B, S, N, hd] caches, one slot
written per layer, attention over the layer's slice) in four variants, and lists every
instruction outside fusions that writes a whole-cache-sized buffer: copies, transposes, and
dynamic-update-slice fusions (those write in place when they are not fed by a copy).

  python kernels/gpu_cache_traffic.py --out kernels/results/gpu_cache_traffic
  python kernels/gpu_cache_traffic.py --model qwen2.5-coder-1.5b-instruct --slots 4096 \
      --target h200
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from vocabjax.testing.hlo import whole_array_writes as whole_cache_writes  # noqa: E402


def library_step(model: str, slots: int, target: str, sum_attention: bool = False) -> dict:
  from vocabjax.bench import tpu
  from vocabjax.bench import stand_ins
  from vocabjax.checkpoints.known import resolve_config
  from vocabjax.lowering import sum_attention_default

  name, config = resolve_config(model)
  with sum_attention_default(sum_attention):
    step = tpu.lower_step("ar", stand_ins.Setup(config, config), topology="gpu:" + target, S=slots,
                          T=16, compile=True)
  compiled = step.programs["step"].compiled
  shape = (config.num_layers, 1, slots, config.num_kv_heads, config.head_dim)
  mem = compiled.memory_analysis()
  how = ", sum_attention" if sum_attention else ""
  return {"what": f"{name}'s plain decoding step (vocabjax{how}), bf16, B = 1, {slots} slots",
          "cache_mb": step.cache_bytes_per_chip() / 1e6, "temp_mb": mem.temp_size_in_bytes / 1e6,
          "writes": whole_cache_writes(compiled.as_text(), shape)}


def method_steps(target: str, methods=("chain_g3", "tree_k4d4n16"), layers: int = 2,
                 slots: int = 1024) -> list[dict]:
  """Speculative steps (target and drafter: Qwen2.5-0.5B's layers, `layers` each), with and
  without sum attention: whole-cache writes in the step itself and in its loop bodies (the
  drafting loop's run once per drafted token)."""
  import dataclasses

  from vocabjax.bench import tpu
  from vocabjax.bench import stand_ins
  from vocabjax.checkpoints.known import resolve_config
  from vocabjax.lowering import sum_attention_default
  from vocabjax.testing.hlo import whole_array_writes

  _, c = resolve_config("qwen2.5-coder-0.5b-instruct")
  c = dataclasses.replace(c, num_layers=layers)
  shape = (layers, 1, slots, c.num_kv_heads, c.head_dim)
  rows = []
  for method in methods:
    for on in (False, True):
      with sum_attention_default(on):
        step = tpu.lower_step(method, stand_ins.Setup(c, c), topology="gpu:" + target, S=slots,
                              T=16, compile=True)
      text = step.programs["step"].compiled.as_text()
      entry = {n for n, _ in whole_array_writes(text, shape)}
      writes = [(n, k + ("" if n.split("/", 1)[1] in entry else " (loop body)"))
                for n, k in whole_array_writes(text, shape, entry_only=False)]
      rows.append({"what": f"{method}{', sum_attention' if on else ''} (0.5B layers x {layers}, "
                           f"target and drafter)", "cache_mb": 2 * 2 * layers * slots *
                   c.num_kv_heads * c.head_dim / 1e6,
                   "temp_mb": step.programs["step"].compiled.memory_analysis().temp_size_in_bytes
                   / 1e6, "writes": writes})
  return rows


def model_of_the_step(target: str, variant: str, barrier: bool, L=4, S=4096, N=2, e=128,
                      G=6) -> dict:
  """Stand-alone: L layers each write one slot of a stacked cache and attend over their slice,
  by einsum (the library's; "einsum, heads-major": the cache stored [L, B, N, S, hd]) or by
  multiply-and-sum; `barrier`: the layer's attention output and the caches pass an
  optimization barrier together before the next layer writes."""
  from vocabjax.testing import gpu_aot

  heads_major = variant == "einsum, heads-major"
  shape = (L, 1, N, S, e) if heads_major else (L, 1, S, N, e)
  new = (1, N, 1, e) if heads_major else (1, 1, N, e)

  def step(k_all, v_all, q, knew, vnew, pos):
    out = jnp.float32(0)
    at = (0, 0, pos, 0) if heads_major else (0, pos, 0, 0)
    for layer in range(L):
      k_all = jax.lax.dynamic_update_slice(k_all, knew[None], (layer, *at))
      v_all = jax.lax.dynamic_update_slice(v_all, vnew[None], (layer, *at))
      K, V, qq = k_all[layer], v_all[layer], q.reshape(1, 1, N, G, e)
      if variant == "multiply-sum":
        s = (qq[:, :, None].astype(jnp.float32) * K[:, None, :, :, None, :]).sum(-1)
        a = (jax.nn.softmax(s, 2)[..., None] * V[:, None, :, :, None, :]).sum(2)
      else:
        kv = "BNSe" if heads_major else "BSNe"
        s = jnp.einsum(f"BTNQe,{kv}->BNQTS", qq, K, preferred_element_type=jnp.float32)
        a = jnp.einsum(f"BNQTS,{kv}->BTNQe", jax.nn.softmax(s, -1).astype(q.dtype), V)
      if barrier:
        k_all, v_all, a = jax.lax.optimization_barrier((k_all, v_all, a))
      out = out + a.astype(jnp.float32).sum()
    return out, k_all, v_all

  bf = jnp.bfloat16
  args = [jax.ShapeDtypeStruct(s, d) for s, d in ((shape, bf), (shape, bf),
                                                   ((1, 1, N * G * e), bf), (new, bf),
                                                   (new, bf), ((), jnp.int32))]
  compiled = gpu_aot.compile_for_gpu(step, *args, target=target, donate_argnums=(0, 1))
  return {"what": f"model: {variant}" + (" + barrier" if barrier else "") +
          f" ({L} layers, {S} slots, {N} KV heads of {e})",
          "cache_mb": 2 * L * S * N * e * 2 / 1e6,
          "temp_mb": compiled.memory_analysis().temp_size_in_bytes / 1e6,
          "writes": whole_cache_writes(compiled.as_text(), shape)}


def tpu_temp(model: str, slots: int, topology: str = "v5e:1x1") -> str:
  """The same plain step compiled for a TPU (libtpu, deviceless): its temp buffer, beside the
  GPU's (XLA:TPU's compiled HLO is not read back reliably deviceless, tpu_aot's doc)."""
  from vocabjax.bench import tpu
  from vocabjax.bench import stand_ins
  from vocabjax.checkpoints.known import resolve_config

  name, config = resolve_config(model)
  step = tpu.lower_step("ar", stand_ins.Setup(config, config), topology=topology, S=slots, T=16,
                        compile=True)
  mem = step.programs["step"].compiled.memory_analysis()
  return (f"- the same plain step compiled for TPU {topology}: temp "
          f"{mem.temp_size_in_bytes / 1e6:.1f} MB, arguments "
          f"{mem.argument_size_in_bytes / 1e6:.1f} MB, cache "
          f"{step.cache_bytes_per_chip() / 1e6:.1f} MB")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
  p.add_argument("--slots", type=int, default=4096)
  p.add_argument("--target", default="h200", choices=("h100", "h200"))
  p.add_argument("--out", default=None, help="folder for results.md")
  p.add_argument("--tpu", default=None, metavar="TOPOLOGY",
                 help="also compile the plain step for this TPU (e.g. v5e:1x1; needs libtpu)")
  a = p.parse_args(argv)
  rows = [library_step(a.model, a.slots, a.target),
          library_step(a.model, a.slots, a.target, sum_attention=True)]
  rows += method_steps(a.target)
  for variant in ("einsum", "multiply-sum", "einsum, heads-major"):
    for barrier in (False, True):
      rows.append(model_of_the_step(a.target, variant, barrier))
  lines = ["# Whole-cache writes in a decoding step compiled by XLA:GPU (deviceless)", "",
           "`python kernels/gpu_cache_traffic.py " + " ".join(
               sys.argv[1:] if argv is None else argv) + "`", "",
           f"- jax {jax.__version__}, target {a.target}; instructions of the entry computation "
           "that write a buffer of the whole stacked cache's shape or a permutation of it (a "
           "dynamic-update-slice fusion not fed by a copy writes one slot in place)", "",
           "| program | cache MB (K + V) | temp MB | copies | transposes | other | in-place slot "
           "writes |", "|---|---|---|---|---|---|---|"]
  for r in rows:
    def count(kind):
      entry = sum(w == kind for _, w in r["writes"])
      loop = sum(w == kind + " (loop body)" for _, w in r["writes"])
      return f"{entry}" + (f" + {loop} per loop iteration" if loop else "")
    lines.append(f"| {r['what']} | {r['cache_mb']:.1f} | {r['temp_mb']:.1f} | {count('copy')} | "
                 f"{count('transpose')} | {count('other')} | {count('in-place')} |")
  lines.append("")
  if a.tpu:
    lines += [tpu_temp(a.model, a.slots, a.tpu), ""]
  for r in rows:
    lines.append(f"- {r['what']}: " + ", ".join(f"`{i}` ({k})" for i, k in r["writes"]))
  text = "\n".join(lines) + "\n"
  print(text)
  if a.out:
    from vocabjax.io import atomic_write_text

    Path(a.out).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(a.out) / "results.md", text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
