"""Eval suites are validated by type and range before anything loads: every bad value is one
ConfigError naming the field and the value (the CLI prints it as one `error:` line, exit 2),
and what YAML reads as a string is never taken for a boolean or a list."""

import subprocess
import sys

import pytest
import yaml

from vocabjax.eval.config import ConfigError, config_from_dict

BASE = {"target": "t", "draft": "d", "datasets": [{"kind": "spec_bench", "per_group": 1}],
        "methods": [{"method": "ar"}, {"name": "c", "method": "chain", "gamma": 2}]}


def test_a_valid_suite_and_real_booleans():
  cfg = config_from_dict(dict(BASE, chat=False, time_split=False, seeds=[0, 1, 2 ** 32 - 1]))
  assert cfg.chat is False and cfg.time_split is False and cfg.seeds == (0, 1, 2 ** 32 - 1)


def test_chat_template_variables_and_the_fingerprints_of_suites_without_them():
  """`chat_template_kwargs` reaches the config sorted; a suite without it keeps the fingerprint
  it had before the field existed (the recorded default run's, so its directory resumes), one
  with it gets another."""
  import json
  from pathlib import Path

  from vocabjax.eval.config import load_config

  cfg = config_from_dict(dict(BASE, chat_template_kwargs={"enable_thinking": False, "a": 1}))
  assert cfg.chat_template_kwargs == (("a", 1), ("enable_thinking", False))
  recorded = json.loads((Path(__file__).parents[2] / "eval/results/default/run.json")
                        .read_text())["fingerprint"]
  import dataclasses

  # the recorded run's drafter was int8 (the suite's field then; now the file's own blocks)
  default = dataclasses.replace(load_config("default"), draft_dtype="int8")
  assert default.chat_template_kwargs == () and default.fingerprint() == recorded

  assert dataclasses.replace(default, chat_template_kwargs=(("enable_thinking", False),)
                             ).fingerprint() != recorded


@pytest.mark.parametrize("value,match", [
    ({"enable_thinking": [1]}, r"chat_template_kwargs must map variable names to scalars"),
    ("enable_thinking=false", r"chat_template_kwargs must map .*got 'enable_thinking=false'"),
])
def test_bad_chat_template_variables_are_refused(value, match):
  with pytest.raises(ConfigError, match=match):
    config_from_dict(dict(BASE, chat_template_kwargs=value))
  with pytest.raises(ConfigError, match=r"chat_template_kwargs \['x'\] with chat: false"):
    config_from_dict(dict(BASE, chat=False, chat_template_kwargs={"x": 1}))


@pytest.mark.parametrize("field,value,match", [
    ("chat", "false", r"chat must be true or false \(unquoted\), got 'false'"),
    ("time_split", "false", r"time_split must be true or false .*'false'"),
    ("chat", 0, r"chat must be true or false .*got 0"),
    ("top_k", -1, r"top_k must be an integer >= 0 .*got -1"),
    ("top_k", 2.5, r"top_k must be an integer .*got 2.5"),
    ("temperature", float("nan"), r"temperature must be a finite number, got nan"),
    ("temperature", "hot", r"temperature must be a finite number, got 'hot'"),
    ("temperature", -0.5, r"temperature must be >= 0, got -0.5"),
    ("top_p", 0, r"top_p must be in \(0, 1\], got 0"),
    ("top_p", 1.5, r"top_p must be in \(0, 1\], got 1.5"),
    ("dtype", "float64", r"dtype must be one of .*got 'float64'"),
    ("draft_dtype", "fp8", r"draft_dtype must be one of .*got 'fp8'"),
    ("seeds", [0, 0], r"seeds repeat \(\[0, 0\]\)"),
    ("seeds", [2 ** 32], r"seeds must lie in \[0, 2\*\*32\), got \[4294967296\]"),
    ("seeds", [2 ** 70], r"seeds must lie in \[0, 2\*\*32\)"),
    ("seeds", [-1], r"seeds must lie in \[0, 2\*\*32\)"),
    ("seeds", "0", r"seeds must be a non-empty list of integers, got '0'"),
    ("seeds", [True], r"seeds must be a non-empty list of integers"),
    ("target", 3, r"target must be a string, got 3"),
    ("datasets", [{"kind": "spec_bench", "categories": "qa"}],
     r"categories must be a list of names, got 'qa'"),
])
def test_bad_values_name_the_field_and_value(field, value, match):
  with pytest.raises(ConfigError, match=match):
    config_from_dict(dict(BASE, **{field: value}), name="s")


