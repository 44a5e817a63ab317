"""Weight-streaming skinny matmul for XLA:CPU (`cpu_matmul.cc`): the projections of decoding.

Letters: M rows of x (batch x block tokens), D input width, F output width.

    linear(x[..., D], w[F, D], scale[F] | None) -> y[..., F] f32
    # = linear_reference: jnp.einsum("...D,FD->...F", x, w.astype(jnp.float32))
    #                     * (scale if scale is not None else 1)

Why: decoding is memory bound, so a block of M = 2..64 tokens should cost about one pass over
the weights, but XLA:CPU runs M >= 2 as a GEMM that repacks the weights first and has no fast
bf16 or int8 weight path. The kernel reads each weight row once in its stored dtype (f32, bf16,
int8 with per-row scales), widens it in registers and multiplies all M rows in exact f32; a
row's result does not depend on M, so a token's logits in a verified block equal its one-token
logits bit for bit. It runs on the CPU for M <= `MAX_ROWS` and any M in decoding steps
(`Lowering.any_rows`); elsewhere XLA's dot (on the CPU over f32-widened weights). A bf16 GEMM in
the same library rounds x to bf16, so it runs only under `Lowering.bf16_blocks` (a drafter's or
bf16 model's prefill). Built on first use (`-O3 -march=native`, or `VOCABJAX_CPU_MARCH`) into
`$VOCABJAX_CACHE/kernels/`; `Lowering(cpu_kernel=False)`, `VOCABJAX_CPU_KERNEL=0` (at import) or
`cpu_kernel_default(False)` turn it off, and without a compiler XLA's dot is used with a warning.
`linear` has a custom VJP in jnp. Figures and details: docs/engine.md, 'CPU speed'.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.kernels import grouped_int4_gpu, grouped_int4_tpu
from vocabjax.kernels._indexed_common import indexed_lm_head_reference
from vocabjax.kernels.blocks import (BLOCK_TYPES, Q8_TYPES, BlockWeight, GroupedInt4,
                                     dequantize, grouped_in_out, is_blocks)
from vocabjax.lowering import Lowering

MAX_ROWS = 64  # largest M (rows of x) the kernel takes; larger blocks are compute bound
_SOURCE = Path(__file__).with_name("cpu_matmul.cc")
_TARGETS = {"float32": "VjSkinnyMatmulF32", "bfloat16": "VjSkinnyMatmulBF16",
            "int8": "VjSkinnyMatmulInt8"}
_GEMM_TARGETS = {"float32": "VjGemmBF16F32", "bfloat16": "VjGemmBF16BF16",
                 "int8": "VjGemmBF16Int8"}
# GGUF blocks (`blocks.BlockWeight`) by type: the streaming kernel and the bf16 GEMM
_BLOCK_TARGETS = {q: f"VjSkinnyMatmul{q}" for q in BLOCK_TYPES}
_BLOCK_GEMM_TARGETS = {q: f"VjGemmBF16{q}" for q in BLOCK_TYPES}
# blocks with arith "q8" (int8 activations, integer dots: llama.cpp's arithmetic)
_Q8_TARGETS = {q: f"VjQ8Matmul{q}" for q in Q8_TYPES}
# attention over the cache by the caches' dtype (`attention`)
_ATTENTION_TARGETS = {"float32": "VjAttentionF32", "bfloat16": "VjAttentionBF16"}
# one layer's blocks of several, the layer an operand (`layer_linear`, `layer_dequantize`)
_LAYER_TARGETS = ("VjLayerMatmul", "VjLayerDequantize")
# the kernel's block type codes (its QT enum's order)
QTYPE_CODES = {q: i for i, q in enumerate(
    ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"))}

GEMM_MIN_ROWS = 32  # smallest M the bf16 GEMM takes (below it the streaming kernel is as fast)
_built = {"lib": None, "error": None, "warned": False}  # the built library (or why not)
_lock = threading.Lock()


@jax.custom_vjp
def bf16_dot(x: jax.Array, w: jax.Array) -> jax.Array:
  """x[..., D] . w[F, D]^T with both operands rounded to bf16 and f32 accumulation; the
  gradient's two products round their operands the same way (as PyTorch's autocast does), and
  come back in x's and w's dtypes."""
  return _bf16_product(x, w)


def _bf16_product(x, w):
  return jnp.einsum("...D,FD->...F", x.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
                    preferred_element_type=jnp.float32)


def _bf16_dot_fwd(x, w):
  return _bf16_product(x, w), (x, w)


def _bf16_dot_bwd(res, g):
  x, w = res
  gb = g.astype(jnp.bfloat16)
  dx = jnp.einsum("...F,FD->...D", gb, w.astype(jnp.bfloat16),
                  preferred_element_type=jnp.float32)
  lead = "".join(chr(ord("a") + i) for i in range(x.ndim - 1))
  dw = jnp.einsum(f"{lead}F,{lead}D->FD", gb, x.astype(jnp.bfloat16),
                  preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(w.dtype)


bf16_dot.defvjp(_bf16_dot_fwd, _bf16_dot_bwd)


def gemm_available() -> bool:
  """Whether the bf16 GEMM computes here (the kernel built with AVX512-BF16)."""
  lib = load()
  return lib is not None and bool(lib.vj_has_bf16_gemm())


def uses_gemm(x_shape, x_dtype, w_dtype, lowering: Lowering = Lowering()) -> bool:
  """Whether `linear` on these operands lowers to the bf16 GEMM under `lowering`."""
  M = int(np.prod(x_shape[:-1], dtype=np.int64))
  return (lowering.bf16_blocks and lowering.cpu_kernel and _on_cpu(lowering)
          and M >= GEMM_MIN_ROWS and jnp.dtype(x_dtype).name in ("float32", "bfloat16")
          and jnp.dtype(w_dtype).name in _GEMM_TARGETS and gemm_available())


@functools.cache
def cpuinfo() -> dict[str, str]:
  """The first processor's fields of /proc/cpuinfo ({} where there is none), e.g. "model name"
  and "flags"."""
  out: dict[str, str] = {}
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if not line.strip():
        break
      key, _, value = line.partition(":")
      out.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  return out


def has_native_bf16() -> bool:
  """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16): where it does not,
  oneDNN's bf16 matmuls (transformers in bf16) run far slower than its f32 ones."""
  flags = set(cpuinfo().get("flags", "").split())
  return bool(flags & {"avx512_bf16", "amx_bf16"})


