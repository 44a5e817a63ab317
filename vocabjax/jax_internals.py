"""What vocabjax reads of JAX that JAX has no public API for, in one place.

Everything else in the package uses JAX's public API. Each function here says what it reads and
what happens when a JAX release moves it: none of them is needed for decoding to be correct.

    trace_settings()      JAX's configuration a trace reads (matmul precision, x64, ...): part of
                          a shared program's key (`vocabjax.decoding.engine.ProgramCache`)
    accelerator_counts()  TPU chips and GPUs on this host, by JAX's own PCI probe, without
                          starting a backend (`vocabjax.backends.cpu_only_reason`)
    gpu_topology_known()  whether a CUDA plugin registered a compile-only GPU topology
                          (`vocabjax.testing.gpu_aot`)
    triton_ir(fn, *args)  the Triton IR of every Pallas GPU kernel in fn(*args), lowered for
                          CUDA without a GPU (kernels/triton_inspect.py)
"""

from __future__ import annotations

try:
  from jax._src.config import trace_context as _trace_context
except ImportError:  # a JAX without it: nothing is shared across decoders (see trace_settings)
  _trace_context = None


def trace_settings():
  """JAX's trace-time configuration as a hashable value (what jit's own caches key on), so a
  program traced under one setting is never reused under another. Where JAX no longer has it,
  a fresh object: it equals nothing, so no program is shared across decoders."""
  return _trace_context() if _trace_context is not None else object()


def accelerator_counts() -> tuple[int, int]:
  """(TPU chips, GPUs: NVIDIA visible + AMD) on this host, from JAX's own PCI vendor-id probe,
  as JAX uses it to decide which backends to start; no backend is started."""
  from jax._src import hardware_utils

  tpu_chips = hardware_utils.num_available_tpu_chips_and_device_id()[0]
  gpus = int(hardware_utils.has_visible_nvidia_gpu()) + hardware_utils.num_available_amd_gpus(
      stop_at=1)
  return tpu_chips, gpus


def gpu_topology_known() -> bool:
  """Whether a compile-only "cuda" topology is registered with JAX (a CUDA plugin loaded)."""
  from jax._src import xla_bridge

  return "cuda" in xla_bridge._topology_factories


def triton_ir(fn, *args) -> list[str]:
  """The Triton IR (TTIR) text of every Triton `pallas_call` in `fn(*args)`, lowered for CUDA on
  any host. Reads Pallas' private Triton lowering (`jax._src.pallas.triton.lowering`) by
  wrapping its module builder for the duration of one lowering, then restoring it; a JAX
  release that moves it raises ImportError or AttributeError here, and only the inspection
  script that calls this stops working."""
  import jax
  from jax._src.pallas.triton import lowering

  modules, build = [], lowering.lower_jaxpr_to_triton_module

  def recording(*a, **k):
    result = build(*a, **k)
    modules.append(result.module.operation.get_asm())
    return result

  lowering.lower_jaxpr_to_triton_module = recording
  try:
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
  finally:
    lowering.lower_jaxpr_to_triton_module = build
  return modules
