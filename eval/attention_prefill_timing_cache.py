"""Old prefill attention: the einsum over all S=1024 cache slots with the causal mask, against
the same over S=T, and jax.nn.dot_product_attention, one layer of each real model's shape.

    python eval/attention_prefill_timing_cache.py   # output: eval/results/profile/attention_prefill.txt
"""
import time, numpy as np, jax, jax.numpy as jnp
def tm(f, *a):
  jax.block_until_ready(f(*a)); ts=[]
  for r in range(5):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return min(ts)
for name, K, G, d, L in (("draft", 2, 7, 64, 24), ("target", 2, 6, 128, 28)):
  T, S = 768, 1024
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, T, K, G, d)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((1, S, K, d)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((1, S, K, d)), jnp.float32)
  mask = jnp.asarray(np.tril(np.ones((T, S), bool)))[None]
  def att(q, k, v, mask):
    scores = jnp.einsum("BTKGd,BSKd->BKGTS", q, k, preferred_element_type=jnp.float32) / np.sqrt(d)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("BKGTS,BSKd->BTKGd", probs, v)
  def att_t(q, k, v, mask):
    return att(q, k[:, :T], v[:, :T], mask[:, :, :T])
  print(name, "attention S=1024 per layer ms", tm(jax.jit(att), q, k, v, mask)*1e3, "x", L)
  print(name, "attention S=T per layer ms", tm(jax.jit(att_t), q, k, v, mask)*1e3, "x", L)
  def dpa(q, k, v, mask):
    qq = q.reshape(1, T, K*G, d); kk = jnp.repeat(k[:, :T], G, axis=2); vv = jnp.repeat(v[:, :T], G, axis=2)
    return jax.nn.dot_product_attention(qq, kk, vv, is_causal=True)
  print(name, "jax dpa causal per layer ms", tm(jax.jit(dpa), q, k, v, mask)*1e3)
