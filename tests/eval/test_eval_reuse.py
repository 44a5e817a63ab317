"""`python -m vocabjax.eval --reuse DIR`: a suite takes the records another result directory
already holds when nothing that changes them differs, and generates the rest."""

import dataclasses
import json

import pytest
import yaml

from vocabjax.eval import ConfigError, load_config
from vocabjax.eval.reuse import reusable
from vocabjax.eval.runner import RECORDS
from vocabjax.prompts import load_prompts

from tests.helpers.eval import QUESTIONS, run_eval


def _records(out):
  return [json.loads(line) for line in (out / RECORDS).read_text().splitlines()]


@pytest.mark.extended
def test_a_larger_suite_takes_a_smaller_ones_records(suite, tmp_path, capsys):  # noqa: F811
  """The smaller suite (1 question per group) is reused by the larger (2 per group, one method
  changed, one added): the shared (method, question) records are copied, not regenerated (same
  wall time, marked with their source), the changed method and the new question run here, and
  the report counts what came from where."""
  path, cfg = suite
  small_cfg = {**cfg, "name": "small",
               "datasets": [{**cfg["datasets"][0], "per_group": 1}]}
  small_path = tmp_path / "small.yaml"
  small_path.write_text(yaml.safe_dump(small_cfg))
  small = tmp_path / "small"
  run_eval(small_path, small)
  source = {(r["method"], r["qid"]): r for r in _records(small)}
  assert len(source) == 3 * 3  # one question per group (multi-turn, translation, qa)

  tree = {**cfg["methods"][2], "total_tokens": 2}  # same name, other parameters
  big_cfg = {**cfg, "name": "big", "methods": [*cfg["methods"][:2], tree,
                                               {"name": "chain_g1", "method": "chain",
                                                "gamma": 1}]}
  big_path = tmp_path / "big.yaml"
  big_path.write_text(yaml.safe_dump(big_cfg))
  big = tmp_path / "big"
  capsys.readouterr()
  summary = run_eval(big_path, big, "--reuse", str(small))
  err = capsys.readouterr().err
  assert "not reused: tree: other method or parameters" in err
  assert "6 records taken" in err

  recs = _records(big)
  assert len(recs) == 4 * 4  # every (method, question) once
  taken = [r for r in recs if r.get("reused_from")]
  assert {(r["method"], r["qid"]) for r in taken} == {
      k for k in source if k[0] in ("ar", "chain_g2")}
  for r in taken:  # copied: a regenerated record would have its own timings
    s = source[(r["method"], r["qid"])]
    assert r["reused_from"] == str(small)
    assert r["wall_s"] == s["wall_s"] and r["output_ids"] == s["output_ids"]
  assert not any(r.get("reused_from") for r in recs if r["method"] in ("tree", "chain_g1")
                 or r["qid"] not in {q for _, q in source})
  splits = json.loads((big / "splits.json").read_text())
  assert splits["chain_g2"] == json.loads((small / "splits.json").read_text())["chain_g2"]
  assert summary["environment"]["reused_from"] == {str(small): 6}
  assert "6 from " in (big / "summary.md").read_text()
  by = {m["name"]: m["overall"] for m in summary["methods"]}
  assert by["chain_g2"]["questions"] == 4 and by["chain_g2"]["match_rate"] == 1.0
  assert by["tree"]["match_rate"] == 1.0 and by["chain_g1"]["match_rate"] == 1.0

  before = (big / RECORDS).read_text()
  run_eval(big_path, big, "--reuse", str(small))  # a rerun: resumed, nothing taken twice
  assert (big / RECORDS).read_text() == before


def _fake_source(tmp_path, cfg, inputs, records):
  """A result directory as vocabjax.eval leaves it (run.json, records), without models."""
  src = tmp_path / "src"
  src.mkdir()
  (src / "run.json").write_text(json.dumps({"fingerprint": cfg.fingerprint(),
                                            "config": cfg.as_dict(), "inputs": inputs}))
  (src / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))
  return src


