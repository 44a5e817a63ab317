"""A result directory is the run's own: claimed by the run in it (a second run is refused
naming the first while it lives; a crashed run's successor takes over), never mixed with files
vocabjax did not write, never written through a symbolic link, and named by a suite's name that
is a name, not a path (before: two runs on one --out both exited 0 with every record twice; a
user's summary.md was overwritten; name ../x wrote outside runs/; a linked questions.jsonl was
appended through)."""

import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from tests.helpers.eval import run_eval
from vocabjax.eval import ConfigError, load_config
from vocabjax.eval.runner import RECORDS, ResultDirError

HOLD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from vocabjax.eval.runner import claim_dir
    claim_dir(Path(sys.argv[1]))
    print("held", flush=True)
    sys.stdin.readline()
""")


@pytest.mark.extended
def test_a_second_run_is_refused_while_the_first_lives_and_takes_over_after(suite, tmp_path):
  path, _ = suite
  out = tmp_path / "res"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ResultDirError, match=rf"in use by another run: process {holder.pid} "):
      run_eval(path, out)
    assert not (out / RECORDS).exists()  # refused before anything was written
  finally:
    holder.kill()  # as a crash: its lock goes with it
    holder.wait()
  summary = run_eval(path, out)  # the successor takes the directory over
  assert summary["methods"][0]["overall"]["questions"] == 4
  run_eval(path, out)  # and a rerun in the same process claims it again
  records = (out / RECORDS).read_text().splitlines()
  assert len(records) == len(set(records))  # nothing written twice


def test_a_directory_of_the_users_files_is_never_written_into(suite, tmp_path):
  path, _ = suite
  out = tmp_path / "mine"
  out.mkdir()
  (out / "summary.md").write_text("my own notes")
  (out / "data.csv").write_text("1,2")
  with pytest.raises(ResultDirError, match=r"not empty and holds no vocabjax run .*data.csv"):
    run_eval(path, out)
  assert (out / "summary.md").read_text() == "my own notes"
  assert sorted(p.name for p in out.iterdir()) == ["data.csv", "summary.md"]


def test_symbolic_links_in_a_run_directory_are_refused(suite, tmp_path):
  path, _ = suite
  out = tmp_path / "res"
  run_eval(path, out)
  outside = tmp_path / "outside.jsonl"
  outside.write_text((out / RECORDS).read_text())
  (out / RECORDS).unlink()
  (out / RECORDS).symlink_to(outside)
  before = outside.read_text()
  with pytest.raises(ResultDirError, match=r"symbolic link\(s\) \['questions.jsonl'\]"):
    run_eval(path, out)
  assert outside.read_text() == before


def test_a_result_file_replaced_by_a_directory_is_refused_before_the_run(suite, tmp_path):
  """summary.json made a directory: refused when the directory is claimed, naming it, not by
  the write at the end of the whole run (an IsADirectoryError after the work was done)."""
  path, _ = suite
  out = tmp_path / "res"
  run_eval(path, out)
  (out / "summary.json").unlink()
  (out / "summary.json").mkdir()
  before = (out / RECORDS).read_text()
  with pytest.raises(ResultDirError, match=r"summary.json is not a file \(a directory\?\)"):
    run_eval(path, out)
  assert (out / RECORDS).read_text() == before


@pytest.mark.parametrize("name", ["../x", "", "a/b", ".."])
def test_a_suite_name_is_a_name_not_a_path(suite, tmp_path, name):
  path, cfg = suite
  path.write_text(yaml.safe_dump({**cfg, "name": name}))
  with pytest.raises(ConfigError, match=r"name=.* must be a name .*not a path"):
    load_config(path)
