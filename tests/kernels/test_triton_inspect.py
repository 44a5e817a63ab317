"""kernels/triton_inspect.py's parts that need no `triton` package: the TTIR Pallas lowers
for cuda on this host, and the occupancy and grid arithmetic its table reports."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def inspect():
  spec = importlib.util.spec_from_file_location("triton_inspect",
                                                ROOT / "kernels/triton_inspect.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_occupancy_names_the_limiting_resource(inspect):
  # 159 registers -> 160 per thread, 5,120 per warp, 20,480 per 4-warp program: 3 per SM
  assert inspect.occupancy(159, 512, 4)["programs_per_sm"] == 3
  assert inspect.occupancy(159, 512, 4)["limited_by"] == "regs"
  # 52 KB of shared memory (+ 1 KB reserved) per program: 4 of 228 KB
  occ = inspect.occupancy(48, 53248, 4)
  assert (occ["programs_per_sm"], occ["limited_by"]) == (4, "smem")
  assert inspect.occupancy(16, 0, 32)["limited_by"] == "threads"  # 1,024 threads: 2 per SM


def test_grid_load(inspect):
  g = inspect.grid_load(320, 132, 4)  # 320 tiles: 56 SMs run 3, 76 run 2
  assert (g["most_per_sm"], g["balance"]) == (3, round(320 / 132 / 3, 3))
  assert inspect.grid_load(264, 132, 4)["balance"] == 1.0


@pytest.mark.parametrize("persist", [0, 4])
def test_kernel_ttir_is_the_triton_module(inspect, persist):
  cfg = {"variant": "dot", "block_k": 16, "block_d": 64, "num_warps": 4, "num_stages": 3,
         "split_d": 1, "persist": persist}
  ttir = inspect.kernel_ttir(2, 128, 300, 64, cfg)
  assert "tt.func public @indexed_lm_head_gpu" in ttir and "tt.dot" in ttir
  assert ("scf.if" in ttir) == bool(persist)  # the persistent loop's conditional store
