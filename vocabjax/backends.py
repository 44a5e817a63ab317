"""Which JAX backends vocabjax lets JAX start on a host.

libtpu is installed beside JAX on hosts without a TPU for deviceless TPU compilation (the test
extra, `tpu-aot`). JAX then starts the TPU backend on every first use and libtpu, finding no TPU,
prints several lines of worker-hostname errors to stderr before JAX falls back to the CPU: noise
before every command's output. JAX itself skips CUDA where no NVIDIA GPU is visible; vocabjax
applies the same rule to the TPU: where JAX's own hardware probe finds no TPU chip (and no GPU
whose plugin might be installed), and the user chose nothing (`JAX_PLATFORMS`,
`JAX_FORCE_TPU_INIT`), JAX is asked for the CPU backend only. Deviceless TPU compilation
(`jax.experimental.topologies`) does not need the TPU backend and works the same."""

from __future__ import annotations

import functools
import importlib.util
import os


def cpu_only_reason(environ=None, libtpu_installed=None, tpu_chips=None, gpus=None) -> str | None:
  """Why JAX should start only its CPU backend here (None: leave JAX's choice alone). The
  arguments stand in for this host's facts (tests); by default they are read."""
  environ = os.environ if environ is None else environ
  if environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in environ:
    return None  # the user's choice
  if libtpu_installed is None:
    libtpu_installed = (importlib.util.find_spec("libtpu") is not None
                        or bool(environ.get("TPU_LIBRARY_PATH")))
  if not libtpu_installed:
    return None  # no TPU backend to start
  if tpu_chips is None or gpus is None:
    from vocabjax.jax_internals import accelerator_counts  # local: only when probed

    probed_tpus, probed_gpus = accelerator_counts()
    tpu_chips = probed_tpus if tpu_chips is None else tpu_chips
    gpus = probed_gpus if gpus is None else gpus
  if tpu_chips or gpus:
    return None
  return "libtpu is installed but this host has no TPU chip and no GPU"


def skip_absent_tpu() -> None:
  """Start only JAX's CPU backend where `cpu_only_reason` says so (a no-op once JAX's backends
  have started: JAX reads the setting then)."""
  try:
    reason = cpu_only_reason()
  except Exception:  # a JAX whose private probe moved: leave JAX's choice alone
    return
  if reason:
    import jax

    jax.config.update("jax_platforms", "cpu")


def available_memory_bytes(device=None) -> int | None:
  """Memory a new allocation can have on `device` (default: JAX's first): the host's
  MemAvailable for a CPU device, the device's bytes_limit - bytes_in_use otherwise; None when
  unknown."""
  import jax

  device = device or jax.devices()[0]
  if device.platform == "cpu":
    try:
      with open("/proc/meminfo") as f:
        for line in f:
          if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    except OSError:
      return None
    return None
  try:
    stats = device.memory_stats() or {}
  except Exception:  # a backend without memory stats
    return None
  if "bytes_limit" not in stats:
    return None
  return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


@functools.cache
def _malloc_trim():
  """glibc's `malloc_trim`, or None where the C library is not glibc (macOS, musl)."""
  import ctypes

  try:
    return ctypes.CDLL("libc.so.6").malloc_trim
  except (OSError, AttributeError):
    return None


def trim_heap() -> bool:
  """Hand the C heap's free pages back to the system (glibc's `malloc_trim(0)`, after a
  `gc.collect()` that frees the Python objects a trace left in cycles); False where there is
  no glibc (nothing done) or `VOCABJAX_TRIM_HEAP=0`.

  Compiling an XLA:CPU program allocates far more than the program keeps (the traced jaxpr,
  the MLIR module, LLVM's passes) and glibc keeps most of what is freed inside its heaps, so a
  process's resident memory grew by every compile's working set: compiling the main job's
  programs (target and drafter prefills per prompt block, every method's step; the registry
  pair's blocks) peaked at 3.47 GB, 3.08 GB with this after each build. The program cache
  calls it after each build that took a second or more (`ProgramCache.trim_after_s`): such a
  build takes seconds, this ~0.3 s (mostly the collection); after quicker builds (tiny
  programs, JAX's persistent cache) the collection cost more than the build."""
  import gc

  if os.environ.get("VOCABJAX_TRIM_HEAP", "1") == "0":
    return False
  trim = _malloc_trim()
  if trim is None:
    return False
  gc.collect()
  trim(0)
  return True
