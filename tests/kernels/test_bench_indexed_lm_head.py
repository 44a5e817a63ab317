"""kernels/bench_indexed_lm_head.py: block-size tuning and the on-device correctness check,
run with the GPU kernel in interpret mode on tiny shapes."""

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "kernels" / "bench_indexed_lm_head.py"


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location("bench_indexed_lm_head", _PATH)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_candidates_fit_the_shape(bench):
  small = bench.gpu_candidates(64, 16)
  assert {(c["block_k"], c["block_d"]) for c in small} == {(32, 64)}
  big = bench.gpu_candidates(4096, 8192)
  assert len(big) == 4 * 3 * 2


def test_tuned_kernel_rows_are_checked_against_the_reference(bench, tmp_path):
  out = tmp_path / "r"
  assert bench.main(["--out", str(out), "--interpret", "--tune", "--shapes", "128:1000",
                     "--ks", "40", "100", "--batch", "2", "--repeats", "1"]) == 0
  res = json.loads((out / "results.json").read_text())
  assert res["interpret"] and res["tuned"]
  for r in res["rows"]:
    assert r["kernel_max_err"] < 1e-5
    assert r["kernel_blocks"] in bench.gpu_candidates(128, r["k"])
    assert min(t["s"] for t in r["tuning"]) == r["kernel_s"]
  assert "INTERPRET mode" in (out / "results.md").read_text()


def test_tuning_grid_options_and_reports_after_each_shape(bench, tmp_path, monkeypatch):
  """--tune-* narrow the grid (num_stages included), and a run stopped during its second shape
  (a device step's time limit) keeps the first shape's rows on disk."""
  staged = bench.gpu_candidates(4096, 8192, {**bench.TUNE_GRID, "num_stages": (1, 3)})
  assert len(staged) == 2 * len(bench.gpu_candidates(4096, 8192))
  real = bench.bench
  calls = []

  def stop_at_second_shape(d, V, *a, **kw):
    calls.append((d, kw["tune_grid"]))
    if len(calls) == 2:
      raise KeyboardInterrupt  # what a time limit's signal does mid-run
    return real(d, V, *a, **kw)

  monkeypatch.setattr(bench, "bench", stop_at_second_shape)
  out = tmp_path / "r"
  with pytest.raises(KeyboardInterrupt):
    bench.main(["--out", str(out), "--interpret", "--tune", "--shapes", "128:1000", "64:500",
                "--ks", "40", "--batch", "2", "--repeats", "1", "--tune-block-k", "32",
                "--tune-block-d", "64", "--tune-num-warps", "4", "--tune-num-stages", "1", "2"])
  assert calls[0][1] == {"block_k": (32,), "block_d": (64,), "num_warps": (4,),
                         "num_stages": (1, 2)}
  res = json.loads((out / "results.json").read_text())
  assert [(r["d"], r["k"]) for r in res["rows"]] == [(128, 40)]
  assert {(t["block_k"], t["num_stages"]) for t in res["rows"][0]["tuning"]} == {(32, 1), (32, 2)}
  assert res["tune_grid"]["num_stages"] == [1, 2]
  assert "| 128 | 1000 | 40 |" in (out / "results.md").read_text()


def test_a_wrong_kernel_fails_the_run(bench, tmp_path, monkeypatch):
  import vocabjax.kernels.indexed_lm_head as ilh

  real = ilh.indexed_lm_head_gpu
  monkeypatch.setattr(ilh, "indexed_lm_head_gpu",
                      lambda h, U, idx, **kw: real(h, U, idx, **kw) * 1.1)
  with pytest.raises(AssertionError, match="differs from the f32 reference"):
    bench.main(["--out", str(tmp_path / "r"), "--interpret", "--tune", "--shapes", "64:500",
                "--ks", "16", "--batch", "2", "--repeats", "1"])
