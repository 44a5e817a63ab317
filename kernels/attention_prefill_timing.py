"""Attention of a 768-token prefill, one layer of each real model's shape (random q, k, v):
causal attention over the block alone, in query chunks of 768/256/128/64, with the operands as
they come ([B, T, K, G, d]) or laid out [B, K, ., d] (what `models.llamalike.fresh_attention`
does, chunk 128). The old formula over all cache slots was
`eval/attention_prefill_timing_cache.py` (removed; `git show dfcb326:eval/attention_prefill_timing_cache.py`).

    python kernels/attention_prefill_timing.py   # output: kernels/results/profile/attention_prefill.txt
"""
import time, numpy as np, jax, jax.numpy as jnp
def tm(f, *a):
  jax.block_until_ready(f(*a)); ts=[]
  for r in range(5):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return min(ts)


def main():
  for name, K, G, d, L in (("draft", 2, 7, 64, 24), ("target", 2, 6, 128, 28)):
    T = 768
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, T, K, G, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, T, K, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, T, K, d)), jnp.float32)
    def chunked(q, k, v, chunk, layout):
      outs = []
      if layout:
        qt = q.transpose(0, 2, 3, 1, 4)  # B K G T d
        kt = k.transpose(0, 2, 1, 3); vt = v.transpose(0, 2, 1, 3)  # B K S d
      for s in range(0, T, chunk):
        e = min(s + chunk, T)
        mask = jnp.arange(e)[None, :] <= jnp.arange(s, e)[:, None]
        if layout:
          sc = jnp.einsum("BKGTd,BKSd->BKGTS", qt[:, :, :, s:e], kt[:, :, :e]) / np.sqrt(d)
        else:
          sc = jnp.einsum("BTKGd,BSKd->BKGTS", q[:, s:e], k[:, :e]) / np.sqrt(d)
        sc = jnp.where(mask, sc, jnp.finfo(jnp.float32).min)
        p = jax.nn.softmax(sc, axis=-1)
        if layout:
          o = jnp.einsum("BKGTS,BKSd->BKGTd", p, vt[:, :, :e]).transpose(0, 3, 1, 2, 4)
        else:
          o = jnp.einsum("BKGTS,BSKd->BTKGd", p, v[:, :e])
        outs.append(o)
      return jnp.concatenate(outs, axis=1)
    for chunk in (768, 256, 128, 64):
      for layout in (False, True):
        f = jax.jit(lambda q, k, v: chunked(q, k, v, chunk, layout))
        print(name, chunk, layout, round(tm(f, q, k, v)*1e3, 1), "ms per layer", flush=True)


if __name__ == "__main__":
  main()
