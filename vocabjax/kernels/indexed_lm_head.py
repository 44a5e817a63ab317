"""Indexed LM head: logits of selected vocabulary rows only (SpecVocab's
`fused_batched_gather_dot`, Williams et al. 2026).

Letters: B batch rows, D hidden size, V vocabulary, K selected rows per batch row.

    indexed_lm_head(h[B, D], U[V, D], idx[B, K]) -> z[B, K] f32,   z[b, j] = U[idx[b, j]] . h[b]

Equivalent jnp (this is `indexed_lm_head_reference`):

    rows = jnp.take(U, idx, axis=0)                                        # [B, K, D]
    z = jnp.einsum("BKD,BD->BK", rows, h, preferred_element_type=jnp.float32)

XLA materializes `rows`; the Pallas kernels (`indexed_lm_head_gpu`: Triton, `indexed_lm_head_tpu`:
Mosaic) read each selected row once, which makes per-row candidates cheaper than the full head
when K << V. `indexed_lm_head` is a `custom_vjp` (dh = sum_j g[b,j] U[idx[b,j]], dU = scatter-add
of g[b,j] h[b] into rows idx[b,j]) around a dispatcher (`jax.lax.platform_dependent`): on a GPU
the kernel where `vocabjax.kernels.dispatch`'s table says it beats XLA, else XLA's gather; the
TPU kernel on a TPU; the reference elsewhere. `impl=` forces "reference", "gpu" or "tpu"
(`interpret=True` runs a kernel's logic on the CPU). Indices may repeat; an index outside [0, V)
is an error for concrete inputs (`check_indices`) and clamped under tracing, so nothing is read
out of bounds. Kernel internals: docs/engine.md, 'The indexed LM head's GPU and TPU kernels'.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.kernels.blocks import BlockWeight, is_blocks
from vocabjax.kernels import dispatch
from vocabjax.kernels.cpu_matmul import indexed_blocks
from vocabjax.kernels._indexed_common import (IMPLS, check_indices, check_shapes,
                                              indexed_lm_head_reference)
from vocabjax.kernels.indexed_lm_head_gpu import indexed_lm_head_gpu
from vocabjax.kernels.indexed_lm_head_tpu import indexed_lm_head_tpu

__all__ = ["IMPLS", "check_indices", "check_shapes", "indexed_lm_head",
           "indexed_lm_head_gpu", "indexed_lm_head_reference", "indexed_lm_head_sharded",
           "indexed_lm_head_tpu"]


# --- dispatch and gradient ---------------------------------------------------------------------

def _gpu_auto(h, U, idx):
  """The GPU's choice (`vocabjax.kernels.dispatch`): the kernel where it was measured faster on
  this device kind and shape bucket, XLA's gather everywhere else."""
  kind = dispatch.gpu_device_kind()
  config = kind and dispatch.choose(kind, str(jnp.dtype(U.dtype)), h.shape[0], idx.shape[1],
                                    h.shape[1])
  if config is None:
    return indexed_lm_head_reference(h, U, idx)
  return indexed_lm_head_gpu(h, U, idx, **config)


def _forward(h, U, idx, impl: str, interpret: bool):
  if impl == "reference":
    return indexed_lm_head_reference(h, U, idx)
  if impl == "gpu":
    return indexed_lm_head_gpu(h, U, idx, interpret=interpret)
  if impl == "tpu":
    return indexed_lm_head_tpu(h, U, idx, interpret=interpret)
  return jax.lax.platform_dependent(
      h, U, idx, default=indexed_lm_head_reference,
      cuda=_gpu_auto, rocm=_gpu_auto, tpu=indexed_lm_head_tpu)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _indexed(h, U, idx, impl, interpret):
  return _forward(h, U, idx, impl, interpret)


def _indexed_fwd(h, U, idx, impl, interpret):
  return _forward(h, U, idx, impl, interpret), (h, U, idx)


def _indexed_bwd(impl, interpret, res, g):
  del impl, interpret
  h, U, idx = res
  idx = jnp.clip(idx, 0, U.shape[0] - 1)
  rows = jnp.take(U, idx, axis=0)  # [B, K, D]
  dh = jnp.einsum("BK,BKD->BD", g, rows, preferred_element_type=jnp.float32)
  contrib = g[..., None] * h.astype(jnp.float32)[:, None, :]  # [B, K, D]
  dU = jnp.zeros(U.shape, jnp.float32).at[idx.reshape(-1)].add(
      contrib.reshape(-1, U.shape[1]))
  return dh.astype(h.dtype), dU.astype(U.dtype), np.zeros(idx.shape, jax.dtypes.float0)


_indexed.defvjp(_indexed_fwd, _indexed_bwd)


def indexed_lm_head(h: jax.Array, U: jax.Array, idx: jax.Array, *, impl: str = "auto",
                    interpret: bool = False) -> jax.Array:
  """z[b, j] = U[idx[b, j]] . h[b] in f32 (module doc); differentiable in h and U."""
  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
  check_shapes(h, U, idx)
  check_indices(idx, U.shape[0])
  if isinstance(U, BlockWeight):  # GGUF blocks: the K rows' bytes, dequantized by the kernel
    return indexed_blocks(h, U, idx)
  if is_blocks(U):  # grouped int4: the K rows gathered and widened (XLA)
    return indexed_lm_head_reference(h, U, idx)
  return _indexed(h, U, idx.astype(jnp.int32), impl, interpret)


# --- on a mesh ---------------------------------------------------------------------------------

def indexed_lm_head_sharded(h: jax.Array, U: jax.Array, idx: jax.Array, *, mesh,
                            vocab_axis: str = "model", batch_axis: str | None = "data",
                            impl: str = "auto", interpret: bool = False) -> jax.Array:
  """`indexed_lm_head` over a mesh whose `vocab_axis` splits U's rows (the vocabulary-split LM
  head of `vocabjax.sharding`): a Pallas kernel is one device's program, which GSPMD does not
  partition, so it runs under `shard_map`. Each device computes the candidates whose rows it
  owns (its slice of V; the others' indices clamped to its first row and their logits set to
  0) and one sum over `vocab_axis` gives every device the exact logits (each candidate's is the
  one non-zero term, so the sum adds zeros only). h and idx are split by rows over
  `batch_axis` where it divides B (replicated otherwise); the result is placed as h. V must be
  divisible by the vocabulary axis (as the sharding rules split it)."""
  from jax.sharding import PartitionSpec as P

  if impl not in IMPLS:
    raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
  check_shapes(h, U, idx)
  check_indices(idx, U.shape[0])
  n = mesh.shape[vocab_axis]
  V = U.shape[0]
  if V % n:
    raise ValueError(f"the vocabulary V={V} does not split over the {n} devices of mesh axis "
                     f"{vocab_axis!r}: its LM head is replicated there, use indexed_lm_head")
  rows = (batch_axis if batch_axis and batch_axis in mesh.shape
          and h.shape[0] % mesh.shape[batch_axis] == 0 else None)
  local_v = V // n

  def local(h, U, idx):
    lo = jax.lax.axis_index(vocab_axis) * local_v
    j = idx - lo
    mine = (j >= 0) & (j < local_v)
    z = _forward(h, U, jnp.where(mine, j, 0).astype(jnp.int32), impl, interpret)
    return jax.lax.psum(jnp.where(mine, z, 0.0), vocab_axis)

  return jax.shard_map(local, mesh=mesh, in_specs=(P(rows), P(vocab_axis), P(rows)),
                       out_specs=P(rows), check_vma=False)(h, U, idx.astype(jnp.int32))
