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


def test_a_wrong_kernel_fails_the_run(bench, tmp_path, monkeypatch):
  import vocabjax.kernels.indexed_lm_head as ilh

  real = ilh.indexed_lm_head_gpu
  monkeypatch.setattr(ilh, "indexed_lm_head_gpu",
                      lambda h, U, idx, **kw: real(h, U, idx, **kw) * 1.1)
  with pytest.raises(AssertionError, match="differs from the f32 reference"):
    bench.main(["--out", str(tmp_path / "r"), "--interpret", "--tune", "--shapes", "64:500",
                "--ks", "16", "--batch", "2", "--repeats", "1"])
