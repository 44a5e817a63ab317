"""`python -m vocabjax.eval` end to end on tiny random models (seconds), resume, bad input."""

import json

import pytest
import yaml

from vocabjax.eval import ConfigError, load_config, validate_summary
from vocabjax.eval.__main__ import main, parse_args
from vocabjax.eval.runner import RECORDS, ResultDirError
from tests.helpers.eval import QUESTIONS, run_eval


def test_end_to_end_writes_every_report(suite, tmp_path):
  path, _ = suite
  out = tmp_path / "res"
  summary = run_eval(path, out)
  validate_summary(json.loads((out / "summary.json").read_text()))
  for f in ("summary.md", "summary.csv", "speedup_by_group.png", "run.json", "splits.json"):
    assert (out / f).stat().st_size > 0, f
  # every method drafts over the full vocabulary: one x, no figure, and the summary says so
  assert not (out / "tau_vs_vocab.png").exists()
  assert "tau_vs_vocab.png is not drawn: every method drafts over" in (
      out / "summary.md").read_text()
  assert summary["groups"] == ["multi-turn", "translation", "qa"]  # writing+coding = multi-turn
  records = [json.loads(line) for line in (out / RECORDS).read_text().splitlines()]
  assert len(records) == 4 * 3  # 4 questions x 3 methods
  for r in records:  # per-step drafts and acceptances, for projections onto other machines
    if r["method"] == "ar":
      assert r["step_drafted"] is None
    else:
      assert len(r["step_drafted"]) == len(r["step_accepted"]) == r["steps"]
      assert sum(r["step_drafted"]) == r["drafted"] and sum(r["step_accepted"]) == r["accepted"]
  by = {m["name"]: m for m in summary["methods"]}
  for name in ("chain_g2", "tree"):
    o = by[name]["overall"]
    assert o["match_rate"] == 1.0  # greedy speculative output == greedy AR output
    assert o["tau"] > 1 and o["speedup"] > 0 and o["time_split"]["verification_s"] > 0
    assert o["mbsu"] == pytest.approx(o["tau"] / (1 * (2 if name == "chain_g2" else 2) + 1))
  assert by["chain_g2"]["overall"]["acceptance_rate"] == 1.0  # drafter == target
  assert by["ar"]["overall"]["tau"] == 1.0 and by["ar"]["overall"]["speedup"] == 1.0
  md = (out / "summary.md").read_text()
  assert "| chain_g2 |" in md and "translation" in md and "Time split" in md
  csv = (out / "summary.csv").read_text().splitlines()
  assert csv[0].startswith("method,framework,group") and len(csv) == 1 + 3 * 4


def test_resume_after_an_interrupted_run(suite, tmp_path):
  path, _ = suite
  out = tmp_path / "res"
  first = run_eval(path, out)
  lines = (out / RECORDS).read_text().splitlines()
  # interrupted: 5 records kept, the 6th torn mid-write
  (out / RECORDS).write_text("\n".join(lines[:5]) + "\n" + lines[5][:17])
  second = run_eval(path, out)
  again = [json.loads(line) for line in (out / RECORDS).read_text().splitlines()]
  assert len(again) == 12
  assert again[:5] == [json.loads(line) for line in lines[:5]]  # kept, not redone
  key = lambda r: (r["method"], r["qid"])  # noqa: E731
  assert {key(r): r["output_ids"] for r in again} == {
      key(json.loads(line)): json.loads(line)["output_ids"] for line in lines}
  assert second["methods"][1]["overall"]["match_rate"] == 1.0
  assert first["fingerprint"] == second["fingerprint"]
  run_eval(path, out)  # complete: nothing new
  assert len((out / RECORDS).read_text().splitlines()) == 12


@pytest.mark.extended
def test_other_configuration_is_refused_then_moved_aside(suite, tmp_path):
  path, _ = suite
  out = tmp_path / "res"
  run_eval(path, out)
  before = (out / RECORDS).read_text()
  with pytest.raises(ResultDirError, match="different configuration.*max_new_tokens"):
    run_eval(path, out, "--max-new-tokens", "5")
  assert (out / RECORDS).read_text() == before  # untouched
  run_eval(path, out, "--max-new-tokens", "5", "--overwrite")
  aside = [p for p in tmp_path.iterdir() if p.name.startswith("res.replaced-")]
  assert len(aside) == 1 and (aside[0] / RECORDS).read_text() == before