def _inputs(cfg, prompts, **change):
  from vocabjax.eval.provenance import questions_hash

  q = questions_hash(prompts)
  base = {"models": {"target": "sha256:t", "draft": "sha256:d"},
          "files": {"fr.counts": "sha256:c1"}, "questions": q, "vocabjax": "0.1.0",
          "machine": {"host": "h", "cpu": "c", "cpus": 2}}
  return {**base, **change}


@pytest.fixture
def small_config(tmp_path):
  bench = tmp_path / "bench.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  cfg = {"name": "s", "target": "t", "draft": "d",
         "datasets": [{"kind": "spec_bench", "path": str(bench), "per_group": 1}],
         "max_new_tokens": 10, "methods": [{"name": "ar", "method": "ar"},
                                           {"name": "chain", "method": "chain", "gamma": 2}]}
  path = tmp_path / "s.yaml"
  path.write_text(yaml.safe_dump(cfg))
  return load_config(path), bench


def _recs(cfg, prompts, seeds=(0,)):
  return [{"framework": "vocabjax", "method": m.name, "qid": p.qid, "seed": s, "wall_s": 1.0}
          for p in prompts for m in cfg.methods for s in seeds]


def test_what_is_checked_before_a_record_is_taken(small_config, tmp_path):
  cfg, bench = small_config
  prompts = load_prompts(cfg.datasets)
  inputs = _inputs(cfg, prompts)
  src = _fake_source(tmp_path, cfg, inputs, _recs(cfg, prompts))
  assert len(reusable(src, cfg, inputs, prompts, set()).records) == 6
  done = {("vocabjax", "ar", prompts[0].qid, 0)}
  assert len(reusable(src, cfg, inputs, prompts, done).records) == 5  # made here already

  # another seed list here: only the seeds both have
  seeded = dataclasses.replace(cfg, seeds=(1,))
  assert reusable(src, seeded, inputs, prompts, set()).records == []

  # a question whose text differs here is left out (and said); the others are taken
  edited = [dataclasses.replace(p, text="other") if i == 0 else p
            for i, p in enumerate(prompts)]
  found = reusable(src, cfg, inputs, edited, set())
  assert {r["qid"] for r in found.records} == {p.qid for p in prompts[1:]}
  assert found.skipped == [f"question {prompts[0].qid}: other text"]

  # a method whose file changed content, or whose parameters differ, runs here
  with_file = dataclasses.replace(cfg, methods=(
      cfg.methods[0], dataclasses.replace(cfg.methods[1], name="fr")))
  src_fr = tmp_path / "fr"
  src_fr.mkdir()
  (src_fr / "run.json").write_text(json.dumps({"config": with_file.as_dict(),
                                               "inputs": inputs}))
  (src_fr / RECORDS).write_text("".join(json.dumps(r) + "\n"
                                        for r in _recs(with_file, prompts)))
  changed = _inputs(cfg, prompts, files={"fr.counts": "sha256:c2"})
  found = reusable(src_fr, with_file, changed, prompts, set())
  assert {r["method"] for r in found.records} == {"ar"}
  assert found.skipped == ["fr: fr.counts changed content"]
  other = dataclasses.replace(cfg, methods=(
      cfg.methods[0], dataclasses.replace(cfg.methods[1], params=(("gamma", 3),))))
  found = reusable(src, other, inputs, prompts, set())
  assert {r["method"] for r in found.records} == {"ar"}
  assert found.skipped[0].startswith("chain: other method or parameters")

  # a torn last line (a run still writing) is left out; the file is not touched
  text = (src / RECORDS).read_text()
  (src / RECORDS).write_text(text + '{"framework": "vocab')
  assert len(reusable(src, cfg, inputs, prompts, set()).records) == 6
  assert (src / RECORDS).read_text().endswith('{"framework": "vocab')


@pytest.mark.parametrize("change, message", [
    ({"max_new_tokens": 20}, "other decoding settings: max_new_tokens 10 there, 20 here"),
    ({"temperature": 1.0}, "temperature 0.0 there, 1.0 here"),
])
def test_other_settings_are_refused(small_config, tmp_path, change, message):
  cfg, _ = small_config
  prompts = load_prompts(cfg.datasets)
  inputs = _inputs(cfg, prompts)
  src = _fake_source(tmp_path, cfg, inputs, _recs(cfg, prompts))
  with pytest.raises(ConfigError, match=message):
    reusable(src, dataclasses.replace(cfg, **change), inputs, prompts, set())


