"""Prefill of the real pair's models, each as its own compiled program: the 1.5B target in f32,
the 0.5B drafter in f32 and int8 (weight-only), each exactly and with the drafter prefill's bf16
GEMM (`draft_prefill="bf16"`, the speculative decoders' default), prompt blocks of 256 and 768
tokens, a cache of 1024 slots; three timed runs each (the first includes one-off costs).

    python kernels/prefill_timing.py     # output recorded in kernels/results/profile/prefill.txt
"""
import time, jax, jax.numpy as jnp
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.autoregressive import abstract_cache
from vocabjax.decoding.drafter import compile_draft_prefill
from vocabjax.models.cache import KVCache
from vocabjax.models.llamalike import cast_weights


def main():
  t = load_model("qwen2.5-coder-1.5b-instruct", load_tokenizer=False)
  d = load_model("qwen2.5-coder-0.5b-instruct", load_tokenizer=False)
  d8 = cast_weights(d.params, "int8")
  S = 1024
  for T in (256, 768):
    toks = jnp.ones((1, T), jnp.int32); L = jnp.asarray([T - 5], jnp.int32)
    for name, p, c, prec in (("target f32", t.params, t.config, "exact"),
                             ("draft f32", d.params, d.config, "exact"),
                             ("draft f32 bf16-prefill", d.params, d.config, "bf16"),
                             ("draft int8", d8, d.config, "exact"),
                             ("draft int8 bf16-prefill", d8, d.config, "bf16")):
      f = compile_draft_prefill(p, c, 1, T, abstract_cache(c, 1, S, jnp.float32), prec)
      ts = []
      for r in range(3):
        a = time.perf_counter(); jax.block_until_ready(f(p, toks, L, KVCache.init(c, 1, S, jnp.float32))); ts.append(time.perf_counter() - a)
      print(T, name, [round(x, 2) for x in ts], flush=True)


if __name__ == "__main__":
  main()