def test_category_filter_and_bench_override(suite, tmp_path):
  path, _ = suite
  summary = run_eval(path, tmp_path / "r", "--categories", "qa", "translation")
  assert summary["groups"] == ["translation", "qa"]
  with pytest.raises(ConfigError, match=r"unknown categories \['poetry'\]"):
    run_eval(path, tmp_path / "r2", "--categories", "poetry")
  with pytest.raises(ConfigError, match="Spec-Bench file not found: .*nope.jsonl"):
    run_eval(path, tmp_path / "r3", "--spec-bench", str(tmp_path / "nope.jsonl"))
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps(QUESTIONS[0]) + "\n{\"question_id\": 9}\n")
  with pytest.raises(ConfigError, match="bad.jsonl:2: not a Spec-Bench row"):
    run_eval(path, tmp_path / "r4", "--spec-bench", str(bad))
  assert not (tmp_path / "r4").exists()  # nothing written for a bad dataset


def test_methods_filter_keeps_the_baseline(suite, tmp_path):
  path, _ = suite
  summary = run_eval(path, tmp_path / "m", "--methods", "tree")
  assert [m["name"] for m in summary["methods"]] == ["ar", "tree"]  # AR kept as the baseline
  rows = [json.loads(x) for x in (tmp_path / "m" / "questions.jsonl").read_text().splitlines()]
  assert {r["method"] for r in rows} == {"ar", "tree"}
  with pytest.raises(ConfigError, match=r"--methods: \['chian'\] not in suite 'tiny', whose "
                                        r"methods are \['ar', 'chain_g2', 'tree'\]"):
    run_eval(path, tmp_path / "m2", "--methods", "chian")
  with pytest.raises(ConfigError, match="results of a different configuration"):
    run_eval(path, tmp_path / "m", "--methods", "chain_g2")  # a subset is its own configuration


def test_chat_template_variables_reach_the_prompts(suite, tmp_path, tiny_thinking_dir):
  """A suite's `chat_template_kwargs` render the target's chat template (Qwen3's
  enable_thinking: false appends `<think></think>`): every prompt grows by those tokens."""
  path, cfg = suite

  def prompt_tokens(out, **extra):
    p = tmp_path / f"{out}.yaml"
    p.write_text(yaml.safe_dump({**cfg, "target": str(tiny_thinking_dir), **extra,
                                 "draft": None, "methods": [{"name": "ar", "method": "ar"}]}))
    run_eval(p, tmp_path / out)
    rows = [json.loads(x) for x in (tmp_path / out / "questions.jsonl").read_text().splitlines()]
    return [r["prompt_tokens"] for r in rows]

  plain = prompt_tokens("plain")
  off = prompt_tokens("off", chat_template_kwargs={"enable_thinking": False})
  from transformers import AutoTokenizer

  extra = len(AutoTokenizer.from_pretrained(tiny_thinking_dir)("<think></think>",
                                                               add_special_tokens=False)
              ["input_ids"])
  assert extra > 0 and [o - p for o, p in zip(off, plain)] == [extra] * len(plain)


def test_prompt_longer_than_max_len_fails_before_running(suite, tmp_path):
  path, cfg = suite
  p = tmp_path / "short.yaml"
  p.write_text(yaml.safe_dump({**cfg, "max_len": 24}))
  with pytest.raises(ConfigError, match=r"\d+ of 4 prompts cannot run: spec_bench/\d+ \(.*"
                                        r"bench.jsonl\): \d+ tokens \+ \d+ slots for new tokens "
                                        r"exceed max_len=24"):
    run_eval(p, tmp_path / "o")
  assert not (tmp_path / "o" / RECORDS).exists()