@pytest.mark.parametrize("key, value, message", [
    ("machine", {"host": "elsewhere", "cpu": "c", "cpus": 2}, "the machine differs"),
    ("models", {"target": "sha256:other", "draft": "sha256:d"}, "the models' content differs"),
    ("vocabjax", "0.2.0", "the vocabjax version differs"),
])
def test_another_machine_model_or_version_is_refused(small_config, tmp_path, key, value,
                                                     message):
  cfg, _ = small_config
  prompts = load_prompts(cfg.datasets)
  inputs = _inputs(cfg, prompts)
  src = _fake_source(tmp_path, cfg, inputs, _recs(cfg, prompts))
  with pytest.raises(ConfigError, match=message):
    reusable(src, cfg, {**inputs, key: value}, prompts, set())


def test_a_source_that_cannot_be_checked_is_refused(small_config, tmp_path):
  cfg, bench = small_config
  prompts = load_prompts(cfg.datasets)
  inputs = _inputs(cfg, prompts)
  with pytest.raises(ConfigError, match="no run.json there"):
    reusable(tmp_path / "nowhere", cfg, inputs, prompts, set())
  src = _fake_source(tmp_path, cfg, inputs, _recs(cfg, prompts))
  (src / "run.json").write_text("{")
  with pytest.raises(ConfigError, match="run.json is unreadable"):
    reusable(src, cfg, inputs, prompts, set())
  (src / "run.json").write_text(json.dumps({"config": cfg.as_dict(), "inputs": None}))
  with pytest.raises(ConfigError, match="records no inputs"):
    reusable(src, cfg, inputs, prompts, set())
  # the source's question file edited after it ran: its records cannot be matched
  (src / "run.json").write_text(json.dumps({"config": cfg.as_dict(), "inputs": inputs}))
  rows = [dict(q) for q in QUESTIONS]
  rows[0]["turns"] = ["Write a limerick."]
  bench.write_text("".join(json.dumps(q) + "\n" for q in rows))
  with pytest.raises(ConfigError, match="questions' files changed since it ran"):
    reusable(src, cfg, inputs, load_prompts(cfg.datasets), set())
  # a corrupt line before the last
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  (src / RECORDS).write_text("nonsense\n" + (src / RECORDS).read_text())
  with pytest.raises(ConfigError, match=r"questions.jsonl:1 is corrupt"):
    reusable(src, cfg, inputs, prompts, set())


def test_the_cli_refuses_a_bad_source_before_claiming_the_output(suite, tmp_path):  # noqa: F811
  path, _ = suite
  out = tmp_path / "res"
  with pytest.raises(ConfigError, match="no run.json there"):
    run_eval(path, out, "--reuse", str(tmp_path / "nowhere"))
  assert not out.exists()
  with pytest.raises(ConfigError, match="this run's own --out"):
    run_eval(path, out, "--reuse", str(out))


def test_a_flipped_bit_with_size_and_mtime_restored_changes_the_content_id(tmp_path,
                                                                           monkeypatch):
  """The content id of a local file is reused only under a stamp that any write moves (ctime,
  inode): flipping one bit of a model's weights and setting its mtime back (size unchanged) is
  a new id, so a suite's records are not resumed as if the model were the same (before: the
  cache keyed by path, size and mtime gave the old hash)."""
  import os

  from vocabjax.eval import provenance

  monkeypatch.setenv("VOCABJAX_CACHE", str(tmp_path / "cache"))
  f = tmp_path / "model.safetensors"
  f.write_bytes(bytes(range(256)) * 64)
  before = provenance.content_id(str(f))
  st = f.stat()
  data = bytearray(f.read_bytes())
  data[1000] ^= 1
  f.write_bytes(bytes(data))
  os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as they were
  assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
  after = provenance.content_id(str(f))
  assert after != before
  assert provenance.content_id(str(f)) == after  # then remembered: one stat per run
