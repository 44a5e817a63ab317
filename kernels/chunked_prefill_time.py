"""A long prompt's prefill of the default suite's target in one block against chunks of
`--chunk` tokens (`autoregressive.chunked_prefill`): seconds per call (two calls each, after
compilation), and the first tokens both give.

    python kernels/chunked_prefill_time.py --lengths 2000,1500 --chunk 1024 --slots 2048
    python kernels/chunked_prefill_time.py --lengths 709,256 --chunk 128 --slots 1024

Results: kernels/results/program_memory/README.md (the host beside them).
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--suite", default="default")
  p.add_argument("--lengths", default="2000,1500")
  p.add_argument("--chunk", type=int, default=1024)
  p.add_argument("--slots", type=int, default=2048)
  a = p.parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding import SamplingParams, autoregressive
  from vocabjax.decoding.autoregressive import (Decoder, lower_target_prefill,
                                                target_prefill_program)
  from vocabjax.decoding.engine import DecoderPrograms
  from vocabjax.eval.config import load_config
  from vocabjax.models import KVCache

  autoregressive.PROMPT_CHUNK = a.chunk
  t = load_model(load_config(a.suite).target, progress=False)
  low, S = Decoder(t.params, t.config).lowering, a.slots
  for n in (int(x) for x in a.lengths.split(",")):
    T = -(-n // 128) * 128
    tokens = jnp.asarray(np.random.RandomState(0).randint(100, 20000, (1, T)), jnp.int32)
    lengths = jnp.asarray([n], jnp.int32)
    one = lower_target_prefill(t.params, t.config, SamplingParams(), 1, T, S, jnp.float32,
                               lowering=low).compile()
    chunked, _ = target_prefill_program(DecoderPrograms(lambda: "timing"), t.params, t.config,
                                        SamplingParams(), 1, T, S, jnp.float32, lowering=low)
    for name, f in (("one block", one), ("chunked", chunked)) * 2:
      t0 = time.perf_counter()
      out = f(t.params, tokens, lengths, KVCache.init(t.config, 1, S), jax.random.key(0))
      jax.block_until_ready(out[0])
      print(f"n={n} T={T} {name}: {time.perf_counter() - t0:.2f} s, first token "
            f"{int(out[0][0])}", flush=True)


if __name__ == "__main__":
  main()