@pytest.mark.parametrize("change, message", [
    ({"methods": [{"name": "ar", "method": "ar"}, {"method": "lookahead"}]},
     "unknown method 'lookahead'"),
    ({"methods": [{"name": "ar", "method": "ar"}, {"method": "chain", "gama": 3}]},
     r"no parameters \['gama'\]"),
    ({"methods": [{"method": "chain", "gamma": 3}]}, "need an 'ar' baseline"),
    ({"datasets": [{"kind": "mmlu"}]}, "unknown dataset kind 'mmlu'"),
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer, got 0"),
    ({"temprature": 0.5}, r"unknown fields \['temprature'\]"),
])
def test_bad_config_is_rejected_with_the_value(suite, tmp_path, change, message):
  _, cfg = suite
  p = tmp_path / "bad.yaml"
  p.write_text(yaml.safe_dump({**cfg, **change}))
  with pytest.raises(ConfigError, match=message):
    load_config(p)


def test_shipped_suites_parse():
  for name in ("default", "spec_bench", "humaneval", "gsm8k", "compare_torch", "vocabtrim"):
    cfg = load_config(name)
    assert cfg.methods[0].method == "ar"
  with pytest.raises(ConfigError, match="shipped suites: .*default"):
    load_config("no_such_suite")


def test_cli_exit_code_and_message_for_bad_config(tmp_path):
  import subprocess
  import sys

  p = tmp_path / "x.yaml"
  p.write_text("target: t\ndatasets: [{kind: spec_bench}]\nmethods: [{method: nope}]\n")
  proc = subprocess.run([sys.executable, "-m", "vocabjax.eval", "--config", str(p), "--out",
                         str(tmp_path / "o")], capture_output=True, text=True)
  assert proc.returncode == 2 and "unknown method 'nope'" in proc.stderr


@pytest.mark.extended
def test_compare_torch_runs_transformers_on_the_same_prompts(suite, tmp_path):
  path, _ = suite
  summary = run_eval(path, tmp_path / "t", "--compare-torch", "--categories", "qa")
  by = {m["name"]: m for m in summary["methods"]}
  assert summary["torch"]["transformers"]
  # transformers' greedy and assisted outputs agree with vocabjax's greedy output
  assert by["torch:ar"]["overall"]["match_rate"] == 1.0
  assert by["torch:assisted"]["overall"]["match_rate"] == 1.0
  assert by["torch:assisted"]["overall"]["speedup"] > 0


@pytest.mark.parametrize("dtype", ["int8", "int4", "gguf"])
def test_compare_torch_refuses_weights_pytorch_does_not_run(tmp_path, dtype):
  """Quantized weights have no transformers counterpart: an error naming the dtype, before a
  model is loaded or the result directory made."""
  p = tmp_path / "s.yaml"
  p.write_text("target: t\ndatasets: [{kind: spec_bench}]\nmethods: [{method: ar}]\n")
  out = tmp_path / "o"
  with pytest.raises(ConfigError, match=f"the suite's weights are '{dtype}', which PyTorch does "
                     f"not run"):
    main(parse_args(["--config", str(p), "--out", str(out), "--compare-torch", "--dtype", dtype]))
  assert not out.exists()


def test_a_gguf_suite_without_a_dtype_names_its_blocks_in_its_inputs(tmp_path):
  """A suite that leaves the dtype to a GGUF file loads its blocks: the run's inputs say so,
  so a directory made when no dtype meant the values dequantized is not resumed with them;
  beside PyTorch (--compare-torch) no dtype still means float32, as transformers runs it."""
  from vocabjax.eval import provenance
  from vocabjax.eval.config import config_from_dict
  from vocabjax.eval.runner import suite_dtypes

  raw = {"target": str(tmp_path / "t.gguf"), "draft": str(tmp_path / "d.gguf"),
         "datasets": [{"kind": "humaneval", "limit": 1}], "methods": [{"method": "ar"}]}
  cfg = config_from_dict(raw, check_files=False)
  inputs = provenance.inputs(cfg, [], suite_dtypes(cfg))
  assert inputs["weights"] == {"target": "gguf", "draft": "gguf"}
  assert suite_dtypes(cfg, compare_torch=True) == ("float32", "float32")
  assert "weights" not in provenance.inputs(cfg, [], suite_dtypes(cfg, compare_torch=True))
  mixed = config_from_dict({**raw, "draft_dtype": "int8"}, check_files=False)
  assert provenance.inputs(mixed, [], suite_dtypes(mixed))["weights"] == {"target": "gguf"}
  f32 = config_from_dict({**raw, "dtype": "float32"}, check_files=False)
  old = provenance.inputs(f32, [], suite_dtypes(f32))
  assert "weights" not in old
  assert provenance.describe_change(old, inputs) == (
      "the weights loaded: the dtype fields' weights then, the target's gguf blocks, the "
      "draft's gguf blocks now (no dtype loads a GGUF file's own blocks; dtype float32 its "
      "values dequantized)")


