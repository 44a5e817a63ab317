"""The CPU attention kernel alone, as a decoding step calls it: 28 layers of the 1.5B target's
shape (2 KV heads of 6 query heads, head size 128) over a stacked f32 cache of 1,024 slots,
T query tokens seeing `visible` slots; ms for all 28 layers (median of 15 calls).

    PYTHONPATH=. python kernels/attention_step.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.kernels.cpu_matmul import attention

L, B, S, N, G, HD = 28, 1, 1024, 2, 6, 128


def main() -> None:
  k = jax.random.normal(jax.random.key(1), (L, B, S, N, HD))
  v = jax.random.normal(jax.random.key(2), (L, B, S, N, HD))
  f = jax.jit(lambda q, k, v, m: sum(attention(q, k, v, m, 11.3, layer=i) for i in range(L)))
  print("| T | visible slots | ms (28 layers) |\n|---|---|---|")
  for T, visible in [(1, 512), (4, 512), (1, 1000)]:
    q = jax.random.normal(jax.random.key(3), (B, T, N, G, HD))
    mask = jnp.broadcast_to(jnp.arange(S)[None, None] < visible, (B, T, S))
    f(q, k, v, mask).block_until_ready()
    times = []
    for _ in range(15):
      t = time.perf_counter()
      f(q, k, v, mask).block_until_ready()
      times.append(time.perf_counter() - t)
    print(f"| {T} | {visible} | {float(np.median(times)) * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
  main()
