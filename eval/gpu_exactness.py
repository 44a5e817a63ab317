"""The decoding exactness tests run on the machine's default JAX backend (a GPU, where one is lent),
in f32 and in bf16: greedy identity of every method against plain decoding and the chi-square
checks of sampled output, on the tests' tiny random models.

  python eval/gpu_exactness.py --out $OUT/exactness            # on the GPU machine
  python eval/gpu_exactness.py --out /tmp/ex --dtypes float32 --limit-s 120   # anywhere

It runs pytest over the test files of `FILES`, keeping the tests whose names say what they check
(`-k`: every greedy-identity test, and the chi-square tests of the chain and of SpecVocab), once
per dtype, with `--workers` pytest-xdist processes sharing the GPU (memory not preallocated):
`VOCABJAX_TEST_DTYPE=bfloat16` casts the shared model pairs of tests/decoding/conftest.py to bf16
(tests that build their own models keep their dtype; a few are bf16 already). Each dtype's run
has its own time limit; at it pytest is interrupted and reports what finished, failures with
their tracebacks (`pytest_<dtype>.log`). Writes `exactness.md` (a table of passed / failed /
skipped per dtype and every failure's name) and `exactness.json` beside the XMLs, after each
dtype. Exit 0 when nothing failed."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("tests/vocab/test_ranked.py", "tests/vocab/test_trimmed.py",  # the vocabulary methods
         "tests/decoding/test_speculative_chain.py", "tests/decoding/test_speculative_tree.py",
         "tests/decoding/test_medusa_decoding.py", "tests/decoding/test_crossvocab.py",
         "tests/decoding/test_pld.py", "tests/decoding/test_eagle_lookup.py",
         "tests/decoding/test_eagle_gate.py", "tests/decoding/test_eagle_decoding.py",
         "tests/decoding/test_weight_dtypes.py",  # first what the first H100 run missed
         "tests/decoding/test_nonfinite.py")  # NaN / inf logits flagged in the GPU's programs
SELECT = ("greedy or identical or (lossless and (test_speculative_chain or test_ranked)) or "
          "test_nonfinite")
SUM_ATTENTION = [False]  # --sum-attention: decoders attend by summed products (lowering.py)
GRACE_S = 30  # after the interrupt: pytest's report of what ran (then it is killed)
POLL_S = 0.25  # how often a cut condition (cut_when) is asked
LINE = re.compile(r"(?:(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+::\S+)|(\S+::\S+) "
                  r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS))")


def junit_summary(path: Path) -> dict:
  """{passed, failed, skipped, failures: [names]} from a pytest JUnit XML ({} if unreadable)."""
  try:
    root = ET.parse(path).getroot()
  except (OSError, ET.ParseError):
    return {}
  out = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "seconds": 0.0}
  for case in root.iter("testcase"):
    if not case.get("name"):  # the test running when pytest was interrupted: not a result
      continue
    name = f"{case.get('classname', '')}::{case.get('name', '')}"
    out["seconds"] += float(case.get("time", 0) or 0)
    if case.find("failure") is not None or case.find("error") is not None:
      out["failed"] += 1
      node = case.find("failure") if case.find("failure") is not None else case.find("error")
      msg = " | ".join(l for l in (node.get("message") or "").splitlines() if l.strip())
      out["failures"].append(f"{name}: {msg[:200]}")
    elif case.find("skipped") is not None:
      out["skipped"] += 1
    else:
      out["passed"] += 1
  return out


def log_summary(log: str) -> dict:
  """The same summary from pytest's verbose log (what a run cut at its limit leaves)."""
  out = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "seconds": None}
  for m in LINE.finditer(log):
    status, name = (m[1], m[2]) if m[1] else (m[4], m[3])
    key = {"PASSED": "passed", "XPASS": "passed", "SKIPPED": "skipped", "XFAIL": "skipped"}.get(
        status, "failed")
    out[key] += 1
    if key == "failed":
      out["failures"].append(name)
  return out


@contextlib.contextmanager
def _sigint_not_ignored():
  """SIGINT handled (Python's default) while a child starts: a parent that ignores it (a
  background job of a script, an xdist worker) would pass SIG_IGN on through exec, and the
  child would never see the interrupt. A handler is reset to the default by exec; SIG_IGN is
  not."""
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
    yield
    return
  signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def wait_or_cut(proc: subprocess.Popen, limit_s: float, cut_when=None) -> bool:
  """Wait for `proc`; True if it was still running at `limit_s` or when `cut_when()` (polled,
  optional: a test's condition instead of the clock) became true."""
  deadline = time.monotonic() + limit_s
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      return True
    try:
      proc.wait(timeout=min(left, POLL_S) if cut_when else left)
      return False
    except subprocess.TimeoutExpired:
      if cut_when is not None and cut_when():
        return True