@pytest.mark.extended
def test_sampled_suite_runs_every_seed(suite, tmp_path):
  path, cfg = suite
  p = tmp_path / "sampled.yaml"
  p.write_text(yaml.safe_dump({**cfg, "temperature": 0.7, "top_p": 0.9, "seeds": [0, 1],
                               "methods": cfg["methods"][:2]}))
  summary = run_eval(p, tmp_path / "s", "--categories", "qa")
  records = [json.loads(line) for line in (tmp_path / "s" / RECORDS).read_text().splitlines()]
  assert sorted((r["method"], r["seed"]) for r in records) == [
      ("ar", 0), ("ar", 1), ("chain_g2", 0), ("chain_g2", 1)]
  chain = summary["methods"][1]["overall"]
  assert "match_rate" not in chain  # only greedy runs are compared token for token
  assert chain["questions"] == 2 and chain["speedup"] > 0


@pytest.mark.extended
def test_changed_inputs_are_not_resumed(suite, tmp_path, tiny_chat_dir, monkeypatch):
  """Same config, other inputs: a drafter replaced in place, a question edited under its id,
  another machine. Each is refused (nothing touched) and --overwrite starts afresh."""
  import shutil

  from vocabjax.eval import provenance

  path, cfg = suite
  draft = tmp_path / "draft"
  shutil.copytree(tiny_chat_dir, draft)
  cfg = {**cfg, "draft": str(draft)}
  path.write_text(yaml.safe_dump(cfg))
  out = tmp_path / "res"
  run_eval(path, out)
  before = (out / RECORDS).read_text()
  run_eval(path, out)  # same inputs: resumed, nothing redone
  assert (out / RECORDS).read_text() == before

  weights = next(p for p in draft.iterdir() if p.suffix == ".safetensors")
  weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # same path, other content
  with pytest.raises(ResultDirError, match="other inputs: draft changed content"):
    run_eval(path, out)
  assert (out / RECORDS).read_text() == before
  shutil.rmtree(draft)
  shutil.copytree(tiny_chat_dir, draft)  # the original drafter again: resumable again
  run_eval(path, out)

  bench = tmp_path / "bench.jsonl"
  edited = [dict(q) for q in QUESTIONS]
  edited[1]["turns"] = ["def sub(a, b):"]
  bench.write_text("".join(json.dumps(q) + "\n" for q in edited))
  with pytest.raises(ResultDirError, match="questions' text changed"):
    run_eval(path, out)
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))

  monkeypatch.setattr(provenance, "machine_id", lambda: {"host": "elsewhere", "cpu": "x",
                                                         "cpus": 64})
  with pytest.raises(ResultDirError, match="another machine"):
    run_eval(path, out)
  assert (out / RECORDS).read_text() == before
  run_eval(path, out, "--overwrite")  # a fresh directory; the old one moved aside intact
  aside = [p for p in tmp_path.iterdir() if p.name.startswith("res.replaced-")]
  assert len(aside) == 1 and (aside[0] / RECORDS).read_text() == before
  run = json.loads((out / "run.json").read_text())
  assert run["inputs"]["machine"]["host"] == "elsewhere"
  assert run["inputs"]["models"]["draft"].startswith("dir-sha256:")


