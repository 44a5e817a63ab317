"""A user's mistake on any command line is one `error:` line naming the value, exit 2, no
traceback, and nothing written: checked before any model is fetched or loaded."""

import json

import pytest


def _run(main, argv):
  try:
    return main(argv)
  except SystemExit as e:  # argparse and cli() exit
    return e.code


def _cases(tmp):
  afile = tmp / "afile"
  afile.write_text("x")
  adir = tmp / "adir"
  adir.mkdir()
  empty = tmp / "empty.json"
  empty.write_text("")
  rowless = tmp / "rowless.json"
  rowless.write_text(json.dumps({"meta": {}}))
  run = tmp / "run"
  run.mkdir()
  truncated = tmp / "truncated.json"
  truncated.write_text(json.dumps({"meta": {}, "rows": [{"model": "m"}]}))
  from vocabjax.bench.__main__ import main as bench
  from vocabjax.calibrate.__main__ import main as calibrate
  from vocabjax.eval.__main__ import cli as eval_cli
  from vocabjax.generate import cli as generate
  from vocabjax.zoo import main as zoo
  return {
      "zoo fetch unknown": (zoo, ["fetch", "nope"], "unknown registry model 'nope'", {}),
      "zoo cache is a file": (zoo, ["fetch", "smollm2-135m-instruct"],
                              f"the model cache {afile} ($VOCABJAX_CACHE) is a file",
                              {"VOCABJAX_CACHE": str(afile)}),
      "generate seed 2**70": (generate, ["--target", "t", "--prompt", "p", "--seed",
                                         str(2 ** 70)], f"{2 ** 70} is outside [0, 2**32)", {}),
      "generate seed 2**32": (generate, ["--target", "t", "--prompt", "p", "--seed",
                                         str(2 ** 32)], "4294967296 is outside", {}),
      "eval out is a file": (eval_cli, ["--out", str(afile)], f"--out {afile} is a file", {}),
      "eval out under a file": (eval_cli, ["--out", str(afile / "r")],
                                f"{afile} is a file, so the directory cannot be made", {}),
      "calibrate count out is a file": (calibrate, ["count", "--model", "m", "--out",
                                                    str(afile), "--text", str(afile)],
                                        f"--out {afile} is a file", {}),
      "calibrate select out is a dir": (calibrate, ["select", str(afile), "--model",
                                                    "m", "--k", "8", "--out", str(adir)],
                                        f"--out {adir} is a directory", {}),
      "calibrate plot out is a file": (calibrate, ["plot", str(afile), "--out", str(afile)],
                                       f"--out {afile} is a file", {}),
      "calibrate seed 2**32": (calibrate, ["count", "--model", "m", "--out", str(tmp / "c"),
                                           "--text", str(afile), "--seed", str(2 ** 32)],
                               "4294967296 is outside", {}),
      "bench out is a file": (bench, ["--target", "t", "--draft", "d", "--out", str(afile)],
                              f"--out {afile} is a file", {}),
      "bench project empty input": (bench, ["project", "--run", str(run), "--bench", str(empty)],
                                    "not a readable bench.json", {}),
      "bench project no rows": (bench, ["project", "--run", str(run), "--bench", str(rowless)],
                                "not a bench.json (no rows list)", {}),
      "bench project truncated": (bench, ["project", "--run", str(run), "--bench", str(truncated)],
                                  "error: ", {}),
  }


NAMES = ["zoo fetch unknown", "zoo cache is a file", "generate seed 2**70", "generate seed 2**32",
         "eval out is a file", "eval out under a file", "calibrate count out is a file",
         "calibrate select out is a dir", "calibrate plot out is a file",
         "calibrate seed 2**32", "bench out is a file", "bench project empty input",
         "bench project no rows", "bench project truncated"]


@pytest.mark.parametrize("name", NAMES)
def test_a_bad_input_is_one_error_line_exit_2_and_nothing_written(name, tmp_path, capsys,
                                                                  monkeypatch):
  main, argv, needle, env = _cases(tmp_path)[name]
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  monkeypatch.chdir(tmp_path)
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
  assert _run(main, argv) == 2
  err = capsys.readouterr().err
  lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("usage:")
           and not ln.startswith(" ")]
  assert "Traceback" not in err, err
  assert len(lines) == 1 and "error: " in lines[0] and needle in lines[0], err
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_full_disk_is_one_line_naming_the_file_and_the_free_space(tmp_path, monkeypatch,
                                                                    capsys, tiny_chat_dir):
  """ENOSPC while an eval writes a record, or wrapped by a writer thread (orbax) while a trainer
  checkpoints: one `error:` line saying the disk is full, which file, how much is free, that
  what was finished is kept (before: a traceback, and 18 of orbax's from training)."""
  import errno

  import yaml

  from vocabjax.errors import disk_full
  from vocabjax.eval import __main__ as ev
  from vocabjax.eval import runner

  def full(path, record):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))

  bench = tmp_path / "bench.jsonl"
  bench.write_text('{"question_id": 1, "category": "qa", "turns": ["Who are you?"]}\n')
  cfg = {"name": "tiny", "target": str(tiny_chat_dir), "max_new_tokens": 4, "max_len": 64,
         "datasets": [{"kind": "spec_bench", "path": str(bench), "per_group": 1}],
         "methods": [{"name": "ar", "method": "ar"}]}
  (tmp_path / "s.yaml").write_text(yaml.safe_dump(cfg))
  monkeypatch.setattr(runner, "append_jsonl", full)
  with pytest.raises(SystemExit) as e:
    ev.cli(["--config", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "res"), "--quiet"])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith("error: the disk is full: writing ") and "questions.jsonl" in err
  assert "MB free there" in err and "what was finished is kept" in err
  # wrapped, as orbax's threads wrap it
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device", "/x/ckpt")
    except OSError as inner:
      raise RuntimeError("async save failed") from inner
  except RuntimeError as outer:
    assert disk_full(outer).filename == "/x/ckpt"
