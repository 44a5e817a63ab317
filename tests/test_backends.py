"""vocabjax/backends.py: on a host with libtpu and no TPU (the test extra's setup, CI's), a
vocabjax command's output carries none of libtpu's start-up errors; the user's own choice of
platforms, a TPU host and a GPU host are left to JAX."""

import importlib.util
import os
import subprocess
import sys

import pytest

from vocabjax.backends import cpu_only_reason


def test_cpu_only_where_libtpu_finds_no_tpu():
  assert cpu_only_reason({}, libtpu_installed=True, tpu_chips=0, gpus=0)
  # the user's choice, a TPU, a GPU, or no libtpu: JAX decides as it would
  assert cpu_only_reason({"JAX_PLATFORMS": "tpu,cpu"}, True, 0, 0) is None
  assert cpu_only_reason({"JAX_FORCE_TPU_INIT": "1"}, True, 0, 0) is None
  assert cpu_only_reason({}, True, 4, 0) is None
  assert cpu_only_reason({}, True, 0, 1) is None
  assert cpu_only_reason({}, False, 0, 0) is None
  assert cpu_only_reason({"JAX_PLATFORMS": ""}, True, 0, 0)  # empty: JAX's automatic choice


@pytest.mark.extended
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu not installed (the test extra installs it)")
def test_a_command_on_a_host_without_tpu_prints_no_libtpu_noise(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  r = subprocess.run([sys.executable, "-c", "import vocabjax, jax; print(jax.devices())"],
                     env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.strip() == "[CpuDevice(id=0)]", r.stderr[-3000:]
  assert r.stderr == "", r.stderr[-3000:]  # before: libtpu's worker-hostname errors
  # deviceless TPU compilation still has its topology (libtpu prints its own lines for that)
  code = ("import vocabjax\nfrom jax.experimental import topologies\n"
          "print(len(topologies.get_topology_desc(platform='tpu', topology_name='v5e:2x2')"
          ".devices))\n")
  r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.split() == ["4"], r.stderr[-3000:]