@pytest.mark.extended
def test_a_prompt_too_long_for_the_model_fails_up_front_or_is_skipped(suite, tmp_path):
  """No max_len: a question longer than the model's context is found before anything runs
  (named with its file; nothing written), or with --skip-bad-prompts left out and listed,
  while the other questions' records are made and kept across reruns."""
  path, cfg = suite
  bench = tmp_path / "bench.jsonl"
  rows = QUESTIONS + [{"question_id": 9, "category": "qa", "turns": ["word " * 3000]}]
  bench.write_text("".join(json.dumps(q) + "\n" for q in rows))
  cfg = {**cfg, "max_len": None, "datasets": [{"kind": "spec_bench", "path": str(bench)}]}
  path.write_text(yaml.safe_dump(cfg))
  out = tmp_path / "res"
  with pytest.raises(ConfigError, match=r"1 of 5 prompts cannot run: spec_bench/9 \(.*bench"
                                        r"\.jsonl\): \d+ tokens .* exceed the target's context"):
    run_eval(path, out)
  assert not (out / "run.json").exists()  # the directory is not claimed
  summary = run_eval(path, out, "--skip-bad-prompts")
  assert [q["qid"] for q in summary["skipped"]] == ["spec_bench/9"]
  assert "skipped (--skip-bad-prompts)" in (out / "summary.md").read_text()
  records = (out / RECORDS).read_text()
  assert len(records.splitlines()) == 4 * 3 and "spec_bench/9" not in records
  run_eval(path, out, "--skip-bad-prompts")  # resumes: nothing redone
  assert (out / RECORDS).read_text() == records
  # every prompt too long: one line before anything runs, not a summary that breaks its schema
  bench.write_text(json.dumps(rows[-1]) + "\n")
  with pytest.raises(ConfigError, match=r"all 1 prompts cannot run \(spec_bench/9: .*\): "
                                        r"--skip-bad-prompts leaves nothing to measure"):
    run_eval(path, tmp_path / "none", "--skip-bad-prompts")
  assert not (tmp_path / "none" / "run.json").exists()


@pytest.mark.parametrize("method, message", [
    ({"name": "c0", "method": "chain", "gamma": 0},
     "chain needs 1 <= gamma <= 4096 .*got gamma=0"),
    ({"name": "t", "method": "tree", "top_k": 2, "depth": 2, "total_tokens": 9},
     "exceeds the 6 candidates"),
])
def test_bad_method_parameters_fail_before_claiming_the_directory(suite, tmp_path, method,
                                                                 message):
  path, cfg = suite
  bad = tmp_path / "bad.yaml"
  bad.write_text(yaml.safe_dump({**cfg, "methods": [{"name": "ar", "method": "ar"}, method]}))
  out = tmp_path / "res"
  with pytest.raises(ConfigError, match=message):
    run_eval(bad, out)
  assert not out.exists()
  run_eval(path, out)  # the corrected suite may use the directory
  assert (out / RECORDS).exists()


def test_a_decoder_that_cannot_be_built_is_a_config_error_before_claiming(suite, tmp_path,
                                                                         tiny_dirs):
  """A drafter of another vocabulary for a same-vocabulary method: a one-line config error
  naming the method (not a traceback), and --out stays free."""
  from vocabjax.checkpoints.hf import load_hf

  path, cfg = suite
  other = next(d for d in tiny_dirs.values()
               if load_hf(d)[0].vocab_size != load_hf(cfg["target"])[0].vocab_size)
  bad = tmp_path / "bad.yaml"
  bad.write_text(yaml.safe_dump({**cfg, "draft": str(other)}))
  out = tmp_path / "res"
  with pytest.raises(ConfigError, match=r"method 'chain_g2' \(chain\) cannot be built .*"
                                        r"vocabulary"):
    run_eval(bad, out)
  assert not out.exists()


def test_chat_without_a_chat_template_is_a_config_error(suite, tmp_path, tiny_chat_dir):
  import shutil

  path, cfg = suite
  model = tmp_path / "nochat"
  shutil.copytree(tiny_chat_dir, model)
  for f in model.iterdir():
    if f.name.startswith("chat_template"):
      f.unlink()
  tc = model / "tokenizer_config.json"
  tc.write_text(json.dumps({k: v for k, v in json.loads(tc.read_text()).items()
                            if k != "chat_template"}))
  bad = tmp_path / "bad.yaml"
  bad.write_text(yaml.safe_dump({**cfg, "target": str(model), "draft": str(model)}))
  with pytest.raises(ConfigError, match="chat: true, but the target's tokenizer .* has no chat "
                                        "template; set chat: false"):
    run_eval(bad, tmp_path / "res")
  assert not (tmp_path / "res").exists()


def test_unknown_suite_lists_eval_suites_only():
  with pytest.raises(ConfigError, match="shipped suites") as e:
    load_config("no_such_suite")
  msg = str(e.value)
  assert "'default'" in msg and "'vocabtrim'" in msg
  assert "ranker_qwen05b_d56" not in msg and "distill_" not in msg  # training recipes


