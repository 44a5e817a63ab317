"""The test suite's compile setting (read by tests/conftest.py before jax starts): fast CPU
compiles through XLA_FLAGS by default, users' settings with VOCABJAX_TEST_COMPILE=full (the
module comment in tests/conftest.py says why)."""

import os

COMPILE = os.environ.get("VOCABJAX_TEST_COMPILE", "fast")
if COMPILE not in ("fast", "full"):
  raise ValueError(f"VOCABJAX_TEST_COMPILE={COMPILE!r}: choose fast or full")
FAST_COMPILE = COMPILE == "fast" and os.environ.get("JAX_PLATFORMS", "cpu") == "cpu"
FAST_XLA_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
                    "xla_cpu_parallel_codegen_split_count": 1}
USERS_SETTINGS = ("integration", "full_opt")  # marks a fast run leaves to a full one


def flags(options: dict) -> list[str]:
  """XLA_FLAGS entries for XLA debug options."""
  return [f"--{k}={str(v).lower()}" for k, v in options.items()]


def subprocess_xla_flags(device_count: int | None = None) -> str:
  """XLA_FLAGS for a test's CPU-only subprocess (a two-process run, the notebook's venv, the
  GPU run's dry run): `device_count` virtual CPU devices, and the suite's setting."""
  out = [f"--xla_force_host_platform_device_count={device_count}"] if device_count else []
  if FAST_COMPILE:
    out += flags(FAST_XLA_OPTIONS)
  return " ".join(out)


def leave_to_full_run(config, items) -> None:
  """In a fast run, deselect the tests marked with one of USERS_SETTINGS (in place)."""
  if not FAST_COMPILE:
    return
  left = [i for i in items if any(i.get_closest_marker(m) for m in USERS_SETTINGS)]
  if left:
    config.hook.pytest_deselected(items=left)
    kept = set(left)
    items[:] = [i for i in items if i not in kept]