def library_path() -> Path:
  """Where the compiled kernel for this source, jaxlib and CPU lives."""
  import jaxlib
  key = hashlib.sha256(_SOURCE.read_bytes() + jaxlib.__version__.encode()
                       + cpuinfo().get("flags", sys.platform).encode()
                       + march().encode()).hexdigest()[:16]
  root = Path(os.environ.get("VOCABJAX_CACHE", Path.home() / ".cache" / "vocabjax"))
  return root / "kernels" / f"cpu_matmul-{key}.so"


def march() -> str:
  """The `-march` the kernel is built for: `VOCABJAX_CPU_MARCH`, else "native"."""
  value = os.environ.get("VOCABJAX_CPU_MARCH", "").strip() or "native"
  if not all(c.isalnum() or c in "-_." for c in value):
    raise ValueError(f"VOCABJAX_CPU_MARCH={value!r} is not a compiler target name (e.g. "
                     f"native, x86-64-v3, skylake-avx512)")
  return value


def build(force: bool = False) -> Path:
  """Compile the kernel (atomically: a half-written library is never loaded) and return it."""
  out = library_path()
  if out.exists() and not force:
    return out
  cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which(
      "clang++")
  if not cxx:
    raise RuntimeError("no C++ compiler (g++, c++ or clang++) on PATH; set CXX")
  out.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name, suffix=".partial")
  os.close(fd)
  cmd = [cxx, "-O3", f"-march={march()}", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno",
         "-ffp-contract=off", "-w",
         f"-I{jax.ffi.include_dir()}", str(_SOURCE), "-o", tmp]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
      raise RuntimeError(f"building {_SOURCE.name} failed ({' '.join(cmd)}):\n"
                         f"{proc.stderr[-2000:]}")
    os.replace(tmp, out)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return out