def test_ctrl_c_is_a_clean_exit_that_says_how_to_resume(monkeypatch, capsys, tmp_path):
  import vocabjax.eval.__main__ as cli_mod

  def interrupted(*a, **k):
    raise KeyboardInterrupt

  monkeypatch.setattr(cli_mod, "main", interrupted)
  with pytest.raises(SystemExit) as e:
    cli_mod.cli(["--out", str(tmp_path / "o")])
  assert e.value.code == 130
  err = capsys.readouterr().err
  assert "interrupted" in err and "rerun the same command to resume" in err
  assert "Traceback" not in err


@pytest.mark.extended
def test_the_report_sets_a_run_beside_the_recorded_reference(suite, tmp_path, monkeypatch):
  from vocabjax.eval import report

  path, _ = suite
  refs = tmp_path / "references"
  monkeypatch.setattr(report, "REFERENCE_ROOT", refs)
  first = run_eval(path, tmp_path / "recorded")  # no reference of the suite yet
  assert "reference" not in first
  written = report.write_reference(tmp_path / "recorded" / "summary.json", refs,
                                   source="eval/results/tiny")
  assert written == refs / "tiny.json" and not list(refs.glob("*.partial"))
  mine = run_eval(path, tmp_path / "mine")  # default: the shipped reference of the same suite
  ref = mine["reference"]
  assert ref["same_config"] and ref["commit"] == first["environment"]["commit"]
  assert ref["path"] == "eval/results/tiny"
  assert set(ref["methods"]) == {"ar", "chain_g2", "tree"}
  for name, v in ref["methods"].items():
    assert v["tau"]["this"] == v["tau"]["reference"]  # greedy, same models: same drafts
    assert v["match_rate"]["this"] == v["match_rate"]["reference"] == 1.0
    assert v["tokens_per_s"]["this"] > 0 and v["tokens_per_s"]["reference"] > 0
  md = (tmp_path / "mine" / "summary.md").read_text()
  assert "beside the recorded reference run" in md and "| chain_g2 |" in md.split("beside")[1]
  # a full summary.json given by --reference reads the same as its trimmed copy
  again = run_eval(path, tmp_path / "again", "--reference", str(tmp_path / "recorded"))
  assert again["reference"]["methods"].keys() == ref["methods"].keys()
  assert again["reference"]["path"] == str(tmp_path / "recorded")
  validate_summary(json.loads((tmp_path / "mine" / "summary.json").read_text()))

  other = run_eval(path, tmp_path / "other", "--max-new-tokens", "5", "--reference",
               str(tmp_path / "recorded" / "summary.json"))
  assert other["reference"]["same_config"] is False
  assert "another configuration" in (tmp_path / "other" / "summary.md").read_text()
  # "none": no comparison (the same records reported again: --report-only generates nothing)
  assert "reference" not in run_eval(path, tmp_path / "mine", "--report-only", "--reference",
                                     "none")
  assert "beside the recorded reference run" not in (tmp_path / "mine" / "summary.md").read_text()
  with pytest.raises(FileNotFoundError, match="nowhere"):  # a typo fails before any work
    run_eval(path, tmp_path / "typo", "--reference", str(tmp_path / "nowhere"))
  assert not (tmp_path / "typo").exists()


