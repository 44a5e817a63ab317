"""Multi-process runs under jax.distributed: two local CPU processes (two virtual devices each)
count the same tokens and decode the same greedy ids on a mesh over all four devices as one
process does; bad settings are refused by name."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from vocabjax.calibrate.counts import Counts
from vocabjax.distributed import settings

from tests.helpers.compile import subprocess_xla_flags


def test_settings_from_arguments_and_environment():
  assert settings(env={}) is None  # one process
  assert settings("127.0.0.1:1234", 2, 1, env={}) == ("127.0.0.1:1234", 2, 1)
  env = {"JAX_COORDINATOR_ADDRESS": "h:5", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
  assert settings(env=env) == ("h:5", 4, 3)
  assert settings(process_id=0, env=env) == ("h:5", 4, 0)  # an argument wins
  with pytest.raises(ValueError, match=r"process_id=2 is out of range for num_processes=2"):
    settings("h:1", 2, 2, env={})
  with pytest.raises(ValueError, match=r"num_processes=0 must be >= 1"):
    settings("h:1", 0, 0, env={})
  with pytest.raises(ValueError, match=r"coordinator='nohost': expected HOST:PORT"):
    settings("nohost", 2, 0, env={})
  with pytest.raises(ValueError, match=r"needs the coordinator address.*process_id=None"):
    settings("h:1", 2, env={})
  with pytest.raises(ValueError, match=r"\$JAX_PROCESS_ID='x' is not an integer"):
    settings(env={**env, "JAX_PROCESS_ID": "x"})


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env():
  return {**os.environ, "XLA_FLAGS": subprocess_xla_flags(2),
          "JAX_PLATFORMS": "cpu"}


def run_eval(module_args, processes: int):
  """Run `python -m ...` as `processes` processes of one jax.distributed run; their outputs."""
  port = _port()
  procs = []
  for i in range(processes):
    extra = ([] if processes == 1 else
             ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes),
              "--process-id", str(i)])
    procs.append(subprocess.Popen([sys.executable, "-m", *module_args(i), *extra],
                                  env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  return outs


@pytest.mark.integration
@pytest.mark.slow
def test_two_processes_count_what_one_counts(tiny_chat_dir, tmp_path):
  text = tmp_path / "text"
  text.mkdir()
  rs = np.random.RandomState(0)
  words = ["def", "return", "fox", "print", "Hello", "range", "lazy", "tokens"]
  for i in range(7):  # 7 units of one document: the processes take uneven shares
    (text / f"d{i}.txt").write_text(" ".join(rs.choice(words, 40 + 9 * i)))

  def args(out):
    return lambda i: ["vocabjax.calibrate", "count", "--model", str(tiny_chat_dir), "--out",
                      str(tmp_path / out), "--text", str(text), "--docs-per-unit", "1",
                      "--quiet"]

  run_eval(args("one"), 1)
  run_eval(args("two"), 2)
  one, two = Counts.load(tmp_path / "one" / "counts.npz"), Counts.load(tmp_path / "two" /
                                                                         "counts.npz")
  np.testing.assert_array_equal(one.counts, two.counts)
  assert two.meta["processes"] == 2 and two.meta["devices"] == 4 and one.total > 0


@pytest.mark.integration
@pytest.mark.slow
def test_two_processes_decode_what_one_decodes(tiny_chat_dir, tmp_path):
  def args(name, mesh, method=()):
    return lambda i: ["vocabjax.generate", "--target", str(tiny_chat_dir), "--prompt",
                      "def add(a, b):", "--prompt", "x = 1", "--max-new-tokens", "10",
                      "--quiet", "--mesh", mesh, *method, "--output",
                      str(tmp_path / f"{name}.json")]

  chain = ["--method", "chain", "--draft", str(tiny_chat_dir), "--set", "gamma=3"]
  run_eval(args("one", "model=2", chain), 1)
  run_eval(args("two", "model=4", chain), 2)  # one mesh over both processes' devices
  one = json.loads((tmp_path / "one.json").read_text())
  two = json.loads((tmp_path / "two.json").read_text())
  assert two["output_ids"] == one["output_ids"] and two["speculative"]["tau"] >= 1
  assert two["settings"]["num_processes"] == 2


@pytest.mark.integration
@pytest.mark.slow
def test_two_processes_run_an_eval_suite_as_one_does(tiny_chat_dir, tmp_path):
  """`python -m vocabjax.eval` under jax.distributed: both processes decode every question on
  one mesh over their 4 devices; process 0 alone writes, once per question, the same greedy
  ids as a one-process run; a rerun resumes with nothing left to do."""
  import yaml

  from tests.helpers.eval import QUESTIONS

  bench = tmp_path / "bench.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  cfg = {"name": "dist", "target": str(tiny_chat_dir), "draft": str(tiny_chat_dir),
         "datasets": [{"kind": "spec_bench", "path": str(bench), "per_group": 1}],
         "max_new_tokens": 8, "max_len": 128, "time_split": True,
         "methods": [{"name": "ar", "method": "ar"},
                     {"name": "chain_g2", "method": "chain", "gamma": 2}]}
  suite = tmp_path / "dist.yaml"
  suite.write_text(yaml.safe_dump(cfg))

  def args(out, mesh):
    return lambda i: ["vocabjax.eval", "--config", str(suite), "--out", str(tmp_path / out),
                      "--quiet", "--reference", "none", "--mesh", mesh]

  def records(out):
    rows = [json.loads(x) for x in (tmp_path / out / "questions.jsonl").read_text()
            .splitlines()]
    return {(r["method"], r["qid"]): r["output_ids"] for r in rows}, len(rows)

  run_eval(args("one", "model=2"), 1)
  outs = run_eval(args("two", "model=4"), 2)
  one, n_one = records("one")
  two, n_two = records("two")
  assert two == one and n_two == n_one == len(one) >= 4  # no record written twice
  assert "| chain_g2 |" in outs[0][0] and "| chain_g2 |" not in outs[1][0]  # 0 reports
  split = json.loads((tmp_path / "two" / "splits.json").read_text())
  assert split["chain_g2"]["verification_s"] > 0
  run_eval(args("two", "model=4"), 2)  # resumed: nothing to run, nothing appended
  assert records("two")[1] == n_two


def test_a_peer_that_never_comes_is_a_bounded_wait_with_one_error_line(tmp_path):
  """Process 1 of 2 with no process 0: it says what it waits for and for how long, then stops
  with one error line (it printed nothing for minutes, then JAX aborted the process)."""
  import socket
  import subprocess
  import sys

  with socket.socket() as s:  # a free port nobody listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**__import__("os").environ, "VOCABJAX_INIT_TIMEOUT": "2", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "vocabjax.generate", "--target", "t", "--prompt",
                         "p", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                         "--process-id", "1", "--mesh", "data=2,model=1"],
                        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
  assert proc.returncode == 2, proc.stderr
  assert f"waiting up to 2 s for the coordinator at 127.0.0.1:{port}" in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      f"error: process 1 of 2: no coordinator answered at 127.0.0.1:{port} within 2 s")


def test_init_timeout_setting(monkeypatch):
  from vocabjax import distributed

  monkeypatch.setenv("VOCABJAX_INIT_TIMEOUT", "soon")
  with pytest.raises(ValueError, match=r"VOCABJAX_INIT_TIMEOUT='soon' is not a whole number"):
    distributed.init_timeout()
  monkeypatch.setenv("VOCABJAX_INIT_TIMEOUT", "45")
  assert distributed.init_timeout() == 45
