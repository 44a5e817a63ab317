"""kernels/bench_indexed_lm_head.py: tuning over the kernel's configurations, device-side
timing, the on-device correctness check, the HLO report and the dispatch table it writes, run
with the GPU kernel in interpret mode on tiny shapes."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "kernels" / "bench_indexed_lm_head.py"
SMALL = ["--repeats", "1", "--calls", "1", "--copy-mib", "8", "16"]


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location("bench_indexed_lm_head", _PATH)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_candidates_fit_the_shape(bench):
  small = bench.gpu_candidates(64, 16)
  assert {(c["block_k"], c["block_d"], c["split_d"]) for c in small} == {(64, 128, 1)}
  assert {c["variant"] for c in small} == {"fma", "dot"}
  big = bench.gpu_candidates(4096, 8192)
  assert len(big) == 2 * 2 * 2 * 2 * 1 * 2
  # d = 896: block_d 256 runs as 128 (aligned_block_d), 7 chunks, split 4 allowed
  assert all(c["split_d"] <= 7 for c in bench.gpu_candidates(896, 2048))
  assert not [c for c in bench.gpu_candidates(128, 64, {**bench.TUNE_GRID, "split_d": (8,)})]
  # split_d > 1 only where the programs fill fewer than two waves of the SMs
  assert {c["split_d"] for c in bench.gpu_candidates(4096, 512, B=10, sms=132)} == {1, 4}
  assert {c["split_d"] for c in bench.gpu_candidates(4096, 8192, B=10, sms=132)} == {1}
  # a persistent grid: split 1 only, at most one program per tile (B * k / block_k)
  grid = {**bench.TUNE_GRID, "variant": ("dot",), "block_k": (32, 64), "block_d": (128,),
          "num_warps": (4,), "split_d": (1, 2), "persist": (0, 264, 528)}
  got = {(c["block_k"], c["split_d"], c["persist"])
         for c in bench.gpu_candidates(4096, 2048, grid, B=10, sms=400)}
  assert got == {(32, 1, 0), (32, 2, 0), (64, 1, 0), (64, 2, 0), (32, 1, 264), (32, 1, 528),
                 (64, 1, 264)}  # 64-row tiles: 320, fewer than 528


@pytest.mark.extended
def test_persistent_grids_per_sm(bench, tmp_path, monkeypatch):
  """--tune-persist-per-sm N adds N x the SM count to the persistent grids tried, so one
  command fits GPUs with different SM counts; without a count it is refused."""
  monkeypatch.setattr(bench, "sm_count", lambda: 2)
  out = tmp_path / "r"
  assert bench.main(["--out", str(out), "--interpret", "--tune", "--shapes", "64:500", "--ks",
                     "128", "--batch", "2", "--tune-variant", "dot", "--tune-block-k", "64",
                     "--tune-block-d", "64", "--tune-num-warps", "4", "--tune-split-d", "1",
                     "--tune-persist", "0", "--tune-persist-per-sm", "1", "2", *SMALL]) == 0
  res = json.loads((out / "results.json").read_text())
  assert res["tune_grid"]["persist"] == [0, 2, 4]
  assert {t["persist"] for t in res["rows"][0]["tuning"]} == {0, 2, 4}  # 4 tiles: all fit
  assert res["rows"][0]["kernel_max_err"] < 1e-5
  md = (out / "results.md").read_text()
  assert "The persistent grid (`persist` > 0) against one program per tile" in md
  assert "| 2 | 64 | 128 | " in md.split("against one program per tile")[1]  # bar: "-" (B = 2)
  monkeypatch.setattr(bench, "sm_count", lambda: None)
  with pytest.raises(SystemExit):
    bench.main(["--out", str(tmp_path / "r2"), "--tune", "--shapes", "64:500", "--ks", "128",
                "--tune-persist-per-sm", "2", *SMALL])


def test_persist_table_reads_the_bar_from_the_best_of_each_grid(bench):
  def cfg(persist, s):
    return {"variant": "dot", "block_k": 64, "block_d": 128, "num_warps": 4, "num_stages": 3,
            "split_d": 1, "persist": persist, "s": s}

  def row(d, xla, tuning):
    return {"B": 10, "d": d, "V": 151936, "k": 2048, "bytes": 10 * 2048 * d * 2,
            "xla_gather_s": xla, "tuning": tuning}

  res = {"read_GBps": 4500.0, "rows": [
      row(4096, 60e-6, [cfg(0, 58e-6), cfg(0, 70e-6), cfg(264, 44e-6), cfg(528, None)]),
      row(2560, 48e-6, [cfg(0, 45e-6), cfg(264, 40e-6)]),
      row(1024, 48e-6, [cfg(0, 45e-6)])]}  # no persistent grid timed: no line
  lines = bench.persist_table(res)
  body = [line for line in lines if line.startswith("| 10 |")]
  assert len(body) == 2
  assert "| 0.0580 | 1.03x |" in body[0] and "| 0.0440 | 1.36x | 85% |" in body[0]
  assert body[0].endswith("| yes |") and body[1].endswith("| no |")  # 48 / 40 = 1.20x
  assert bench.persist_table({"rows": [row(4096, 60e-6, [cfg(0, 58e-6)])]}) == []


def test_tuned_kernel_rows_are_checked_against_the_reference(bench, tmp_path):
  out = tmp_path / "r"
  assert bench.main(["--out", str(out), "--interpret", "--tune", "--shapes", "128:1000",
                     "--ks", "40", "100", "--batch", "2", "--tune-block-k", "64",
                     "--tune-num-warps", "4", "--hlo-dump", "--contiguous", *SMALL]) == 0
  res = json.loads((out / "results.json").read_text())
  assert res["interpret"] and res["tuned"] and res["copy_GBps"] > 0
  for r in res["rows"]:
    assert r["kernel_max_err"] < 1e-5
    assert r["kernel_blocks"] in bench.gpu_candidates(128, r["k"], res["tune_grid"])
    assert min(t["s"] for t in r["tuning"]) == r["kernel_s"]
    assert r["kernel_host_s"] > 0 and r["xla_gather_host_s"] > 0 and r["full_host_s"] > 0
  md = (out / "results.md").read_text()
  assert "INTERPRET mode" in md and "| 2 | 128 | 1000 | 40 |" in md
  assert res["hlo"]["shape"] == "f32[2,100,128]" and (out / "xla_reference_hlo.txt").is_file()
  assert "XLA reference's compiled HLO" in md
  assert res["read_GBps"] > 0 and set(res["hlo_by_k"]) == {"40"}  # every k dumped
  assert res["hlo_by_k"]["40"]["shape"] == "f32[2,40,128]" and "- at k = 40:" in md
  assert (out / "xla_reference_hlo_k40.txt").is_file()
  # --contiguous: XLA and the tuned kernel timed again on runs of consecutive rows
  assert all(r["xla_contig_s"] > 0 and r["kernel_contig_s"] > 0 for r in res["rows"])
  assert "The same sizes with consecutive rows" in md and "| 2 | 128 | 100 |" in md
  # interpret-mode times never reach a dispatch table
  assert json.loads((out / "dispatch.json").read_text()) == []


def test_contiguous_indices_are_runs_of_consecutive_rows(bench):
  import jax

  idx = np.asarray(bench.contiguous_indices(jax.random.key(3), 4, 3, 50, 1000))
  assert idx.shape == (4, 3, 50) and idx.min() >= 0 and idx.max() < 1000
  assert (np.diff(idx, axis=-1) == 1).all()  # k consecutive rows per set (no wrap at V - k)
  assert len({int(i) for i in idx[..., 0].ravel()}) > 1  # at random offsets


def test_device_timing_subtracts_one_dispatch_and_sizes_the_program(bench, monkeypatch):
  import jax.numpy as jnp

  seen = []
  calls_of = {}

  def fake_median(fn, *args, repeats):
    n = calls_of.get(fn, 0)
    seen.append(n)
    return 60e-6 + 50e-6 * n  # 60 us of dispatch + 50 us a call

  real_many = bench.many_calls

  def many(fn, n):
    prog = real_many(fn, n)
    calls_of[prog] = n
    return prog

  monkeypatch.setattr(bench, "median_s", fake_median)
  monkeypatch.setattr(bench, "many_calls", many)
  hs, idxs = jnp.ones((64, 1, 1)), jnp.zeros((64, 1, 1), jnp.int32)
  got, n = bench.device_s(lambda h, U, i: h, hs, jnp.ones((1, 1)), idxs, 1, target_s=2e-3)
  assert seen == [0, 1, 40] and n == 40  # dispatch, one call, then 2 ms worth of calls
  assert got == pytest.approx(50e-6)
  got, n = bench.device_s(lambda h, U, i: h, hs[:8], jnp.ones((1, 1)), idxs[:8], 1)
  assert n == 8 and got == pytest.approx(50e-6)  # at most len(idxs) calls


def test_many_calls_are_chained_so_xla_cannot_merge_them(bench):
  """The full head's N products share U: without a dependency between them XLA's DotMerger made
  them one product (a recorded H200 run timed the full head at 13.7 TB/s). Each call's inputs
  pass a barrier with the running total, and the sum is still every call's."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  hs = jax.random.normal(jax.random.key(0), (5, 2, 8))
  U = jax.random.normal(jax.random.key(1), (16, 8))
  idxs = jnp.zeros((5, 2, 1), jnp.int32)
  full = lambda h, U, i: h @ U.T  # noqa: E731
  prog = bench.many_calls(full, 5)
  want = sum(float(np.sum(np.asarray(hs[i]) @ np.asarray(U).T)) for i in range(5))
  assert float(prog(hs, U, idxs)) == pytest.approx(want, rel=1e-5)
  jaxpr = jax.make_jaxpr(prog)(hs, U, idxs).jaxpr.eqns
  jaxpr = jaxpr[0].params["jaxpr"].jaxpr.eqns  # inside the jit
  kinds = [e.primitive.name for e in jaxpr if e.primitive.name in ("optimization_barrier",
                                                                    "dot_general")]
  assert kinds == ["optimization_barrier", "dot_general"] * 5  # each product after its barrier