def load():
  """Build (once) and register the kernel's FFI targets; None (with a warning) if that fails."""
  with _lock:
    if _built["lib"] is not None or _built["error"] is not None:
      return _built["lib"]
    try:
      lib = ctypes.cdll.LoadLibrary(str(build()))
      for target in (*_TARGETS.values(), *_GEMM_TARGETS.values(), *_BLOCK_TARGETS.values(),
                     *_BLOCK_GEMM_TARGETS.values(), *_Q8_TARGETS.values(),
                     *_ATTENTION_TARGETS.values(), *_LAYER_TARGETS):
        jax.ffi.register_ffi_target(f"vocabjax_{target}", jax.ffi.pycapsule(getattr(lib, target)),
                                    platform="cpu")
      _built["lib"] = lib
    except Exception as e:  # noqa: BLE001 -- any failure falls back to XLA's dot, said once
      _built["error"] = f"{type(e).__name__}: {e}"
  if _built["error"] and not _built["warned"]:
    _built["warned"] = True
    warnings.warn(f"vocabjax CPU matmul kernel unavailable, using XLA's dot: {_built['error']}",
                  RuntimeWarning, stacklevel=3)
  return _built["lib"]


def available() -> bool:
  """Whether the kernel is built and registered (builds it on the first call)."""
  return load() is not None


def _on_cpu(lowering: Lowering) -> bool:
  """Whether `lowering` builds for XLA:CPU. Platform "" (untagged) is resolved here from JAX's
  default backend: callers outside a trace only (`linear` resolves it with
  `jax.lax.platform_dependent` before asking)."""
  return (lowering.platform or jax.default_backend()) == "cpu"


def uses_kernel(x_shape, x_dtype, w_dtype, lowering: Lowering = Lowering()) -> bool:
  """Whether `linear` on these operands lowers to the kernel under `lowering`."""
  M = int(np.prod(x_shape[:-1], dtype=np.int64))
  return (lowering.cpu_kernel and _on_cpu(lowering)
          and 0 < M and (M <= MAX_ROWS or lowering.any_rows)
          and jnp.dtype(x_dtype).name in ("float32", "bfloat16")
          and jnp.dtype(w_dtype).name in _TARGETS
          and available())


def linear_reference(x: jax.Array, w: jax.Array, scale: jax.Array | None = None) -> jax.Array:
  """x [..., D] . w[F, D]^T (* scale[F]) in f32 with XLA's dot."""
  if w.dtype == jnp.int8 or scale is not None:
    y = jnp.einsum("...D,FD->...F", x.astype(jnp.float32), w.astype(jnp.float32))
    return y * scale if scale is not None else y
  return jnp.einsum("...D,FD->...F", x, w, preferred_element_type=jnp.float32)


