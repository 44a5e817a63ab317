"""Operands for the CPU matmul kernel's tests (float and quantized weights with their scales)."""

import jax.numpy as jnp
import numpy as np


def matmul_operands(M, D, F, dtype, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((M, D)), jnp.float32)
  w32 = rng.standard_normal((F, D)).astype(np.float32)
  if dtype == "int8":
    scale = np.abs(w32).max(1) / 127 + 1e-3
    return x, jnp.asarray(np.round(w32 / scale[:, None]).astype(np.int8)), jnp.asarray(
        scale, jnp.float32)
  return x, jnp.asarray(w32).astype(dtype), None
