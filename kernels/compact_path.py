"""Tree verification at batch 1: the accepted path's KV move (`tree.compact_path`) in place or not.

  python kernels/compact_path.py --out kernels/results/compact_path.md

The Qwen2.5-Coder-1.5B target's shapes (random weights, f32, a 1024-slot cache holding 512
tokens) on this CPU, each program compiled as the decoders compile their steps
(`lowering.step_lowering`), interleaved, median of repeats:
- plain decoding's step (`Decoder.step_program`: one token, the LM head, sampling);
- `verify_tree` of a root alone (T = 1), a chain of 4 (T = 5) and a 16-node tree (T = 17),
  each with its path compacted by the indexed scatter (one device, the default since this
  script) and by the per-row vmapped dynamic-update-slice that a mesh needs (`row_writes`),
  which batch 1 used before: XLA copies the whole cache for it.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time

import numpy as np


def main(argv=None) -> int:
  import jax
  import jax.numpy as jnp

  from vocabjax.decoding import Decoder, SamplingParams
  from vocabjax.decoding.tree import TreeBounds, verify_tree
  from vocabjax.io import atomic_write_text
  from vocabjax.lowering import decoding_lowering, lowered, step_lowering
  from vocabjax.models import KVCache, LlamaLikeConfig, init_params

  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--steps", type=int, default=8, help="timed calls per program and repeat")
  a = p.parse_args(argv)

  cfg = LlamaLikeConfig(arch="qwen2", vocab_size=151936, hidden_size=1536,
                        intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                        head_dim=128, attention_bias=True, tie_word_embeddings=True)
  params = init_params(jax.random.key(0), cfg, scale=0.02)
  S, N0 = 1024, 512
  greedy = SamplingParams()
  trees = {1: [], 5: [0, 1, 2, 3], 17: [0, 0, 0, 0, 1, 1, 2, 2, 3, 5, 5, 6, 7, 9, 9, 10]}

  def verifier(parents):
    n = len(parents)
    parent = jnp.asarray([parents], jnp.int32)
    depth = np.zeros(n + 1, np.int32)
    for j, q in enumerate(parents):
      depth[j + 1] = depth[q] + 1
    d = max(1, int(depth.max()))
    k = max([parents.count(q) for q in set(parents)] or [1])

    def fn(params, last, cache):
      node_tok = (last[:, None] + 1 + jnp.arange(n)[None]) % cfg.vocab_size
      v = verify_tree(params, last, node_tok, parent, jnp.asarray(depth[None, 1:]), cache,
                      jax.random.key(0), target_config=cfg, tree=TreeBounds(k, d),
                      sampling=greedy)
      return v.next, v.target_cache
    return fn

  abstract = jax.eval_shape(lambda: KVCache.init(cfg, 1, S))
  i32 = jax.ShapeDtypeStruct((1,), jnp.int32)
  progs = {}
  ar, _ = Decoder(params, cfg).step_program(greedy, 1, S, jnp.float32)
  progs["plain decoding step"] = lambda c, t: ar(params, t, c, jax.random.key(0))[::-1]
  for T, parents in trees.items():
    for name, rows in (("scatter", False), ("vmapped", True)):
      lw = step_lowering(decoding_lowering(mesh=False)).replace(row_writes=rows)
      c = jax.jit(lowered(verifier(parents), lw), donate_argnums=(2,)).lower(
          params, i32, abstract).compile()
      progs[f"verify T={T}, {name}"] = lambda cache, t, c=c: c(params, t, cache)[::-1]

  times = {k: [] for k in progs}
  for _ in range(a.repeats):
    for name, run in progs.items():
      cache = KVCache.init(cfg, 1, S)
      tok = jnp.asarray([7], jnp.int32)
      for i in range(a.steps + 1):
        cache = cache.with_lengths(jnp.asarray([N0], jnp.int32))
        t0 = time.perf_counter()
        cache, tok = run(cache, tok)
        jax.block_until_ready(tok)
        if i:  # the first call warms up
          times[name].append(time.perf_counter() - t0)
  base = float(np.median(times["plain decoding step"]))
  lines = ["# Tree verification at batch 1: the accepted path's KV move in place or not", "",
           "`python kernels/compact_path.py " + " ".join(sys.argv[1:] if argv is None else argv) + "`", "",
           f"- {datetime.datetime.now().isoformat(timespec='seconds')}, {platform.processor() or platform.machine()}, "
           f"{jax.default_backend()}, jax {jax.__version__}, {jax.device_count()} device(s)",
           "- Qwen2.5-Coder-1.5B shapes, random weights, f32, cache of 1024 slots holding 512 "
           f"tokens; median of {a.repeats} x {a.steps} calls per program, interleaved", "",
           "| program | median ms | min ms | / plain step |", "|---|---|---|---|"]
  for name, ts in times.items():
    lines.append(f"| {name} | {1000 * np.median(ts):.1f} | {1000 * np.min(ts):.1f} | "
                 f"{np.median(ts) / base:.2f} |")
  atomic_write_text(a.out, "\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
