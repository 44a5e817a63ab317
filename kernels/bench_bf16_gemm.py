"""The bf16 GEMM (cpu_matmul VjGemmBF16*) against XLA's f32 dot and the streaming int8 kernel, GFLOP/s
per M for the real models' projection shapes; the minimum of 7 calls each.

    python kernels/bench_bf16_gemm.py   # output: kernels/results/kernels/cpu-2core/bf16_gemm.txt
"""
import time, numpy as np, jax, jax.numpy as jnp
from vocabjax.kernels import cpu_matmul as cm
from vocabjax.models.llamalike import quantize_rows


def main():
  cm.load()
  def gemm(x, w, scale=None):
    target = f"vocabjax_{cm._GEMM_TARGETS[jnp.dtype(w.dtype).name]}"
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32)
    call = jax.ffi.ffi_call(target, out)
    return call(x, w) if scale is None else call(x, w, scale)
  def tm(f, *a):
    jax.block_until_ready(f(*a)); ts=[]
    for r in range(7):
      t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
    return min(ts)
  rng = np.random.default_rng(0)
  for F, D in ((4864, 896), (896, 4864), (8960, 1536), (128, 896)):
    w = jnp.asarray(rng.standard_normal((F, D)).astype(np.float32)); q, s = quantize_rows(w)
    for M in (16, 32, 64, 128, 256, 768):
      x = jnp.asarray(rng.standard_normal((M, D)).astype(np.float32))
      fl = 2*M*F*D/1e9
      a = tm(jax.jit(lambda x, w: cm.linear_reference(x, w)), x, w)
      b = tm(jax.jit(gemm), x, q, s)
      c = tm(jax.jit(gemm), x, w)
      k = tm(jax.jit(lambda x, w, s: cm.linear(x, w, s)), x, q, s) if M <= 64 else float('nan')
      print(f"F={F} D={D} M={M}: xla f32 {fl/a:.0f}  gemm int8 {fl/b:.0f}  gemm f32w {fl/c:.0f}  stream int8 {fl/k:.0f} GFLOP/s", flush=True)


if __name__ == "__main__":
  main()
