"""kernels/gpu_bench.sh's default set (the GPU run prepared for a lent machine) dry-run on the CPU:
every step runs at tiny shapes (the kernel in interpret mode), writes its reports and logs, and
the packed archive holds them; a failing step does not stop the others."""

import json
import os
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.helpers.compile import subprocess_xla_flags
from tests.helpers.lab import tiny_configs

ROOT = Path(__file__).parents[2]


@pytest.mark.integration
@pytest.mark.slow
def test_prepared_gpu_run_dry_on_cpu(tmp_path):
  t, d = tiny_configs(tmp_path)
  table_before = (ROOT / "vocabjax/kernels/dispatch_table.json").read_bytes()
  w = tmp_path / "w"
  env = {**os.environ, "DRY": "1", "W": str(w), "DRY_TARGET": str(t), "DRY_DRAFT": str(d),
         "JAX_PLATFORMS": "cpu", "PERSIST": "1"}
  env["XLA_FLAGS"] = subprocess_xla_flags()  # one CPU device, the suite's compile setting
  proc = subprocess.run(["bash", "kernels/gpu_bench.sh"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  log = (w / "steps.log").read_text()
  order = ("kernel_smoke", "kernel_persist", "kernel_persist2", "kernel_b10", "kernel_k2048",
           "kernel_b1", "exactness", "steps_slots96", "steps_slots128", "exactness_sum",
           "steps_specvocab")  # exactness before the whole steps
  for name in order:
    assert f"== {name}: exit 0" in log, log
  assert [log.index(f"== {n}: exit 0") for n in order] == sorted(
    log.index(f"== {n}: exit 0") for n in order), log
  assert "dot 1 2 max rel err" in (w / "kernel_smoke.log").read_text()  # the persistent grid
  persist = json.loads((w / "kernel_persist" / "results.json").read_text())["rows"][0]
  assert {c["persist"] for c in persist["tuning"]} == {0, 2} and persist["kernel_contig_s"]
  b10 = json.loads((w / "kernel_b10" / "results.json").read_text())
  assert b10["interpret"] and b10["rows"][0]["kernel_max_err"] < 1e-5
  assert (w / "kernel_b10" / "dispatch.json").is_file()
  steps = {r["method"] for r in json.loads(
      (w / "steps_specvocab" / "steps.json").read_text())["rows"]}
  assert steps == {"ar", "chain_g3", "sv16_g3_xla", "sv16_g3_auto"}
  for slots in (96, 128):  # the plain step at two cache lengths
    rows = json.loads((w / f"steps_slots{slots}" / "steps.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["ar", "ar+sum"]
  ex_sum = json.loads((w / "exactness_sum" / "exactness.json").read_text())
  assert ex_sum["environment"]["sum_attention"] and ex_sum["runs"][0]["passed"] >= 1
  assert ex_sum["runs"][0]["failed"] == 0
  ex = json.loads((w / "exactness" / "exactness.json").read_text())
  assert ex["runs"][0]["passed"] >= 1 and ex["runs"][0]["failed"] == 0
  with tarfile.open(w / "out" / "gpu_bench.tgz") as tar:
    names = tar.getnames()
  assert "./exactness/exactness.md" in names and "./steps.log" in names
  # a dry run merges into a copy, never the package's table; interpret-mode rows never merge
  assert (ROOT / "vocabjax/kernels/dispatch_table.json").read_bytes() == table_before
  assert json.loads((w / "dispatch_table.json").read_text())["entries"] == json.loads(
      table_before)["entries"]


def test_unknown_set_is_refused_before_anything_runs(tmp_path):
  proc = subprocess.run(["bash", "kernels/gpu_bench.sh"], cwd=ROOT, capture_output=True, text=True,
                        env={**os.environ, "SET": "third", "W": str(tmp_path / "w")})
  assert proc.returncode == 2 and "SET=third: choose kernel, first, second or quant" in proc.stderr
  assert not (tmp_path / "w").exists()


@pytest.mark.extended
def test_skipped_steps_and_the_budget(tmp_path):
  """SKIP leaves named steps out; a step that would start with under 20 s of BUDGET_S left is
  skipped and says so (the device call's own limit never cuts the run mid-step)."""
  w = tmp_path / "w"
  env = {**os.environ, "DRY": "1", "W": str(w), "DRY_TARGET": "unused", "DRY_DRAFT": "unused",
         "JAX_PLATFORMS": "cpu", "BUDGET_S": "0",
         "SKIP": "kernel_smoke kernel_b10 kernel_k2048 kernel_b1"}
  proc = subprocess.run(["bash", "kernels/gpu_bench.sh"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  log = (w / "steps.log").read_text()
  assert "== kernel_smoke: skipped (SKIP)" in log and "== kernel_b1: skipped (SKIP)" in log
  assert "== steps_specvocab: skipped" in log and "of BUDGET_S=0 left" in log
  assert "== exactness: skipped" in log and "python3" not in log, proc.stdout[-2000:]


@pytest.mark.integration
@pytest.mark.slow
def test_a_failing_persistent_grid_skips_only_its_steps(tmp_path):
  """The new grid failing its smoke test (here: a refused program count) costs its own steps,
  not the established kernel's measurements."""
  w = tmp_path / "w"
  env = {**os.environ, "DRY": "1", "W": str(w), "DRY_TARGET": "unused", "DRY_DRAFT": "unused",
         "JAX_PLATFORMS": "cpu", "DRY_SMOKE_PERSIST": "-1", "XLA_FLAGS": subprocess_xla_flags(),
         "SKIP": "kernel_b10 kernel_k2048 kernel_b1 steps_specvocab exactness steps_slots96 "
                 "steps_slots128 exactness_sum", "PERSIST": "1"}
  proc = subprocess.run(["bash", "kernels/gpu_bench.sh"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  log = (w / "steps.log").read_text()
  assert "== kernel_smoke: exit 0" in log, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert "persist=-1 must be 0" in (w / "kernel_smoke.log").read_text()
  assert "== kernel_persist: skipped (the persistent grid failed kernel_smoke)" in log
  assert "kernel_persist2" not in log
  # without PERSIST=1 (the default) the grid is not measured
  env.pop("PERSIST")
  env["W"] = str(tmp_path / "w2")
  subprocess.run(["bash", "kernels/gpu_bench.sh"], cwd=ROOT, env=env, capture_output=True,
                 text=True, timeout=300)
  log = (tmp_path / "w2" / "steps.log").read_text()
  assert "== kernel_smoke: exit 0" in log and "== kernel_persist" not in log, log


def test_exactness_run_cut_at_its_limit_keeps_why_tests_failed(tmp_path, monkeypatch):
  """eval/gpu_exactness.py interrupts pytest at the limit: the failures so far come back
  with their tracebacks and counts, not only their names (a cut run lost them). The
  cut comes when the third test has started (it says so in a file), not at a time: a loaded
  machine may take any time to start pytest; the limit (300 s) is only a backstop."""
  from tests.helpers.lab import load_script

  started = tmp_path / "c_started"
  tests = tmp_path / "test_cut.py"
  tests.write_text("import time\nfrom pathlib import Path\n\n"
                   "def test_greedy_a():\n  assert 1 == 2, 'tokens differ at 7'\n\n"
                   "def test_greedy_b():\n  pass\n\n"
                   f"def test_greedy_c():\n  Path({str(started)!r}).touch()\n  time.sleep(600)\n")
  out = tmp_path / "ex"
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # as in a background job of a script (and an xdist worker): SIGINT ignored by the parent
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    rc = load_script("gpu_exactness").main(
        ["--out", str(out), "--dtypes", "float32", "--limit-s", "300", "--files", str(tests),
         "-k", "greedy", "--pytest-args", "-p", "no:randomly"], cut_when=started.exists)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert rc == 1
  run = json.loads((out / "exactness.json").read_text())["runs"][0]
  assert run["cut_at_limit_s"] == 300 and (run["passed"], run["failed"]) == (1, 1), run
  assert "test_greedy_a" in run["failures"][0]
  log = (out / "pytest_float32.log").read_text()
  assert "tokens differ at 7" in log and "KeyboardInterrupt" in log, log[-2000:]
  assert "test_greedy_a" in (out / "exactness.md").read_text()


def test_exactness_run_waits_for_a_run_that_ends_before_its_limit(tmp_path, monkeypatch):
  tests = tmp_path / "test_quick.py"
  tests.write_text("def test_greedy_a():\n  pass\n")
  out = tmp_path / "ex"
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  from tests.helpers.lab import load_script

  rc = load_script("gpu_exactness").main(["--out", str(out), "--dtypes", "float32", "--limit-s",
                                      "300", "--files", str(tests), "-k", "greedy"],
                                     cut_when=lambda: False)
  run = json.loads((out / "exactness.json").read_text())["runs"][0]
  assert rc == 0 and run["cut_at_limit_s"] is None and run["passed"] == 1, run


@pytest.mark.integration
@pytest.mark.slow
def test_the_quantized_set_dry_on_cpu(tmp_path):
  """SET=quant at tiny shapes: bf16, int4 and int8 steps of both pairs and the exactness tests
  of the quantized paths, each writing its report; int4's weights counted at 4 bits a code."""
  t, d = tiny_configs(tmp_path)
  for path in (t, d):  # grouped int4 needs whole 32-value groups in every row
    cfg = json.loads(path.read_text())
    cfg.update(hidden_size=64, intermediate_size=128)
    path.write_text(json.dumps(cfg))
  w = tmp_path / "w"
  env = {**os.environ, "DRY": "1", "SET": "quant", "W": str(w), "DRY_TARGET": str(t),
         "DRY_DRAFT": str(d), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": subprocess_xla_flags()}
  proc = subprocess.run(["bash", "kernels/gpu_bench.sh"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  log = (w / "steps.log").read_text()
  for name in ("steps_8b_bf16", "steps_8b_int4", "steps_8b_int4_xla", "exactness_quant",
               "steps_8b_int8", "steps_1.5b_bf16", "steps_1.5b_int4"):
    assert f"== {name}: exit 0" in log, log
  gb = {wt: json.loads((w / f"steps_8b_{wt}" / "steps.json").read_text())["environment"][
      "weight_gb"]["target"] for wt in ("bf16", "int8", "int4", "int4_xla")}
  assert gb["int4"] == gb["int4_xla"] < gb["int8"] < gb["bf16"], gb  # 4-bit codes + scales
  ex = json.loads((w / "exactness_quant" / "exactness.json").read_text())
  assert ex["runs"][0]["passed"] >= 1 and ex["runs"][0]["failed"] == 0