def _kernel_call(x2, w, scale, gemm=False):
  if isinstance(w, BlockWeight):  # GGUF blocks: the type's target over the rows' bytes
    table = (_Q8_TARGETS if w.arith == "q8" else _BLOCK_GEMM_TARGETS if gemm
             else _BLOCK_TARGETS)
    target, w = table[w.qtype], w.data
  else:
    target = (_GEMM_TARGETS if gemm else _TARGETS)[jnp.dtype(w.dtype).name]
  target = f"vocabjax_{target}"
  out = jax.ShapeDtypeStruct((x2.shape[0], w.shape[0]), jnp.float32)
  call = jax.ffi.ffi_call(target, out, vmap_method="sequential")
  return call(x2, w) if scale is None else call(x2, w, scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _streamed(x2, w, scale, gemm):
  return _kernel_call(x2, w, scale, gemm)


def _streamed_fwd(x2, w, scale, gemm):
  return _kernel_call(x2, w, scale, gemm), (x2, w, scale)


def _streamed_bwd(gemm, res, g):
  del gemm  # the bf16 GEMM's gradient is taken as the exact product's
  x2, w, scale = res
  wf = w.astype(jnp.float32) * (scale[:, None] if scale is not None else 1.0)
  dx = (g @ wf).astype(x2.dtype)
  if jnp.issubdtype(w.dtype, jnp.floating):
    dw = (g.T @ x2.astype(jnp.float32)).astype(w.dtype)
  else:  # int8 weights are not trained
    dw = np.zeros(w.shape, jax.dtypes.float0)
  dscale = None if scale is None else jnp.einsum("MF,MF->F", g, x2 @ w.astype(jnp.float32).T)
  return dx, dw, dscale


_streamed.defvjp(_streamed_fwd, _streamed_bwd)


def linear(x: jax.Array, w: jax.Array, scale: jax.Array | None = None, *,
           lowering: Lowering = Lowering(), after: jax.Array | None = None) -> jax.Array:
  """y[..., F] = x[..., D] . w[F, D]^T (* scale[F]), accumulated and returned in f32; the kernel
  where `lowering` and the operands allow it (see the module doc), else `linear_reference`.
  `after`: where GGUF blocks are widened for XLA's dot, the widening waits for this array
  (default x: `widened_after`)."""
  if x.shape[-1] != w.shape[-1]:
    raise ValueError(f"linear: x's width {x.shape[-1]} differs from w{tuple(w.shape)}'s "
                     f"input width {w.shape[-1]}")
  if is_blocks(w) and scale is not None:
    raise ValueError("linear: GGUF blocks carry their own scales; pass no scale")
  if lowering.bf16_dots and scale is None and jnp.issubdtype(w.dtype, jnp.floating):
    return bf16_dot(x, w)
  if not lowering.platform:  # untagged: the CPU's lowering where the program lowers for a CPU
    return jax.lax.platform_dependent(
        x, w, cpu=lambda x, w: linear(x, w, scale, lowering=lowering.replace(platform="cpu"),
                                      after=after),
        default=lambda x, w: linear(x, w, scale, lowering=lowering.replace(platform="other"),
                                    after=after))
  if isinstance(w, GroupedInt4):
    return _linear_grouped(x, w, lowering)
  if isinstance(w, BlockWeight):
    return _linear_blocks(x, w, lowering, after)
  if lowering.platform in ("gpu", "tpu") and w.dtype == jnp.int8 and scale is not None:
    # the int8 rows straight into XLA's dot (mixed operands, f32 accumulation): XLA:TPU fuses
    # the widening, so the step reads the weight's int8 bytes, not a widened copy
    # (kernels/results/tpu_bytes); |q| <= 127 is exact in bf16 and in f32
    y = jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
    return y * scale
  if (w.dtype == jnp.int8) == (scale is not None) and uses_gemm(x.shape, x.dtype, w.dtype, lowering):
    y = _streamed(x.reshape(-1, x.shape[-1]).astype(jnp.float32), w, scale, True)
    return y.reshape(*x.shape[:-1], w.shape[0])
  if not uses_kernel(x.shape, x.dtype, w.dtype, lowering) or (w.dtype == jnp.int8) != (scale is not None):
    if lowering.platform == "cpu" and w.dtype != jnp.float32:
      # XLA:CPU's bf16 GEMM is slower than widening the weights and running its f32 GEMM
      # (docs/engine.md, 'CPU speed')
      x, w = x.astype(jnp.float32), w.astype(jnp.float32)
    return linear_reference(x, w, scale).astype(jnp.float32)
  lead = x.shape[:-1]  # bf16 activations are widened: the kernel computes in f32
  y = _streamed(x.reshape(-1, x.shape[-1]).astype(jnp.float32), w, scale, False)
  return y.reshape(*lead, w.shape[0])


def row_sum_squares(x: jax.Array) -> jax.Array | None:
  """sum(x^2) over the last axis (keepdims), each row summed by the kernel (x^2 times a row of
  ones: its fixed order, the same bits whatever the number of rows, unlike XLA:CPU's reduce);
  None where the kernel is not available. A normalization's statistic on the CPU: XLA's
  reduce summed a row of a one-token array and of a verified block's in different orders (one
  of the last-bit differences between a block and its one-token steps; the attention over the
  cache was the other: `attention`)."""
  M = int(np.prod(x.shape[:-1], dtype=np.int64))
  if M == 0 or not available():
    return None
  x2 = x.astype(jnp.float32)
  y = _streamed((x2 * x2).reshape(M, x.shape[-1]), jnp.ones((1, x.shape[-1]), jnp.float32),
                None, False)
  return y.reshape(*x.shape[:-1], 1)


def uses_attention(q_dtype, kv_dtype, lowering: Lowering) -> bool:
  """Whether `decoder_layer`'s attention over the cache runs in the kernel (`attention`) under
  `lowering`: decoding steps (`Lowering.any_rows`) on the CPU with the kernel on, f32 queries,
  f32 or bf16 caches."""
  return (lowering.cpu_kernel and lowering.any_rows and lowering.platform == "cpu"
          and jnp.dtype(q_dtype) == jnp.float32
          and jnp.dtype(kv_dtype).name in _ATTENTION_TARGETS and available())


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
              divisor: float, layer: int | None = None) -> jax.Array:
  """Attention of q [B, T, N, G, hd] (f32) over a layer's cache k, v [B, S, N, hd] (f32 or bf16)
  where mask [B, T, S] holds -> [B, T, N, G, hd] f32, by the kernel: softmax(q . k / divisor)
  . v in f32, each query row computed by the same operations whatever T is (a verified
  block's rows are its one-token steps' bit for bit; XLA:CPU's einsums and fused softmax round
  blocks of 3 or more queries differently). Check `uses_attention` first.

  `layer` (an int, or a traced int32 scalar: the layer loop's): k and v are the stacked caches
  [L, B, S, N, hd] and the kernel reads layer `layer` where it lies (XLA:CPU copied a slice k[layer] out of the stack: per layer and step, a cost
  proportional to the cache's size S)."""
  if not available():
    raise RuntimeError(f"the CPU attention kernel is unavailable: {_built['error']}")
  if layer is None:
    k, v, layer = k[None], v[None], 0
  elif isinstance(layer, (int, np.integer)) and not 0 <= layer < k.shape[0]:
    raise ValueError(f"layer {layer} is outside the stacked caches' {k.shape[0]} layers")
  target = f"vocabjax_{_ATTENTION_TARGETS[jnp.dtype(k.dtype).name]}"
  call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(q.shape, jnp.float32),
                          vmap_method="sequential")
  return call(q.astype(jnp.float32), k, v.astype(k.dtype), mask.astype(jnp.bool_),
              jnp.asarray(layer, jnp.int32), divisor=np.float32(divisor))