def test_every_weight_dtype_a_suite_takes_is_one_load_model_takes():
  """A suite asks `load_model` for its weights: each name it accepts parses there (the
  quantized ones, int4 and a GGUF file's own blocks, included), and the record names it back."""
  from vocabjax.checkpoints.loader import dtype_name, parse_dtype
  from vocabjax.eval.config import WEIGHT_DTYPES

  assert {"int4", "gguf"} <= set(WEIGHT_DTYPES)
  for name in WEIGHT_DTYPES:
    cfg = config_from_dict(dict(BASE, dtype=name, draft_dtype=name), name="s")
    assert cfg.dtype == cfg.draft_dtype == name
    assert dtype_name(parse_dtype(name)) == name


def test_quoted_boolean_from_yaml_is_refused_by_the_cli_before_anything_loads(tmp_path):
  suite = tmp_path / "s.yaml"
  suite.write_text(yaml.safe_dump(dict(BASE, target=str(tmp_path / "no-model"), chat="false")))
  out = tmp_path / "out"
  proc = subprocess.run([sys.executable, "-m", "vocabjax.eval", "--config", str(suite), "--out",
                         str(out)], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr
  lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
  assert lines[-1].startswith("error: config s: chat must be true or false")
  assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize("row,match", [
    ({"question_id": 1, "category": "qa", "turns": "What is 2+2?"},
     r"turns must be a non-empty list of strings, got 'What is 2\+2\?'"),
    ({"question_id": 1, "category": "qa", "turns": []}, "turns must be a non-empty list"),
    ({"question_id": 1, "category": ["qa"], "turns": ["x"]}, "category must be a string"),
])
def test_a_spec_bench_row_of_the_wrong_shape_is_refused(tmp_path, row, match):
  import json

  from vocabjax.prompts import DatasetSpec, load_spec_bench

  path = tmp_path / "sb.jsonl"
  path.write_text(json.dumps(row) + "\n")
  with pytest.raises(ConfigError, match=r"sb.jsonl:1: not a Spec-Bench row .*" + match):
    load_spec_bench(DatasetSpec(kind="spec_bench", path=str(path)))


def test_records_without_their_run_json_are_not_resumed(tmp_path):
  """questions.jsonl with run.json deleted: its records' configuration and inputs are unknown,
  so they are refused (or moved aside with --overwrite), never resumed into a table."""
  from vocabjax.eval.runner import ResultDirError, prepare_dir

  cfg = config_from_dict(dict(BASE), name="s")
  out = tmp_path / "r"
  out.mkdir()
  (out / "questions.jsonl").write_text('{"method": "ar", "qid": "1"}\n')
  with pytest.raises(ResultDirError, match="questions.jsonl without its run.json"):
    prepare_dir(out, cfg, overwrite=False)
  prepare_dir(out, cfg, overwrite=True)
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith("r.replaced-")]
  assert (out / "run.json").exists() and not (out / "questions.jsonl").exists()


def test_data_that_is_not_utf8_names_the_file_line_and_byte(tmp_path):
  """A Spec-Bench file, a training data file and a JSON-lines record file with a byte that is
  not UTF-8: each error names the file, the line, the column and the byte (the codec's own
  message named none of them)."""
  import json

  from vocabjax.io import read_jsonl
  from vocabjax.prompts import DatasetSpec, load_spec_bench
  from vocabjax.train.features import read_records
  from vocabjax.train.loop import TrainError

  good = json.dumps({"question_id": 1, "category": "qa", "turns": ["x"]}).encode()
  path = tmp_path / "sb.jsonl"
  path.write_bytes(good + b"\n" + b'{"question_id": 2, "category": "qa", "turns": ["caf\xe9"]}\n')
  with pytest.raises(ConfigError, match=r"sb.jsonl:2: not UTF-8 text \(byte 0xe9 at column 52"):
    load_spec_bench(DatasetSpec(kind="spec_bench", path=str(path)))
  with pytest.raises(TrainError, match=r"sb.jsonl:2: not UTF-8 text \(byte 0xe9"):
    read_records([path])
  with pytest.raises(ValueError, match=r"sb.jsonl:2: not UTF-8 text"):
    read_jsonl(path)
