"""`python -m vocabjax.eval --report-only`: the reports of a result directory from the records it
holds, generating nothing; a run cut short is reported on the questions every method finished."""

import json

import pytest

from vocabjax.eval import ConfigError
from vocabjax.eval.report import validate_summary
from vocabjax.eval.runner import RECORDS

from tests.helpers.eval import run_eval


@pytest.mark.extended
def test_report_only_matches_the_run_and_reports_a_cut_run_on_finished_questions(
    suite, tmp_path, capsys, monkeypatch):  # noqa: F811
  path, _ = suite
  out = tmp_path / "res"
  full = run_eval(path, out)
  import vocabjax.eval.runner as runner

  def no_models(*a, **k):
    raise AssertionError("--report-only loaded a model")

  monkeypatch.setattr(runner, "load_model", no_models)
  # records made on another machine: the report names that one, not this
  run = json.loads((out / "run.json").read_text())
  run["inputs"]["machine"] = {"host": "elsewhere", "cpu": "Fake CPU [avx2]", "cpus": 7}
  (out / "run.json").write_text(json.dumps(run))
  # a complete run: the same tables as the run wrote, and no model is loaded
  again = run_eval(path, out, "--report-only")
  assert again.get("partial") is None
  for a, b in zip(full["methods"], again["methods"]):
    assert a["name"] == b["name"]
    for key in ("questions", "tokens", "tau", "tokens_per_s", "speedup", "match_rate", "mbsu"):
      assert a["overall"][key] == b["overall"][key], (a["name"], key)
  assert again["environment"]["report_only"] is True
  env = again["environment"]
  assert (env["machine"], env["cpu"], env["cpu_count"]) == ("elsewhere", "Fake CPU [avx2]", 7)
  assert "Fake CPU [avx2]" in (out / "summary.md").read_text()

  # cut the run: the last question's tree record is missing (as after Ctrl-C mid-question)
  records = [json.loads(line) for line in (out / RECORDS).read_text().splitlines()]
  last = records[-1]
  assert last["method"] == "tree"
  (out / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records[:-1]))
  for f in out.glob("summary.*"):
    f.unlink()
  capsys.readouterr()
  cut = run_eval(path, out, "--report-only")
  validate_summary(json.loads((out / "summary.json").read_text()))
  assert cut["partial"]["questions"] == 3 and cut["partial"]["of"] == 4
  assert cut["partial"]["records_left_out"] == 2  # ar and chain_g2 of that question
  assert cut["partial"]["left_out"] == [f"{last['qid']}/seed {last['seed']}"]
  kept = [r for r in records if r["qid"] != last["qid"]]
  for m in cut["methods"]:
    mine = [r for r in kept if r["method"] == m["name"]]
    assert m["overall"]["questions"] == 3
    assert m["overall"]["tokens"] == sum(r["num_tokens"] for r in mine)
  md = (out / "summary.md").read_text()
  assert "partial run**: 3 of 4 questions" in md and last["qid"] in md
  assert (out / RECORDS).read_text().count("\n") == len(records) - 1  # records untouched


def test_report_only_refuses_what_it_cannot_report(suite, tmp_path):  # noqa: F811
  path, _ = suite
  with pytest.raises(ConfigError, match="no run.json"):
    run_eval(path, tmp_path / "empty", "--report-only")
  with pytest.raises(ConfigError, match="cannot be combined with --reuse"):
    run_eval(path, tmp_path / "x", "--report-only", "--reuse", str(tmp_path))
  out = tmp_path / "started"
  out.mkdir()
  from vocabjax.eval import load_config
  cfg = load_config(path)
  (out / "run.json").write_text(json.dumps({"fingerprint": cfg.fingerprint(),
                                            "config": cfg.as_dict(), "inputs": None}))
  with pytest.raises(ConfigError, match="holds no records yet"):
    run_eval(path, out, "--report-only")
  rec = {"framework": "vocabjax", "method": "ar", "qid": "q", "seed": 0}
  (out / RECORDS).write_text(json.dumps(rec) + "\n")
  with pytest.raises(ConfigError, match="no question .* was finished by every method"):
    run_eval(path, out, "--report-only")
  (out / "run.json").write_text(json.dumps({"fingerprint": "other", "config": {}}))
  with pytest.raises(ConfigError, match="different configuration"):
    run_eval(path, out, "--report-only")


def test_report_only_never_rewrites_the_records_file(tmp_path):
  """A torn last line is left where it is by --report-only (a run appending to the file may
  still be writing it; only a run repairs), and a complete corrupt last line is an error."""
  from vocabjax.eval.runner import ResultDirError, read_records

  p = tmp_path / "questions.jsonl"
  p.write_text('{"qid": "a"}\n{"qid": "b", "x')
  assert read_records(p, repair=False) == [{"qid": "a"}]
  assert p.read_text() == '{"qid": "a"}\n{"qid": "b", "x'
  p.write_text('{"qid": "a"}\nnot json\n')
  with pytest.raises(ResultDirError, match=r"questions.jsonl:2 is corrupt"):
    read_records(p, repair=False)
  assert p.read_text() == '{"qid": "a"}\nnot json\n'


@pytest.mark.extended
def test_report_only_names_a_record_that_lacks_keys(suite, tmp_path):  # noqa: F811
  """A record missing keys (hand-edited, another tool's) is named by file:line and keys, not a
  KeyError traceback."""
  path, _ = suite
  out = tmp_path / "res"
  run_eval(path, out)
  lines = (out / RECORDS).read_text().splitlines()
  rec = json.loads(lines[2])
  del rec["wall_s"], rec["output_ids"]
  lines[2] = json.dumps(rec)
  (out / RECORDS).write_text("\n".join(lines) + "\n")
  from vocabjax.eval.runner import ResultDirError

  with pytest.raises(ResultDirError, match=r"questions.jsonl:3 is not a whole record: it lacks "
                     r"\['output_ids', 'wall_s'\]"):
    run_eval(path, out, "--report-only")


def test_duplicate_question_ids_are_named(tmp_path):
  from vocabjax.prompts import DatasetSpec, load_prompts

  bench = tmp_path / "b.jsonl"
  rows = [{"question_id": 7, "category": "qa", "turns": ["a"]},
          {"question_id": 7, "category": "qa", "turns": ["b"]}]
  bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(ConfigError, match=r"duplicate question ids \['spec_bench/7'\]"):
    load_prompts([DatasetSpec(kind="spec_bench", path=str(bench), per_group=5)])


def test_negative_counts_are_called_corrupt_not_empty():
  import numpy as np

  from vocabjax.vocab.subset import SubsetError, select

  with pytest.raises(SubsetError, match=r"negative values \(token 2: -5\): a corrupt counts"):
    select(np.array([3, 1, -5, 2]), k=2)