def run_dtype(dtype: str, out: Path, limit_s: int, files, select: str, workers: int,
              extra, cut_when=None) -> dict:
  """One dtype's pytest run, cut at `limit_s` (or when `cut_when()`, polled, says so); its output
  goes to `pytest_<dtype>.log` as it runs."""
  xml = out / f"junit_{dtype}.xml"
  log_path = out / f"pytest_{dtype}.log"
  cmd = [sys.executable, "-m", "pytest", "-v", "-rfE", "--tb=short", "-p", "no:cacheprovider",
         *files, "-k", select,
         f"--junitxml={xml}", *(["-n", str(workers)] if workers > 1 else []), *extra]
  # tests/conftest.py defaults JAX_PLATFORMS to cpu: name this machine's backend first
  import jax
  backend = {"gpu": "cuda"}.get(jax.default_backend(), jax.default_backend())
  env = {**os.environ, "VOCABJAX_TEST_DTYPE": dtype, "PYTHONPATH": str(ROOT),
         "VOCABJAX_SUM_ATTENTION": "1" if SUM_ATTENTION[0] else "0",
         "JAX_PLATFORMS": backend if backend == "cpu" else f"{backend},cpu",
         "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # several workers share one GPU
  t0 = datetime.datetime.now()
  # At the limit pytest is interrupted (SIGINT), not killed: it then prints the failures so far
  # with their tracebacks and writes the JUnit XML, as after a finished run (runs cut by a
  # kill kept the failures' names and lost why they failed).
  with open(log_path, "w") as log_file:
    with _sigint_not_ignored():
      proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_file,
                              stderr=subprocess.STDOUT, text=True)
    cut = wait_or_cut(proc, limit_s, cut_when)
    if cut:
      proc.send_signal(signal.SIGINT)
      try:
        proc.wait(timeout=GRACE_S)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        xml.unlink(missing_ok=True)  # a half-written XML: the verbose log is read instead
  rc = proc.returncode
  log = log_path.read_text(errors="replace")
  res = {"dtype": dtype, "command": " ".join(cmd), "exit": rc, "cut_at_limit_s": limit_s if cut
         else None, "wall_s": (datetime.datetime.now() - t0).total_seconds(),
         **(junit_summary(xml) or log_summary(log))}
  print(f"[exactness] {dtype}: exit {rc}, {res.get('passed')} passed, {res.get('failed')} failed,"
        f" {res.get('skipped')} skipped in {res['wall_s']:.0f}s" + (" (CUT)" if cut else ""),
        flush=True)
  return res


def write(out: Path, env: dict, runs: list[dict]) -> None:
  from vocabjax.io import atomic_write_text

  atomic_write_text(out / "exactness.json", json.dumps({"environment": env, "runs": runs},
                                                       indent=1))
  lines = [f"# Decoding exactness tests on {env['device']} ({env['backend']})"
           + (", attention by summed products (Lowering.sum_attention)" if env.get(
               "sum_attention") else ""), "",
           f"`{env['command']}`", "", f"- {env['date']}, jax {env['jax']}; tests selected by "
           f"`-k \"{env['select']}\"` in {len(env['files'])} files", "",
           "| dtype | passed | failed | skipped | wall s | cut at limit |", "|---|---|---|---|---|---|"]
  for r in runs:
    lines.append(f"| {r['dtype']} | {r.get('passed', '?')} | {r.get('failed', '?')} | "
                  f"{r.get('skipped', '?')} | {r['wall_s']:.0f} | "
                  f"{r['cut_at_limit_s'] or 'no'} |")
  for r in runs:
    for f in r.get("failures", []):
      lines.append(f"- FAILED ({r['dtype']}): {f}")
  atomic_write_text(out / "exactness.md", "\n".join(lines) + "\n")


def main(argv=None, cut_when=None) -> int:
  """The command line; `cut_when` (Python callers: a test) cuts each dtype's run when it says
  so, the limit still applying."""
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True)
  p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                 choices=("float32", "bfloat16"))
  p.add_argument("--limit-s", type=int, default=150, help="time limit of each dtype's run")
  p.add_argument("--workers", type=int, default=1, help="pytest-xdist processes (-n)")
  p.add_argument("--files", nargs="+", default=list(FILES))
  p.add_argument("-k", dest="select", default=SELECT)
  p.add_argument("--sum-attention", action="store_true",
                 help="the tests' decoders with Lowering.sum_attention (VOCABJAX_SUM_ATTENTION=1)")
  p.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[])
  a = p.parse_args(argv)
  SUM_ATTENTION[0] = a.sum_attention
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  import jax

  dev = jax.devices()[0]
  env = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
         "backend": jax.default_backend(), "device": getattr(dev, "device_kind", str(dev)),
         "jax": jax.__version__, "files": a.files, "select": a.select,
         "sum_attention": a.sum_attention,
         "command": "python eval/gpu_exactness.py " + " ".join(
             sys.argv[1:] if argv is None else argv)}
  runs = []
  for dtype in a.dtypes:
    runs.append(run_dtype(dtype, out, a.limit_s, a.files, a.select, a.workers, a.pytest_args,
                           cut_when))
    write(out, env, runs)
  print((out / "exactness.md").read_text())
  return 0 if all(r.get("failed", 1) == 0 and r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
  sys.exit(main())