@pytest.mark.extended
def test_ctrl_c_during_a_question_finishes_and_records_it_then_stops(suite, tmp_path,
                                                                     monkeypatch, capsys):
  # A Ctrl-C that lands while XLA runs a program is deferred: the question in flight is
  # finished and recorded, the run then stops (exit 130 from the CLI); a rerun resumes.
  import os
  import signal

  from vocabjax.decoding.autoregressive import Decoder
  from vocabjax.eval.__main__ import cli

  path, _ = suite
  out = tmp_path / "res"
  real = Decoder.generate
  calls = []

  def generate(self, *a, **k):
    calls.append(1)
    if len(calls) == 1:  # the first question's warm-up call: Ctrl-C arrives mid-question
      os.kill(os.getpid(), signal.SIGINT)
    return real(self, *a, **k)

  monkeypatch.setattr(Decoder, "generate", generate)
  # the handler the process had: Python's default_int_handler, or SIG_IGN when started in the
  # background by a shell without job control (`nohup cmd &`), which ignores SIGINT for it
  before = signal.getsignal(signal.SIGINT)
  with pytest.raises(SystemExit) as e:
    cli(["--config", str(path), "--out", str(out), "--quiet"])
  assert e.value.code == 130
  err = capsys.readouterr().err
  assert "stopping after the current question" in err and "Traceback" not in err
  records = [json.loads(line) for line in (out / RECORDS).read_text().splitlines()]
  assert len(records) == 1 and records[0]["method"] == "ar"  # finished, then stopped
  assert signal.getsignal(signal.SIGINT) is before  # handler restored
  monkeypatch.setattr(Decoder, "generate", real)
  run_eval(path, out)  # resumes the rest
  assert len((out / RECORDS).read_text().splitlines()) == 12


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_reaches_the_model_loading(suite, tmp_path, monkeypatch, quiet):
  """`--quiet` turns off the models' fetch and checksum bars too (before: a quiet run still
  drew the registry fetch's sha256 bars); without it they are on. The loading is stopped at
  the target: what is checked is the flag it was asked with."""
  from vocabjax.eval import runner

  class Stop(Exception):
    pass

  seen = []

  def load_model(name, **kw):
    seen.append((name, kw.get("progress")))
    raise Stop

  monkeypatch.setattr(runner, "load_model", load_model)
  path, cfg = suite
  args = ["--config", str(path), "--out", str(tmp_path / "o"), *(["--quiet"] if quiet else [])]
  with pytest.raises(Stop):
    main(parse_args(args))
  assert seen == [(cfg["target"], not quiet)]


def test_a_method_drafts_with_its_own_drafter(suite, tmp_path):
  """A method's own `draft:` (OmniDraft's drafter of another tokenizer) beside methods on the
  suite's drafter, in one run: each decodes plain decoding's tokens, the report names both
  drafters and the inputs hash the method's drafter (suites without one keep their fingerprint:
  test_config_validation's recorded suite)."""
  from vocabjax.testing.tiny import tiny_hf_model, tiny_tokenizer

  _, cfg = suite
  tok = tiny_tokenizer(340, corpus=["The lazy dog sleeps while the quick fox runs.",
                                    "def mul(a, b):\n    return a * b\n"] * 20)
  d = tmp_path / "other_drafter"
  tiny_hf_model("llama", seed=5, vocab_size=len(tok)).save_pretrained(d)
  tok.save_pretrained(d)
  mixed = {**cfg, "methods": [*cfg["methods"][:2],
                              {"name": "omni", "method": "crossvocab", "gamma": 3,
                               "draft": str(d)}]}
  out = tmp_path / "res"
  summary = run_eval(_write(tmp_path / "mixed.yaml", mixed), out)
  by = {m["name"]: m for m in summary["methods"]}
  assert by["omni"]["overall"]["match_rate"] == by["chain_g2"]["overall"]["match_rate"] == 1.0
  assert by["omni"]["overall"]["tau"] >= 1
  own = summary["models"]["own_drafts"][str(d)]
  assert own["methods"] == ["omni"] and own["vocab_size"] == len(tok)
  assert f"omni's draft: {d}" in (out / "summary.md").read_text()
  inputs = json.loads((out / "run.json").read_text())["inputs"]
  assert inputs["models"]["omni.draft"].startswith("dir-sha256:")
  # a suite whose every drafting method has its own drafter needs no suite drafter
  alone = {k: v for k, v in mixed.items() if k != "draft"}
  alone["methods"] = [cfg["methods"][0], mixed["methods"][2]]
  assert load_config(_write(tmp_path / "alone.yaml", alone)).methods[1].draft == str(d)
  for bad, message in (
      ({"name": "x", "method": "pld", "draft": str(d)}, "drafts without a drafter model"),
      ({"name": "x", "method": "chain", "draft": ""}, "draft must name a drafter"),
      ({"name": "x", "method": "chain"}, r"needs 'draft'.*\['x'\]")):
    with pytest.raises(ConfigError, match=message):
      load_config(_write(tmp_path / "bad.yaml", {**alone, "methods": [cfg["methods"][0], bad]}))


def _write(path, cfg):
  path.write_text(yaml.safe_dump(cfg))
  return path
