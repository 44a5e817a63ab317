"""SPEED-Bench as a suite kind: a parquet laid out in the hub dataset's schema (question_id,
category, sub_category, turns, source, src_id, difficulty, multiturn), its filters, multi-turn
rows asked turn by turn, the per-category acceptance matrix in the report, bad rows named, and
the hub's copy loaded through `datasets` or refused in one line when offline and not cached."""

import json

import pytest
import yaml

from tests.helpers.eval import run_eval
from vocabjax.errors import ConfigError
from vocabjax.prompts import DatasetSpec, load_prompts, load_speed_bench, parse_datasets

ROWS = [
    {"question_id": "q1", "category": "coding", "sub_category": "python",
     "turns": ["def add(a, b):"], "multiturn": False},
    {"question_id": "q2", "category": "coding", "sub_category": "sql",
     "turns": ["SELECT name FROM"], "multiturn": False},
    {"question_id": "q3", "category": "writing", "sub_category": "poem",
     "turns": ["Write a haiku.", "Now a shorter one."], "multiturn": True},
    {"question_id": "q4", "category": "qa", "sub_category": "trivia",
     "turns": ["Who are you?"], "multiturn": False},
]


def _parquet(path, rows=ROWS):
  import pyarrow as pa
  import pyarrow.parquet as pq

  full = [{"source": "test", "src_id": r["question_id"], "difficulty": "easy", **r} for r in rows]
  pq.write_table(pa.Table.from_pylist(full), path)
  return path


def test_rows_become_prompts_with_their_turns_and_filters(tmp_path):
  p = _parquet(tmp_path / "test-00000-of-00001.parquet")
  prompts = load_speed_bench(DatasetSpec("speed_bench", path=str(p)))
  assert [q.qid for q in prompts] == [f"speed_bench/qualitative/q{i}" for i in (1, 2, 3, 4)]
  assert [q.group for q in prompts] == ["coding", "coding", "writing", "qa"]
  assert prompts[1].category == "sql" and prompts[2].followups == ("Now a shorter one.",)
  assert prompts[0].text == "def add(a, b):" and prompts[0].source == str(p)
  one = load_speed_bench(DatasetSpec("speed_bench", path=str(p), per_group=1))
  assert [q.qid.rsplit("/", 1)[1] for q in one] == ["q1", "q3", "q4"]
  sub = load_speed_bench(DatasetSpec("speed_bench", path=str(p), categories=("sql", "qa")))
  assert [q.qid.rsplit("/", 1)[1] for q in sub] == ["q2", "q4"]
  # a snapshot directory with several configurations: the named one's files
  snap = tmp_path / "snap"
  (snap / "qualitative").mkdir(parents=True)
  (snap / "throughput_1k").mkdir()
  _parquet(snap / "qualitative" / "test.parquet")
  _parquet(snap / "throughput_1k" / "test.parquet", ROWS[:1])
  specs = parse_datasets([{"kind": "speed_bench", "path": str(snap), "config": "throughput_1k"},
                          {"kind": "speed_bench", "path": str(snap)}], "suite")
  got = load_prompts(specs)
  assert [q.qid for q in got][:2] == ["speed_bench/throughput_1k/q1", "speed_bench/qualitative/q1"]
  assert len(got) == 5


@pytest.mark.parametrize("rows,message", [
    ([{"question_id": "a", "category": "qa", "turns": []}], r"row 0: not a SPEED-Bench row.*"
     r"turns must be a non-empty list"),
    ([{"question_id": "a", "category": "qa", "turns": ["x"]},
      {"question_id": "b", "turns": ["y"]}], r"row 1: not a SPEED-Bench row .*category must be "
     r"a non-empty string, got None"),
])
def test_bad_rows_are_named(tmp_path, rows, message):
  import pyarrow as pa
  import pyarrow.parquet as pq

  p = tmp_path / "bad.parquet"
  pq.write_table(pa.Table.from_pylist(rows), p)
  with pytest.raises(ConfigError, match=message):
    load_speed_bench(DatasetSpec("speed_bench", path=str(p)))


def test_bad_settings_are_refused_in_one_line(tmp_path):
  p = _parquet(tmp_path / "t.parquet")
  with pytest.raises(ConfigError, match=r"unknown SPEED-Bench config 'throughput_4k'; known"):
    parse_datasets([{"kind": "speed_bench", "config": "throughput_4k"}], "suite")
  with pytest.raises(ConfigError, match=r"'config' names a SPEED-Bench configuration; the "
                                        r"spec_bench kind takes none"):
    parse_datasets([{"kind": "spec_bench", "config": "qualitative"}], "suite")
  with pytest.raises(ConfigError, match=r"unknown categories \['maths'\] for SPEED-Bench"):
    load_speed_bench(DatasetSpec("speed_bench", path=str(p), categories=("maths",)))
  (tmp_path / "cut.parquet").write_bytes(p.read_bytes()[:100])
  with pytest.raises(ConfigError, match=r"cut.parquet: not a readable parquet file"):
    load_speed_bench(DatasetSpec("speed_bench", path=str(tmp_path / "cut.parquet")))
  with pytest.raises(ConfigError, match=r"SPEED-Bench path not found: \./nowhere"):
    load_speed_bench(DatasetSpec("speed_bench", path="./nowhere"))


def test_the_hub_copy_offline_and_not_cached_is_one_line(tmp_path, monkeypatch):
  """No path: nvidia/SPEED-Bench through `datasets`; offline with an empty cache that is one
  line naming the dataset, its license and the remedies (nothing downloaded here)."""
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
  with pytest.raises(ConfigError) as e:
    load_speed_bench(DatasetSpec("speed_bench"))
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith("SPEED-Bench (nvidia/SPEED-Bench, config "
                                            "qualitative): cannot load it")
  assert "evaluation-dataset license" in msg and "HF_HUB_OFFLINE=1" in msg


@pytest.mark.extended
def test_the_report_has_the_per_category_acceptance_matrix(tmp_path, tiny_chat_dir):
  p = _parquet(tmp_path / "t.parquet")
  path = tmp_path / "s.yaml"
  path.write_text(yaml.safe_dump({
      "name": "speed", "target": str(tiny_chat_dir), "draft": str(tiny_chat_dir),
      "datasets": [{"kind": "speed_bench", "path": str(p)}],
      "max_new_tokens": 6, "max_len": 160,
      "methods": [{"name": "ar", "method": "ar"},
                  {"name": "chain_g2", "method": "chain", "gamma": 2},
                  {"name": "pld", "method": "pld", "gamma": 2}]}))
  summary = run_eval(path, tmp_path / "res", "--reference", "none")
  by = {m["name"]: m for m in summary["methods"]}
  cats = by["chain_g2"]["by_speed_bench_category"]
  assert sorted(cats) == ["coding", "qa", "writing"]
  assert cats["coding"]["questions"] == 2 and cats["writing"]["questions"] == 2  # two turns
  assert cats["coding"]["tau"] == pytest.approx(3.0)  # the drafter is the target: all accepted
  md = (tmp_path / "res" / "summary.md").read_text()
  head = "| category | answers | chain_g2 | pld |"
  assert head in md
  rows = md.split(head)[1].strip().splitlines()[1:4]
  assert [r.split("|")[1].strip() for r in rows] == ["coding", "qa", "writing"]
  assert rows[0].split("|")[3].strip() == f"{cats['coding']['tau']:.2f}"
  recs = [json.loads(x) for x in (tmp_path / "res" / "questions.jsonl").read_text().splitlines()]
  assert {r["group"] for r in recs} >= {"writing/turn1", "writing/turn2"}
