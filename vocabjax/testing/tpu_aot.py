"""Deviceless TPU compilation: compile a jitted function for a TPU topology on a host without a
TPU (libtpu's compiler runs here), so that Mosaic's real checks (tile alignment, VMEM budget,
DMA shapes) run in CPU-only CI.

    compiled = compile_for_tpu(fn, jax.ShapeDtypeStruct((10, 896), jnp.bfloat16), ...,
                               topology="v5e:1x1", name="my_kernel")
    compiled.memory_analysis(), compiled.cost_analysis()

Needs the `libtpu` package (`pip install libtpu`); it is not a TPU runtime, only the compiler.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Callable

import jax
from jax.sharding import SingleDeviceSharding

__all__ = ["compile_failure", "compile_for_tpu", "describe_args", "libtpu_available",
           "lower_for_tpu", "not_cached", "require_libtpu", "tpu_devices"]

# Mosaic's message starts with the failing check and the MLIR operation; a few lines say which.
_ERROR_LINES = 12


def libtpu_available() -> bool:
  """True when the libtpu package (the TPU compiler) is importable."""
  return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
  """Raise an error telling how to install libtpu when it is missing (CI must not skip)."""
  if not libtpu_available():
    raise RuntimeError("deviceless TPU compilation needs the TPU compiler: `pip install libtpu` "
                       f"(jax {jax.__version__} is installed)")


@functools.cache
def tpu_devices(topology_name: str = "v5e:1x1") -> tuple:
  """The TPU devices of a topology such as "v5e:1x1", "v6e:1x1" or "v5p:1x1x1", described by
  libtpu without a TPU attached. Raises ValueError naming the topology when it is unknown."""
  from jax.experimental import topologies

  require_libtpu()
  # libtpu takes /tmp/libtpu_lockfile when it starts, to keep two processes off one chip; a
  # topology description opens no chip, and without this a second process on the host (another
  # jax program, a pytest-xdist worker) fails with "ABORTED: ... multi-process lockfile"
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology_name)
  except Exception as e:  # JaxRuntimeError: INVALID_ARGUMENT: Invalid TPU external name ...
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if "INVALID_ARGUMENT" in first:
      raise ValueError(f"unknown TPU topology {topology_name!r} (libtpu says: {first}); "
                       "names look like 'v5e:1x1', 'v6e:1x1', 'v5p:1x1x1'") from e
    raise RuntimeError(f"libtpu could not describe TPU topology {topology_name!r}: {first}") from e
  return tuple(topo.devices)


def describe_args(structs) -> str:
  """"bfloat16[10, 896], int32[10, 2048]": arguments as a compile error names them."""
  return ", ".join(f"{s.dtype}{list(s.shape)}" for s in structs)


def compile_failure(head: str, err: Exception) -> AssertionError:
  """`head`, then the error's type and first lines (Mosaic's, Triton's and XLA's first lines
  say which check failed): what every deviceless compile here raises."""
  lines = [l for l in str(err).splitlines() if l.strip()][:_ERROR_LINES]
  return AssertionError(f"{head}:\n  {type(err).__name__}: " + "\n  ".join(lines))


def lower_for_tpu(fn: Callable, *shape_dtype_structs: jax.ShapeDtypeStruct,
                  topology: str = "v5e:1x1", **jit_kwargs):
  """Trace and lower `fn` for the first device of `topology` (no compilation): the Lowered's
  `as_text()` is the StableHLO the TPU compiler gets (e.g. to see which platform_dependent
  branch was taken). Compiled TPU executables' `as_text()` is not reliable deviceless: for
  v6e/v5p programs with async ops this jaxlib fails to read libtpu's HLO back (RET_CHECK)."""
  dev = tpu_devices(topology)[0]
  args = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=SingleDeviceSharding(dev))
          for s in shape_dtype_structs]
  # Pallas lowering rules that need the TPU generation (signed integer // and %, for one) ask
  # the default device; without this they see the host's CPU ("Unsupported TPU device kind")
  with jax.default_device(dev):
    return jax.jit(fn, **jit_kwargs).trace(*args).lower()


@contextlib.contextmanager
def not_cached():
  """Compiles inside are not written to JAX's persistent compilation cache. A deviceless TPU
  executable cannot be loaded back (there is no TPU client: "PjRtCompiler must be constructed
  with a Client"), so with the cache on (the test suite's) every one would be stored, fail to
  load with a warning on the next run and be compiled again. (The cache's on/off switch is read
  once per process; its minimum compile time is read per compile.)"""
  key = "jax_persistent_cache_min_compile_time_secs"
  old = getattr(jax.config, key)
  jax.config.update(key, float("inf"))
  try:
    yield
  finally:
    jax.config.update(key, old)


def compile_for_tpu(fn: Callable, *shape_dtype_structs: jax.ShapeDtypeStruct,
                    topology: str = "v5e:1x1", name: str | None = None, **jit_kwargs):
  """Trace, lower and compile `fn` for the first device of `topology` with arguments of the given
  shapes and dtypes (no data, no TPU). Returns the compiled executable (its `memory_analysis()`
  describes the TPU program's buffers; `cost_analysis()` counts a Pallas call as reading all of
  its operands). On any error (Mosaic's checks, VMEM exhausted, lowering) raises AssertionError
  whose message names `name`, the topology, the argument shapes and the error's first lines."""
  name = name or getattr(fn, "__name__", repr(fn))
  tpu_devices(topology)  # no libtpu, unknown topology: their own errors, not a compile failure
  try:
    with not_cached():
      return lower_for_tpu(fn, *shape_dtype_structs, topology=topology, **jit_kwargs).compile()
  except Exception as e:  # MosaicError, JaxRuntimeError (RESOURCE_EXHAUSTED: VMEM), ...
    err = e
  raise compile_failure(f"{name} does not compile for TPU {topology} with arguments "
                        f"({describe_args(shape_dtype_structs)})", err) from err
