"""A chain-drafting step on one device against the same step on a mesh.

Random weights of the registry models' real shapes (read from their GGUF metadata; timing does
not depend on weight values), a chain of `--gamma` drafts after `--context` committed tokens.
For each placement: the step's median wall time over `--repeats` steps (compile excluded), its
time split (the drafter's forwards, its LM head, the target's verification, each compiled and
timed alone on the same placement by `vocabjax.decoding.profile.step_split`; the step minus
their sum is what the step does besides: acceptance, cache bookkeeping), and the collectives
XLA compiled into the step program (all-reduce, all-gather, reduce-scatter, collective-permute,
all-to-all), counted with the bytes of their results: the communication per step. On this 2-core machine the mesh is virtual (`XLA_FLAGS=
--xla_force_host_platform_device_count=8`, set by this script), so its times measure the
partitioned program's overhead, not a speedup; the bytes are what a real mesh would move.

    python kernels/sharded_step.py --target qwen2.5-coder-1.5b-instruct \
        --draft qwen2.5-coder-0.5b-instruct --mesh model=8 --out kernels/results/sharded_step.md
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

def main(argv=None) -> int:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from vocabjax.checkpoints.gguf_io import config_from_gguf, metadata, open_gguf
  from vocabjax.checkpoints.zoo import resolve
  from vocabjax.decoding import SamplingParams
  from vocabjax.decoding.profile import step_split
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.drafter import ChainProposer
  from vocabjax.io import atomic_write_text
  from vocabjax.models.llamalike import param_shapes
  from jax.sharding import NamedSharding

  from vocabjax.sharding import collectives, make_mesh, param_specs, parse_mesh

  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--target", required=True)
  ap.add_argument("--draft", required=True)
  ap.add_argument("--mesh", action="append", help="a mesh to time beside one device "
                  "(repeatable; default model=8)")
  ap.add_argument("--gamma", type=int, default=3)
  ap.add_argument("--context", type=int, default=256)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--out", required=True)
  a = ap.parse_args(argv)
  a.mesh = a.mesh or ["model=8"]

  def config(name):
    r = open_gguf(resolve(name))
    names = {t.name for t in r.tensors}
    V = int(next(t for t in r.tensors if t.name == "token_embd.weight").shape[-1])
    return config_from_gguf(metadata(r), names, V)

  tc, dc = config(a.target), config(a.draft)

  def params(config, seed, mesh):
    """Random weights (N(0, 0.02) everywhere: timing does not depend on the values), built
    leaf by leaf where they will live: on a mesh each device makes its own shard, with no
    unsharded copy and no whole-model temporaries beside it (the 1.5B + 0.5B pair in f32 with
    attention replicated over 8 devices takes ~14 GB of this machine's memory)."""
    keys = iter(jax.random.split(jax.random.key(seed), 4096))
    is_shape = lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x)  # noqa: E731
    shapes = param_shapes(config)

    def leaf(shape, spec=None):
      out = NamedSharding(mesh, spec) if spec is not None else None
      return jax.block_until_ready(jax.jit(lambda k: 0.02 * jax.random.normal(k, shape),
                                           out_shardings=out)(next(keys)))

    if mesh is None:
      return jax.tree.map(leaf, shapes, is_leaf=is_shape)
    return jax.tree.map(leaf, shapes, param_specs(config, mesh), is_leaf=is_shape)

  B, T, S = 1, a.context, a.context + 64

  rows = [f"# A chain step (gamma {a.gamma}) on one device and on a mesh", "",
          f"Command: `python kernels/sharded_step.py --target {a.target} --draft {a.draft} "
          f"{' '.join('--mesh ' + m for m in a.mesh)} --gamma {a.gamma} --context {a.context} "
          f"--repeats {a.repeats} "
          f"--out {a.out}`; random N(0, 0.02) weights of the real shapes, f32, batch 1; "
          f"{jax.device_count()} {jax.default_backend()} devices "
          f"(virtual: they share this machine's cores).", "",
          "| placement | step ms (median) | drafter body ms | drafter LM head ms | "
          "verification ms | rest ms | collectives per step | bytes moved per step |",
          "|---|---|---|---|---|---|---|---|"]

  def mesh_of(text):  # a mesh smaller than the device count takes the first devices
    spec = parse_mesh(text)
    n = spec.get("data", 1) * spec.get("model", jax.device_count() // spec.get("data", 1))
    return make_mesh(**spec, devices=jax.devices()[:n])

  def measure(label, mesh):  # one placement; everything it built is freed when it returns
    dec = SpeculativeEngine(params(tc, 0, mesh), tc,
                            ChainProposer(params(dc, 1, mesh), dc, tc, gamma=a.gamma), mesh=mesh)
    start, step, _ = dec.programs(SamplingParams(), B, T, S, jnp.float32)
    toks = jnp.asarray(np.random.RandomState(0).randint(0, tc.vocab_size, (B, T)), jnp.int32)
    _, state = start(toks, jnp.full((B,), T, jnp.int32), jax.random.key(0))
    times = []
    for i in range(a.repeats + 1):
      t0 = time.perf_counter()
      state, emitted, _ = step(dec.target_params, dec.proposer_params, state, jax.random.key(i))
      jax.block_until_ready(emitted)
      times.append(time.perf_counter() - t0)
    coll = collectives(step.as_text())
    desc = ", ".join(f"{op} x{n}" for op, (n, _) in coll.items()) or "none"
    nbytes = sum(b for _, b in coll.values())
    step_ms = 1000 * float(np.median(times[1:]))
    del state
    sp = step_split(dec, batch_size=B, max_len=S, context=T, repeats=a.repeats)
    parts = [1000 * x for x in (sp.drafter_s, sp.drafter_head_s, sp.verification_s)]
    return (f"| {label} | {step_ms:.1f} | "
            + " | ".join(f"{x:.1f}" for x in parts)
            + f" | {step_ms - sum(parts):.1f} | {desc} | {nbytes:,} |")

  for label, text in [("one device", None)] + [(f"mesh {m}", m) for m in a.mesh]:
    rows.append(measure(label, mesh_of(text) if text else None))
    print(rows[-1], flush=True)
    jax.clear_caches()
    gc.collect()
  atomic_write_text(a.out, "\n".join(rows) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
