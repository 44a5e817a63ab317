"""A bf16 drafter's chain step on the CPU, with `take_rows` and with the plain `jnp.take` it
replaced: the step program's time, its parts (`step_split`), and whether the compiled step
materializes the drafter's [V, D] embedding (XLA:CPU's f32 gather of a bf16 table, its convert
hoisted out of the drafting loop). Random weights of Qwen2.5-0.5B's shape for the target, its
first 2 layers for the drafter (tied embedding), bf16 weights with f32 activations (what
`load_model(dtype="bfloat16")` gives on the CPU), gamma 3, a 250-token prompt, 64 new tokens.

  python kernels/bf16_table_gather.py              # take_rows (the library)
  python kernels/bf16_table_gather.py --plain-take # jnp.take, as before the fix
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.bench.engine import random_params
from vocabjax.checkpoints.known import resolve_config
from vocabjax.decoding.profile import step_split
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer
from vocabjax.testing.hlo import materialized


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--plain-take", action="store_true", help="jnp.take instead of take_rows")
  a = ap.parse_args(argv)
  if a.plain_take:
    import vocabjax.models.llamalike as ll
    ll.take_rows = lambda t, i, mode=None: jnp.take(t, i, axis=0, mode=mode)
  _, tc = resolve_config("qwen2.5-0.5b-instruct")
  dc = dataclasses.replace(tc, num_layers=2)
  dec = SpeculativeEngine(random_params(tc, "bfloat16", 0), tc,
                          ChainProposer(random_params(dc, "bfloat16", 1), dc, tc, gamma=3))
  prompt = [np.random.RandomState(0).randint(3, 1000, 250).tolist()]
  for _ in range(2):  # the second run is timed (the first compiles)
    res = dec.generate(prompt, max_new_tokens=64, max_len=1024)
  key, = [k for k, _ in dec.compiled_programs().items() if k.program == "prefill"]
  sampling, (B, T, S, dtype) = key.sampling, key.shapes
  start, step, _ = dec.programs(sampling, B, T, S, dtype)  # the ones generate compiled
  _, state = start(jnp.zeros((1, T), jnp.int32), jnp.asarray([250], jnp.int32),
                   jax.random.key(0))
  times = []
  for i in range(10):
    t = time.perf_counter()
    state, *rest = step(dec.target_params, dec.proposer_params, state, jax.random.key(i))
    jax.block_until_ready(rest)
    times.append(time.perf_counter() - t)
  split = step_split(dec, max_len=1024, repeats=5)
  table = (dc.vocab_size, dc.hidden_size)
  print(f"gather: {'jnp.take' if a.plain_take else 'take_rows'}; jax {jax.__version__}")
  print(f"run: {res.steps} steps, decode {res.decode_s:.2f} s, "
        f"{1e3 * res.decode_s / res.steps:.1f} ms per step")
  print(f"step program: median {1e3 * np.median(times):.1f} ms of 10 calls")
  print(f"parts (step_split): drafter {1e3 * split.drafter_s:.1f} ms, drafter head "
        f"{1e3 * split.drafter_head_s:.1f} ms, verification {1e3 * split.verification_s:.1f} ms, "
        f"sum {1e3 * split.step_s:.1f} ms")
  print(f"[V, D] = {table} arrays the step materializes: {materialized(step.as_text(), table)}")


if __name__ == "__main__":
  main()
