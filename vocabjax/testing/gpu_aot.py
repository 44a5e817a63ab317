"""Deviceless GPU compilation: compile a jitted function for an NVIDIA GPU on a host without one.
XLA:GPU and Triton, from JAX's CUDA plugin, run here on the CPU, given the GPU's description (a
target configuration); nothing runs. So Triton's real checks (shared memory, lowering) and the
HLO that XLA:GPU would run reach CPU-only CI, as `tpu_aot` does for TPUs.

    python -m vocabjax.testing.gpu_aot install     # once: the plugin matching this jaxlib
    compiled = compile_for_gpu(fn, jax.ShapeDtypeStruct((10, 896), jnp.bfloat16), ...,
                               target="h100", name="my_kernel")
    compiled.as_text()                             # XLA:GPU's optimized HLO

The plugin (`jax-cuda12-plugin` and `jax-cuda12-pjrt` of this jaxlib's version, ~190 MB, no
NVIDIA libraries) goes into its own folder, `~/.cache/vocabjax/gpu-aot/jaxlib-<version>`
(`VOCABJAX_GPU_AOT_DIR` moves it), not into site-packages, where every JAX process would load it
at start and look for a GPU (docs/install.md): it is loaded only by the process that asks for a
GPU device, after its CPU backend is up; the CPU backend stays the default.

Targets (`TARGETS`): the H100 SXM and the H200, both GH100 (sm_90, 132 SMs, 227 KB of shared
memory per block); what differs is memory (80 GB HBM3 at 3.35 TB/s; 141 GB HBM3e at 4.8 TB/s).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import jax
from jax.sharding import SingleDeviceSharding

from vocabjax.testing.tpu_aot import compile_failure, describe_args, not_cached

__all__ = ["TARGETS", "compile_for_gpu", "device_kind", "gpu_devices", "install", "lower_for_gpu",
           "plugin_dir", "plugin_installed", "require_plugin"]

_LOCK = threading.Lock()


def _target(name: str, memory_bytes: int, bandwidth: float) -> str:
  """A GpuTargetConfigProto (text) of a GH100 GPU with the given memory (NVIDIA's Hopper
  figures: 132 SMs, 2048 threads and 64K registers per SM, 228 KB of shared memory per SM of
  which 227 KB per block, 50 MB of L2, 1.98 GHz boost)."""
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  shared_memory_per_block_optin: 232448
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(bandwidth)}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory_bytes}
  cuda_compute_capability {{
    major: 9
    minor: 0
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 8
}}
device_description_str: "{name}"
"""


MiB = 1 << 20
# device_description_str is the device_kind JAX reports (the dispatch table's key): the names
# the drivers give, as a lent H200 reported them (`nvidia-smi`: 143771 MiB) and a lent
# H100 SXM.
TARGETS: dict[str, str] = {
    "h100": _target("NVIDIA H100 80GB HBM3", 81559 * MiB, 3.35e12),
    "h200": _target("NVIDIA H200", 143771 * MiB, 4.8e12),
}


def device_kind(target: str) -> str:
  """The device_kind a target's device reports (what the dispatch table is keyed by)."""
  return TARGETS[target].split('device_description_str: "')[1].split('"')[0]


def _jaxlib_version() -> str:
  import jaxlib

  return jaxlib.__version__


def plugin_dir() -> Path:
  """Where this jaxlib's plugin is (or is to be) installed."""
  base = os.environ.get("VOCABJAX_GPU_AOT_DIR") or Path.home() / ".cache" / "vocabjax" / "gpu-aot"
  return Path(base) / f"jaxlib-{_jaxlib_version()}"


def _install_command(target: Path | None = None) -> list[str]:
  v = _jaxlib_version()
  return [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
          "--target", str(target or plugin_dir()), f"jax-cuda12-plugin=={v}",
          f"jax-cuda12-pjrt=={v}"]


def plugin_installed() -> bool:
  d = plugin_dir()
  return (d / "jax_plugins" / "xla_cuda12").is_dir() and (d / "jax_cuda12_plugin").is_dir()


def require_plugin() -> None:
  """Raise an error telling how to install the plugin when it is missing (CI must not skip)."""
  if not plugin_installed():
    raise RuntimeError(f"deviceless GPU compilation needs JAX's CUDA plugin for jaxlib "
                       f"{_jaxlib_version()} in {plugin_dir()}: run `python -m "
                       "vocabjax.testing.gpu_aot install` (pip, ~190 MB, no NVIDIA libraries)")


def install(force: bool = False) -> Path:
  """Install the plugin matching this jaxlib into `plugin_dir()` (pip, with its progress), into
  a temporary folder first: an interrupted install leaves nothing half-written behind."""
  final = plugin_dir()
  if plugin_installed() and not force:
    print(f"[gpu_aot] the plugin for jaxlib {_jaxlib_version()} is in {final}")
    return final
  return pip_install_into(
      final, _install_command, lambda d: (d / "jax_plugins" / "xla_cuda12").is_dir() and (
          d / "jax_cuda12_plugin").is_dir(), f"JAX's CUDA plugin for jaxlib {_jaxlib_version()}",
      "the tests that compile for a GPU need it", tag="gpu_aot")