def widened_after(w: BlockWeight, x: jax.Array, widen=dequantize) -> jax.Array:
  """`dequantize(w)`, computed only once `x` exists. XLA:CPU schedules a computation that reads
  only parameters (a matrix's widening) ahead of everything and keeps each result live for the
  whole program: a 320-token prefill of Qwen2.5-1.5B's Q4_K_M blocks held every layer widened
  at once (5.2 GB of temp buffers; an optimization barrier did not prevent it). Adding
  min(|x[0]|, 0) (zero for any finite or infinite x) makes each widening wait for its input, so
  one matrix is widened at a time and the buffer is reused (0.15 GB of temp)."""
  first = jax.lax.slice(x.reshape(-1), (0,), (1,)).astype(jnp.float32)
  return widen(w) + jnp.minimum(jnp.abs(first), 0.0)


def indexed_blocks(h: jax.Array, U: BlockWeight, idx: jax.Array) -> jax.Array:
  """z[b, j] = U[idx[b, j]] . h[b] over GGUF blocks [V, D]: each row's K rows gathered as their
  bytes and multiplied by the kernel, which dequantizes them in registers (one call per row b),
  on XLA:CPU with the kernel on; elsewhere `indexed_lm_head_reference` (the rows widened to
  f32 for XLA's einsum: a K x D f32 copy per row and call, 58 MB for DynaSpec's ~9.5K rows of
  a 1,536-wide head)."""
  if not (Lowering().cpu_kernel and available()):
    return indexed_lm_head_reference(h, U, idx)
  rows = U.take(idx, mode="clip").data  # [B, K, row bytes]

  def cpu(h, rows):
    def one(hb, rb):
      w = BlockWeight(rb, U.qtype, U.cols, U.arith)
      return _kernel_call(hb[None].astype(jnp.float32), w, None)[0]
    return jax.vmap(one)(h, rows)

  return jax.lax.platform_dependent(
      h, rows, cpu=cpu, default=lambda h, rows: indexed_lm_head_reference(h, U, idx))