def test_tuning_grid_options_and_reports_after_each_shape(bench, tmp_path, monkeypatch):
  """--tune-* narrow the grid, and a run stopped during its second shape (a device step's time
  limit) keeps the first shape's rows on disk."""
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
                "--ks", "40", "--batch", "2", "--tune-block-k", "64", "--tune-block-d", "64",
                "--tune-num-warps", "4", "--tune-num-stages", "1", "2", "--tune-variant", "dot",
                "--tune-split-d", "1", *SMALL])
  assert calls[0][1] == {"variant": ("dot",), "block_k": (64,), "block_d": (64,),
                         "num_warps": (4,), "num_stages": (1, 2), "split_d": (1,),
                         "persist": (0,)}
  res = json.loads((out / "results.json").read_text())
  assert [(r["d"], r["k"]) for r in res["rows"]] == [(128, 40)]
  assert {(t["block_k"], t["num_stages"]) for t in res["rows"][0]["tuning"]} == {(64, 1), (64, 2)}
  assert res["tune_grid"]["num_stages"] == [1, 2]


def test_dispatch_entries_and_table_update(bench, tmp_path):
  res = {"interpret": False, "with_kernel": True, "device": "G", "dtype": "bfloat16",
         "commit": "abc", "date": "d",
         "rows": [{"B": 10, "k": 512, "d": 1024, "V": 100352, "kernel_s": 1e-5,
                   "xla_gather_s": 2e-5, "kernel_host_s": 9e-5, "xla_gather_host_s": 1e-4,
                   "kernel_blocks": {"variant": "dot", "block_k": 64}},
                  {"B": 1, "k": 512, "d": 2048, "V": 128256, "kernel_s": 1.6e-5,
                   "xla_gather_s": 2.5e-5, "kernel_host_s": 9.3e-5, "xla_gather_host_s": 8.3e-5,
                   "kernel_blocks": {"variant": "dot", "block_k": 64}}]}
  entries = bench.dispatch_entries(res)
  assert entries[0]["K"] == 512 and entries[0]["config"]["variant"] == "dot"
  assert (entries[1]["kernel_host_s"], entries[1]["xla_host_s"]) == (9.3e-5, 8.3e-5)
  from vocabjax.kernels import dispatch
  path = dispatch.merge(entries, tmp_path / "t.json")
  assert dispatch.choose("G", "bfloat16", 9, 400, 1000, dispatch.load_table(path)) == {
      "variant": "dot", "block_k": 64}
  # faster by device time, slower by host-timed single calls (a recorded H200 run, B = 1): XLA
  assert dispatch.choose("G", "bfloat16", 1, 512, 2048, dispatch.load_table(path)) is None

  # recorded runs merge into a table here, oldest first, without a GPU (--from-results)
  runs = []
  for i, ratio in enumerate((0.5, 1.2)):  # the second run has the kernel slower at B = 10
    r = {**res, "commit": f"c{i}", "rows": [{**res["rows"][0], "kernel_s": 2e-5 * ratio}]}
    runs.append(tmp_path / f"r{i}.json")
    runs[-1].write_text(json.dumps(r))
  table = tmp_path / "table.json"
  assert bench.main(["--from-results", str(runs[0]), "--update-table", str(table)]) == 0
  assert dispatch.choose("G", "bfloat16", 10, 512, 1024, dispatch.load_table(table)) is not None
  assert bench.main(["--from-results", str(runs[1]), "--update-table", str(table)]) == 0
  got = dispatch.load_table(table)
  assert [h["commit"] for h in got[0]["history"]] == ["c0"]
  assert dispatch.choose("G", "bfloat16", 10, 512, 1024, got) is None
  with pytest.raises(SystemExit):
    bench.main(["--from-results", str(runs[0])])  # no table named
  (tmp_path / "bad.json").write_text("{")
  with pytest.raises(SystemExit):
    bench.main(["--from-results", str(tmp_path / "bad.json"), "--update-table", str(table)])


def test_a_wrong_kernel_fails_the_run(bench, tmp_path, monkeypatch):
  import vocabjax.kernels.indexed_lm_head as ilh

  real = ilh.indexed_lm_head_gpu
  monkeypatch.setattr(ilh, "indexed_lm_head_gpu",
                      lambda h, U, idx, **kw: real(h, U, idx, **kw) * 1.1)
  with pytest.raises(AssertionError, match="differs from the f32 reference"):
    bench.main(["--out", str(tmp_path / "r"), "--interpret", "--tune", "--shapes", "64:500",
                "--ks", "16", "--batch", "2", "--tune-variant", "fma", "--tune-block-k", "64",
                "--tune-num-warps", "4", "--tune-split-d", "1", *SMALL])