def pip_install_into(final: Path, command, installed, what: str, why: str, *,
                     tag: str) -> Path:
  """Run pip's `command(folder)` into a temporary folder beside `final`, check it with
  `installed(folder)`, then rename it into place (an interrupted install leaves nothing
  half-written); RuntimeError naming `what` (and `why` it is needed) when pip fails."""
  tmp = final.with_name(final.name + f".partial-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  cmd = command(tmp)
  print(f"[{tag}] " + " ".join(cmd), flush=True)
  try:
    try:
      subprocess.run(cmd, check=True)
    except subprocess.CalledProcessError as e:
      raise RuntimeError(f"pip could not install {what} (exit {e.returncode}; its output is "
                         f"above): {why}") from None
    if not installed(tmp):
      raise RuntimeError(f"pip installed no {what} into {tmp} (its output is above)")
    if final.exists():
      shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, final)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  print(f"[{tag}] installed {what} in {final}")
  return final


@functools.cache
def _register() -> None:
  """Load the plugin into this process (once): JAX's CPU backend first, so that the plugin
  registers a GPU compiler and topology without becoming a backend JAX starts."""
  from vocabjax.jax_internals import gpu_topology_known  # local: with the plugin only

  require_plugin()
  jax.devices()  # the backends JAX starts, before "cuda" is known to it
  if gpu_topology_known():  # a plugin installed the usual way, found at start
    return
  d = str(plugin_dir())
  if d not in sys.path:
    sys.path.append(d)
  import jax_cuda12_plugin  # noqa: F401  (the extensions: Triton's compiler among them)
  from jax_plugins import xla_cuda12

  got = getattr(getattr(xla_cuda12, "version", None), "_version", None)
  if got is not None and got != _jaxlib_version():
    raise RuntimeError(f"the CUDA plugin in {d} is for jaxlib {got}, this is jaxlib "
                       f"{_jaxlib_version()}: run `python -m vocabjax.testing.gpu_aot install "
                       "--force`")
  old = os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
  os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"  # no CUDA here to check the versions of
  try:
    xla_cuda12.initialize()
  finally:
    if old is None:
      os.environ.pop("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
    else:
      os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = old
  if not gpu_topology_known():
    raise RuntimeError(f"the CUDA plugin in {d} registered no GPU topology")


@functools.cache
def gpu_devices(target: str = "h100") -> tuple:
  """The (compile-only) device of one GPU of `target` (a key of TARGETS). ValueError naming the
  target when it is unknown."""
  from jax.experimental import topologies

  if target not in TARGETS:
    raise ValueError(f"unknown GPU target {target!r}: known are {sorted(TARGETS)}")
  with _LOCK:
    _register()
    topo = topologies.get_topology_desc("vocabjax", platform="cuda", topology="1x1x1",
                                        target_config=TARGETS[target])
  return tuple(topo.devices)


def lower_for_gpu(fn: Callable, *shape_dtype_structs: jax.ShapeDtypeStruct,
                  target: str = "h100", **jit_kwargs):
  """Trace and lower `fn` for `target`'s GPU (no compilation)."""
  dev = gpu_devices(target)[0]
  args = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=SingleDeviceSharding(dev))
          for s in shape_dtype_structs]
  with jax.default_device(dev):  # Pallas lowering rules ask the default device
    return jax.jit(fn, **jit_kwargs).trace(*args).lower()


def compile_for_gpu(fn: Callable, *shape_dtype_structs: jax.ShapeDtypeStruct,
                    target: str = "h100", name: str | None = None, **jit_kwargs):
  """Trace, lower and compile `fn` for `target`'s GPU with arguments of the given shapes and
  dtypes (no data, no GPU); Triton kernels are compiled too. Returns the compiled executable
  (`as_text()`: XLA:GPU's optimized HLO). On any error (Triton's shared memory, lowering)
  raises AssertionError whose message names `name`, the target, the argument shapes and the
  error's first lines."""
  name = name or getattr(fn, "__name__", repr(fn))
  gpu_devices(target)  # no plugin, unknown target: their own errors, not a compile failure
  try:
    with not_cached():  # a deviceless executable cannot be loaded back from the cache
      return lower_for_gpu(fn, *shape_dtype_structs, target=target, **jit_kwargs).compile()
  except Exception as e:  # JaxRuntimeError (RESOURCE_EXHAUSTED: shared memory), lowering
    err = e
  raise compile_failure(f"{name} does not compile for GPU {target} ({device_kind(target)}) "
                        f"with arguments ({describe_args(shape_dtype_structs)})", err) from err


def main(argv=None) -> int:
  import argparse

  p = argparse.ArgumentParser(prog="python -m vocabjax.testing.gpu_aot",
                              description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  i = sub.add_parser("install", help="install the CUDA plugin matching this jaxlib")
  i.add_argument("--force", action="store_true", help="reinstall")
  sub.add_parser("check", help="describe each target's device (the plugin must be installed)")
  a = p.parse_args(argv)
  if a.cmd == "install":
    install(force=a.force)
    return 0
  for t in TARGETS:
    print(t, gpu_devices(t))
  return 0


if __name__ == "__main__":
  sys.exit(main())