def _linear_blocks(x: jax.Array, w: BlockWeight, lowering: Lowering,
                   after: jax.Array | None = None) -> jax.Array:
  """`linear` of GGUF blocks under a platform-tagged `lowering`: the kernel's block targets on
  the CPU (dequantizing in registers), else XLA's dot on the f32 values, each matrix widened
  when its input exists (`widened_after`). Blocks with arith "q8" (x quantized to 8 bits,
  integer dots) take the kernel for any number of rows, prefills included, never the bf16
  GEMM: a token's keys and values are then the same arithmetic's whether a prefill or a step
  computed them, whatever the batch (XLA's f32 dot only where the kernel cannot run at all)."""
  lead, D = x.shape[:-1], x.shape[-1]
  M = int(np.prod(lead, dtype=np.int64))
  float_x = jnp.dtype(x.dtype).name in ("float32", "bfloat16")
  on_kernel = lowering.cpu_kernel and lowering.platform == "cpu" and float_x and M > 0
  if on_kernel and available():
    how = _blocks_kernel(M, w, lowering)
    if how is not None:
      y = _kernel_call(x.reshape(M, D).astype(jnp.float32), w, None, how == "gemm")
      return y.reshape(*lead, w.shape[0])
  return _widened_dot(x, widened_after(w, x if after is None else after), lowering)


def _blocks_kernel(M: int, w: BlockWeight, lowering: Lowering) -> str | None:
  """How the CPU kernel multiplies M > 0 rows of x by blocks `w` (the kernel on and
  available): "gemm" (the bf16 GEMM, `Lowering.bf16_blocks`), "rows" (the streaming or int8
  kernel), or None: XLA's dot over the widened values (`_widened_dot`)."""
  if (lowering.bf16_blocks and M >= GEMM_MIN_ROWS and w.arith != "q8"
      and gemm_available()):
    return "gemm"
  if M <= MAX_ROWS or lowering.any_rows or w.arith == "q8":
    return "rows"
  return None


def _widened_dot(x: jax.Array, u: jax.Array, lowering: Lowering) -> jax.Array:
  """x [..., D] . u [F, D]^T for blocks' widened f32 values u, f32-accumulated."""
  if lowering.bf16_dots:
    return bf16_dot(x, u)
  return jnp.einsum("...D,FD->...F", x.astype(jnp.float32), u,
                    preferred_element_type=jnp.float32)


def _linear_grouped(x: jax.Array, w: GroupedInt4, lowering: Lowering) -> jax.Array:
  """`linear` of grouped int4 (`blocks.GroupedInt4`, [D, F] codes) under a platform-tagged
  `lowering`: the codes times their scales in f32 (exact), cast to x's float dtype, multiplied
  with f32 accumulation; on a TPU by the Pallas kernel (`grouped_int4_tpu`: each code and scale
  read once) for blocks of up to its MAX_ROWS rows, on one GPU by the Triton kernel
  (`grouped_int4_gpu`, up to its MAX_ROWS rows, each row's sums the same at every row count),
  else (prefill, a GPU mesh) in XLA's dot, which widens the weight in HBM for most shapes. On
  the CPU (a mesh's devices; no kernel takes this layout) each matrix is widened to f32 once its
  input exists (`widened_after`)."""
  if lowering.platform == "cpu":
    u = widened_after(w, x, grouped_in_out)
    return jnp.einsum("...D,DF->...F", x.astype(jnp.float32), u,
                      preferred_element_type=jnp.float32)
  dtype = x.dtype if jnp.dtype(x.dtype).name in ("bfloat16", "float16") else jnp.float32
  lead, (D, F) = x.shape[:-1], (w.cols, w.shape[-2])
  M = int(np.prod(lead, dtype=np.int64))
  if lowering.platform == "tpu" and w.codes.ndim == 2 and grouped_int4_tpu.fits(
      M, D // (max(lowering.model_shards, 1) if w.split == "in" else 1), F):
    x2 = x.reshape(M, D).astype(dtype)
    if lowering.mesh is None:
      y = grouped_int4_tpu.grouped_matmul(x2, w.codes, w.scales)
    else:
      y = grouped_int4_tpu.grouped_matmul_sharded(x2, w.codes, w.scales, mesh=lowering.mesh,
                                                  split=w.split)
    return y.reshape(*lead, F)
  if (lowering.platform == "gpu" and lowering.mesh is None and w.codes.ndim == 2
      and grouped_int4_gpu.ENABLED and grouped_int4_gpu.fits(M, D, F)):
    return grouped_int4_gpu.grouped_matmul(x.reshape(M, D).astype(dtype), w.codes,
                                           w.scales).reshape(*lead, F)
  return jnp.einsum("...D,DF->...F", x.astype(dtype), grouped_in_out(w, dtype),
                    preferred_element_type=jnp.float32)


def layer_weights_ok(ws) -> bool:
  """Whether `layer_linear` takes `ws` (one weight per layer): GGUF blocks of one shape and
  arithmetic, any block types."""
  return (len(ws) > 0 and all(isinstance(w, BlockWeight) for w in ws)
          and len({(w.data.shape[0], w.cols, w.arith) for w in ws}) == 1
          and all(w.data.ndim == 2 for w in ws))


def _layer_call(target: str, out, ws, layer, *args, x=None, **attrs):
  """The layer target's call: (x,) layer, `args`, then every layer's blocks."""
  if not available():
    raise RuntimeError(f"the CPU kernel's layer targets are unavailable: {_built['error']}")
  call = jax.ffi.ffi_call(f"vocabjax_{target}", out, vmap_method="sequential")
  codes = np.asarray([QTYPE_CODES[w.qtype] for w in ws], np.int64)
  lead = () if x is None else (x,)
  return call(*lead, jnp.asarray(layer, jnp.int32), *args, *(w.data for w in ws), qtypes=codes,
              **attrs)


def layer_dequantize(ws, layer, after: jax.Array | None = None) -> jax.Array:
  """`dequantize(ws[layer])` [F, D] f32 for a traced `layer`, by the kernel (the same values:
  the in-register decode, `gguf`'s dequantization), reading that layer's blocks in place.
  `after`: computed only once this array exists, as `widened_after(ws[layer], after)` (its
  values too: plus min(|after's first value|, 0)); XLA otherwise runs such a call, which reads
  only parameters, early and holds its result."""
  F, D = ws[0].data.shape[0], ws[0].cols
  first = (jnp.zeros((), jnp.float32) if after is None else
           jax.lax.slice(after.reshape(-1), (0,), (1,)).astype(jnp.float32).reshape(()))
  return _layer_call("VjLayerDequantize", jax.ShapeDtypeStruct((F, D), jnp.float32), ws, layer,
                     first)


def layer_linear(x: jax.Array, ws, layer, lowering: Lowering,
                 after: jax.Array | None = None) -> jax.Array:
  """`linear(x, ws[layer])` for GGUF blocks `ws` (one per layer, `layer_weights_ok`) and a
  layer that is an operand (a traced int32): the decoder's layer loop (`models.llamalike`), one
  loop body for every layer instead of the layers unrolled into each program's code. The same
  kernels and arithmetic as `_linear_blocks` on the layer's own weight (the same bits): the
  kernel reads the layer's blocks where they lie; above the kernel's rows, the layer's values
  are decoded by the kernel (`layer_dequantize`) once x exists and XLA's dot multiplies them.
  Needs a CPU-tagged `lowering` with the kernel on and available; `after` as `linear`'s."""
  lead, D = x.shape[:-1], x.shape[-1]
  M = int(np.prod(lead, dtype=np.int64))
  w0 = ws[0]
  F = w0.data.shape[0]
  if D != w0.cols:
    raise ValueError(f"layer_linear: x's width {D} differs from the weights' {w0.cols}")
  how = _blocks_kernel(M, w0, lowering) if M > 0 else None
  if how is not None:
    mode = 2 if w0.arith == "q8" else 1 if how == "gemm" else 0
    y = _layer_call("VjLayerMatmul", jax.ShapeDtypeStruct((M, F), jnp.float32), ws, layer,
                    x=x.reshape(M, D).astype(jnp.float32), mode=np.int64(mode))
    return y.reshape(*lead, F)
  return _widened_dot(x, layer_dequantize(ws, layer, x if after is None else after), lowering)
