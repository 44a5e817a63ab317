"""`vocabtrim` and `frspec` in the eval suite: greedy identity, MBSU over the trimmed head,
counts of the wrong kind or size refused before anything runs."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from vocabjax.eval import ConfigError, load_config
from vocabjax.eval.__main__ import main, parse_args

from tests.helpers.eval import QUESTIONS


def _suite(tmp_path, tiny_chat_dir, methods):
  bench = tmp_path / "bench.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  cfg = {"name": "vocab", "target": str(tiny_chat_dir), "draft": str(tiny_chat_dir),
         "datasets": [{"kind": "spec_bench", "path": str(bench), "per_group": 2}],
         "max_new_tokens": 10, "max_len": 128,
         "methods": [{"name": "ar", "method": "ar"}, *methods]}
  path = tmp_path / "vocab.yaml"
  path.write_text(yaml.safe_dump(cfg))
  return path


@pytest.mark.extended  # their decoding's identity: tests/vocab, tests/decoding
def test_vocabtrim_and_frspec_are_lossless_with_trimmed_mbsu(counts, tmp_path, tiny_chat_dir):
  text, gen = counts
  path = _suite(tmp_path, tiny_chat_dir, [
      {"name": "chain_g2", "method": "chain", "gamma": 2},
      {"name": "vt_k48", "method": "vocabtrim", "counts": str(gen), "k": 48, "gamma": 2},
      {"name": "fr_k48", "method": "frspec", "counts": str(text), "k": 48, "gamma": 2},
      {"name": "fr_tree", "method": "frspec", "counts": str(text), "k": 48, "top_k": 2,
       "depth": 2, "total_tokens": 3}])
  out = tmp_path / "res"
  summary = main(parse_args(["--config", str(path), "--out", str(out), "--quiet"]))
  by = {m["name"]: m for m in summary["methods"]}
  for name in ("vt_k48", "fr_k48", "fr_tree"):
    o = by[name]["overall"]
    assert o["match_rate"] == 1.0  # trimmed drafting (chain and tree), identical greedy output
    assert by[name]["draft_vocab_size"] == 48
    assert 1 <= o["tau"] <= 3
    if name == "fr_tree":
      continue
    # c counts 48 head rows instead of V = 320: a smaller c than the full drafter's
    full = by["chain_g2"]["overall"]
    assert o["mbsu"] / o["tau"] > full["mbsu"] / full["tau"]
  assert by["chain_g2"]["overall"]["acceptance_rate"] == 1.0  # drafter == target...
  assert by["fr_k48"]["overall"]["acceptance_rate"] < 1.0  # ...but not with 48 of 320 tokens
  assert (text.parent / "subset-k48.npz").exists() and (gen.parent / "subset-k48.npz").exists()
  assert "vt_k48" in (out / "summary.md").read_text()
  # two vocabulary sizes (48 and 320 rows): tau against the vocabulary is drawn
  assert (out / "tau_vs_vocab.png").stat().st_size > 0
  assert "tau_vs_vocab.png is not drawn" not in (out / "summary.md").read_text()

  # the counts gone (a result directory copied elsewhere): --report-only needs nothing of
  # them (a static subset's MBSU counts its k rows) and writes the same figures
  aside = text.parent.with_name("text_aside")
  text.parent.rename(aside)
  try:
    with pytest.raises(ConfigError, match="counts"):  # a run needs them, as before
      main(parse_args(["--config", str(path), "--out", str(out), "--quiet"]))
    again = main(parse_args(["--config", str(path), "--out", str(out), "--report-only"]))
  finally:
    aside.rename(text.parent)
  assert "mbsu_unavailable" not in again
  for m in again["methods"]:
    for key in ("tau", "mbsu", "match_rate", "tokens_per_s"):
      assert m["overall"][key] == by[m["name"]]["overall"][key], (m["name"], key)


def test_wrong_counts_are_refused_at_load(counts, tmp_path, tiny_chat_dir):
  text, gen = counts
  cases = [({"method": "vocabtrim", "counts": str(text), "k": 8}, "vocabtrim uses counts of "
            "generated data"),
           ({"method": "frspec", "counts": str(gen), "k": 8}, "frspec uses counts of text"),
           ({"method": "frspec", "counts": str(text), "k": 321}, "k=321 exceeds the vocabulary"),
           ({"method": "frspec", "counts": str(text), "k": 0}, "needs k >= 1"),
           ({"method": "frspec", "counts": str(text), "k": 2, "top_k": 3, "depth": 2,
             "total_tokens": 3}, "top_k=3 exceeds k=2"),
           ({"method": "frspec", "counts": str(tmp_path / "none.npz"), "k": 8},
            "no counts file")]
  for i, (m, match) in enumerate(cases):
    path = _suite(tmp_path, tiny_chat_dir, [{"name": f"m{i}", **m}])
    with pytest.raises(ConfigError, match=match):
      load_config(path)


def test_map_count_warning(tmp_path, capsys):
  from vocabjax.eval.runner import _check_map_count

  (tmp_path / "limit").write_text("65530\n")
  _check_map_count(9, str(tmp_path / "limit"))
  assert "vm.max_map_count=65530" in capsys.readouterr().err
  _check_map_count(3, str(tmp_path / "limit"))
  (tmp_path / "big").write_text("262144\n")
  _check_map_count(9, str(tmp_path / "big"))
  assert capsys.readouterr().err == ""


@pytest.mark.extended
def test_specvocab_is_lossless_with_ranker_cost_in_mbsu(ranker_file, tmp_path, tiny_chat_dir):
  import shutil

  ranker_file = Path(shutil.copy(ranker_file, tmp_path / "ranker.safetensors"))  # removed below
  path = _suite(tmp_path, tiny_chat_dir, [
      {"name": "chain_g2", "method": "chain", "gamma": 2},
      {"name": "sv_k32", "method": "specvocab", "ranker": str(ranker_file), "k": 32,
       "gamma": 2},
      {"name": "sv_tree", "method": "specvocab", "ranker": str(ranker_file), "k": 32,
       "top_k": 2, "depth": 2, "total_tokens": 3}])
  summary = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"), "--quiet"]))
  by = {m["name"]: m for m in summary["methods"]}
  V, R, D = 320, 8, 64
  for name in ("sv_k32", "sv_tree"):
    assert by[name]["overall"]["match_rate"] == 1.0
    assert by[name]["draft_vocab_size"] == 32 + -(-(V * R + R * D) // D)  # k + ranker rows
  full, sv = by["chain_g2"]["overall"], by["sv_k32"]["overall"]
  assert sv["mbsu"] / sv["tau"] > full["mbsu"] / full["tau"]  # cheaper head than V rows

  # the ranker gone: --report-only writes the tables from the records, without the MBSU and
  # head rows that need the ranker's shapes, and says so
  ranker_file.unlink()
  again = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"),
                           "--report-only"]))
  assert set(again["mbsu_unavailable"]) == {"sv_k32", "sv_tree"}
  assert "ranker" in again["mbsu_unavailable"]["sv_k32"]
  re_by = {m["name"]: m for m in again["methods"]}
  for name in ("sv_k32", "sv_tree"):
    assert re_by[name]["overall"]["mbsu"] is None and re_by[name]["draft_vocab_size"] is None
    assert re_by[name]["overall"]["tau"] == by[name]["overall"]["tau"]
    assert re_by[name]["overall"]["match_rate"] == 1.0
  assert re_by["chain_g2"]["overall"]["mbsu"] == full["mbsu"]
  md = (tmp_path / "res" / "summary.md").read_text()
  assert "MBSU and head rows not computed for sv_k32, sv_tree" in md


def test_bad_specvocab_configs_are_refused(ranker_file, tmp_path, tiny_chat_dir):
  junk = tmp_path / "junk.safetensors"
  junk.write_bytes(b"not a safetensors file")
  cases = [({"ranker": str(ranker_file), "k": 321}, "k=321 exceeds the ranker's vocabulary"),
           ({"ranker": str(ranker_file), "k": 0}, "needs k >= 1"),
           ({"ranker": str(tmp_path / "none.safetensors"), "k": 8}, "not a readable ranker"),
           ({"ranker": str(junk), "k": 8}, "not a readable ranker"),
           ({"ranker": str(ranker_file), "k": 2, "top_k": 3, "depth": 2, "total_tokens": 3},
            "top_k=3 exceeds k=2")]
  for i, (m, match) in enumerate(cases):
    path = _suite(tmp_path, tiny_chat_dir, [{"name": f"m{i}", "method": "specvocab", **m}])
    with pytest.raises(ConfigError, match=match):
      load_config(path)


def test_specvocab_ranker_of_another_drafter_fails_before_generation(tmp_path, tiny_chat_dir,
                                                                     tiny_dirs):
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.vocab.ranked import RankerError, svd_ranker

  other = load_model(tiny_dirs["qwen2_bias"], dtype="float32")  # same shapes, other weights
  r = svd_ranker(other.params, other.config, rank=8).save(tmp_path / "other.safetensors")
  path = _suite(tmp_path, tiny_chat_dir, [{"name": "sv", "method": "specvocab",
                                           "ranker": str(r), "k": 8}])
  from vocabjax.eval import ConfigError

  with pytest.raises(ConfigError, match="method 'sv' \\(specvocab\\) cannot be built .*trained "
                                        "for a drafter with vocab_size=128") as e:
    main(parse_args(["--config", str(path), "--out", str(tmp_path / "o"), "--quiet"]))
  assert isinstance(e.value.__cause__, RankerError)
  assert not (tmp_path / "o").exists()  # not even claimed


@pytest.mark.extended
def test_eagle_is_lossless_with_the_heads_cost_in_mbsu(head_dir, tmp_path, tiny_chat_dir):
  from vocabjax.checkpoints.eagle3 import load_eagle3_config

  path = _suite(tmp_path, tiny_chat_dir, [
      {"name": "tree", "method": "tree", "top_k": 2, "depth": 2, "total_tokens": 3},
      {"name": "eagle", "method": "eagle", "head": str(head_dir), "top_k": 2, "depth": 2,
       "total_tokens": 3},
      {"name": "eagle_target_head", "method": "eagle", "head": str(head_dir), "top_k": 2,
       "depth": 2, "total_tokens": 3, "lm_head": "target"}])
  summary = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"), "--quiet"]))
  by = {m["name"]: m for m in summary["methods"]}
  hc = load_eagle3_config(head_dir)
  for name, rows in (("eagle", 48), ("eagle_target_head", 320)):
    o = by[name]["overall"]
    assert o["match_rate"] == 1.0
    assert by[name]["draft_vocab_size"] == rows
    c = hc.num_params(rows) / summary["models"]["target"]["params_per_token"]
    assert o["mbsu"] == pytest.approx(o["tau"] / (c * 2 + 1))
    assert o["time_split"]["drafter_s"] > 0 and o["time_split"]["drafter_head_s"] > 0


@pytest.mark.extended
def test_eagle_with_prompt_lookup_is_lossless_and_records_its_lookups(head_dir, tmp_path,
                                                                      tiny_chat_dir):
  import json

  path = _suite(tmp_path, tiny_chat_dir, [
      {"name": "eagle_pld", "method": "eagle_pld", "head": str(head_dir), "top_k": 2,
       "depth": 2, "total_tokens": 3, "gamma": 3, "candidates": 2},
      {"name": "eagle_pld_gated", "method": "eagle_pld", "head": str(head_dir), "top_k": 2,
       "depth": 2, "total_tokens": 3, "gamma": 3, "min_confidence": 0.999}])
  summary = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"), "--quiet"]))
  by_name = {m["name"]: m for m in summary["methods"]}
  o = by_name["eagle_pld"]["overall"]
  assert o["match_rate"] == 1.0 and o["time_split"]["drafter_s"] > 0
  assert by_name["eagle_pld_gated"]["overall"]["match_rate"] == 1.0
  recs = [json.loads(x) for x in (tmp_path / "res" / "questions.jsonl").read_text().splitlines()]
  extra = [r["extra"] for r in recs if r["method"] == "eagle_pld"]
  assert extra and all(e["accepted_from_lookup"] <= e["accepted"] for e in extra)
  assert sum(e["lookup_nodes"] for e in extra) > 0
  assert all(e["head_steps"] == e["verifications"] for e in extra)  # ungated: every step
  # gated above any confidence of the random head: the lookup alone drafts
  gated = [r["extra"] for r in recs if r["method"] == "eagle_pld_gated"]
  assert gated and all(e["head_steps"] == 0 and e["accepted_from_lookup"] == e["accepted"]
                       for e in gated)
  for bad, match in (({"gamma": 0}, "pld needs 1 <= gamma <= 4096"),
                     ({"top_k": 64, "total_tokens": 64}, "exceeds the head's vocabulary")):
    p2 = _suite(tmp_path, tiny_chat_dir, [{"name": "e", "method": "eagle_pld",
                                           "head": str(head_dir), "top_k": 2, "depth": 2,
                                           "total_tokens": 3, **bad}])
    with pytest.raises(ConfigError, match=match):
      load_config(p2)


def test_bad_eagle_configs_are_refused(head_dir, tmp_path, tiny_chat_dir):
  from vocabjax.testing.tiny import save_tiny_variant

  base = {"method": "eagle", "head": str(head_dir), "top_k": 2, "depth": 2, "total_tokens": 3}
  cases = [({"head": str(tmp_path / "none")}, "not a readable EAGLE head"),
           ({"lm_head": "mine"}, "lm_head='mine' must be 'own' or 'target'"),
           ({"top_k": 64, "total_tokens": 64}, "top_k=64 exceeds the head's vocabulary of 48"),
           ({"total_tokens": 1}, "smaller than self.top_k=2"),
           ({"min_confidence": 1.0}, "eagle.min_confidence=1.0 must lie in")]
  for i, (m, match) in enumerate(cases):
    path = _suite(tmp_path, tiny_chat_dir, [{"name": f"m{i}", **base, **m}])
    with pytest.raises(ConfigError, match=match):
      load_config(path)
  # a head trained for another target of the same shapes: refused before any generation
  cfg = yaml.safe_load(_suite(tmp_path, tiny_chat_dir, [{"name": "e", **base}]).read_text())
  other = save_tiny_variant("qwen2_bias", tmp_path / "other_chat", seed=11,
                            with_tokenizer=True)  # the chat model's shapes, other weights
  cfg["target"] = cfg["draft"] = str(other)
  path = tmp_path / "other.yaml"
  path.write_text(yaml.safe_dump(cfg))
  with pytest.raises(ValueError, match="was trained for another target"):
    main(parse_args(["--config", str(path), "--out", str(tmp_path / "o"), "--quiet"]))
  assert not (tmp_path / "o" / "questions.jsonl").exists()


@pytest.mark.extended
def test_medusa_is_lossless_with_the_heads_rows_counted(tiny_medusa_dir, counts, tmp_path,
                                                       tiny_chat_dir):
  _, gen = counts
  path = _suite(tmp_path, tiny_chat_dir, [
      {"name": "medusa", "method": "medusa", "heads": str(tiny_medusa_dir)},
      {"name": "medusa_tree_vt48", "method": "medusa", "heads": str(tiny_medusa_dir),
       "choices": "[[0], [1], [0, 0], [1, 0]]", "counts": str(gen), "k": 48}])
  summary = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"), "--quiet"]))
  by = {m["name"]: m for m in summary["methods"]}
  for name, rows in (("medusa", 2 * 320), ("medusa_tree_vt48", 2 * 48)):
    assert by[name]["overall"]["match_rate"] == 1.0
    assert by[name]["draft_vocab_size"] == rows
  for bad, msg in [({"k": 48}, "medusa.k=48 needs counts"),
                   ({"choices": "[[0], [0, 0], [0, 0, 0]]"}, "3 deep but there are 2 heads"),
                   ({"counts": str(gen), "k": 0}, r"medusa.k=0 must be in \[1, V=320\]"),
                   ({"choices": "[[0], [1], [2]]", "counts": str(gen), "k": 2},
                    "k=2 is smaller than the tree's top_k=3")]:
    with pytest.raises(ConfigError, match=msg):
      load_config(_suite(tmp_path, tiny_chat_dir, [{"name": "m", "method": "medusa",
                                                    "heads": str(tiny_medusa_dir), **bad}]))


@pytest.mark.extended
def test_a_suite_on_a_mesh(head_dir, tmp_path, tiny_chat_dir):
  """`mesh:` (and --mesh): the suite's methods run sharded on 8 virtual devices with the
  unsharded greedy output (a drafter model, and a head read from its directory; every method on
  a mesh is tests/decoding/test_sharded_speculative.py's: prompt lookup here too cost ~6 s of a
  2-core run and went through the same `make(..., mesh)`); the fingerprint of a one-device
  suite is as before meshes existed."""
  path = _suite(tmp_path, tiny_chat_dir, [
      {"name": "chain_g2", "method": "chain", "gamma": 2},
      {"name": "eagle", "method": "eagle", "head": str(head_dir), "top_k": 2, "depth": 2,
       "total_tokens": 3}])
  main(parse_args(["--config", str(path), "--out", str(tmp_path / "one"), "--quiet"]))
  summary = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"), "--quiet",
                             "--mesh", "model=8"]))
  by = {m["name"]: m for m in summary["methods"]}
  assert all(by[m]["overall"]["match_rate"] == 1.0 for m in ("chain_g2", "eagle"))
  def ids(run):
    rows = [json.loads(x) for x in (tmp_path / run / "questions.jsonl").read_text().splitlines()]
    return {(r["method"], r["qid"]): r["output_ids"] for r in rows}

  assert ids("res") == ids("one")  # every method, every question, as on one device
  import hashlib

  cfg = load_config(path)
  d = dataclasses.asdict(cfg)
  assert d.pop("mesh") is None and d.pop("chat_template_kwargs") == ()
  assert d.pop("draft_in_set") is True  # (nor drafting outside the request's set)
  for ds in d["datasets"]:  # (nor SPEED-Bench's configurations)
    assert ds.pop("config") is None
  for m in d["methods"]:  # (nor a method's own drafter)
    assert m.pop("draft") is None
  blob = json.dumps(d, sort_keys=True, default=str).encode()
  assert cfg.fingerprint() == hashlib.sha256(blob).hexdigest()[:16]  # as before meshes
  assert cfg.fingerprint() != dataclasses.replace(cfg, mesh="model=8").fingerprint()
  with pytest.raises(ConfigError, match=r"one question at a time .* needs data=1 .* got data=2"):
    main(parse_args(["--config", str(path), "--out", str(tmp_path / "y"), "--mesh",
                     "data=2,model=4"]))
  with pytest.raises(ConfigError, match=r"mesh 'data=2,pipe=4': expected data=D,model=M"):
    main(parse_args(["--config", str(path), "--out", str(tmp_path / "x"), "--mesh",
                     "data=2,pipe=4"]))


@pytest.mark.extended
def test_eagle_with_suffix_decoding_and_suffix_alone_are_lossless_in_a_suite(head_dir, tmp_path,
                                                                            tiny_chat_dir):
  """SuffixDecoding (`suffix`) and its hybrid with an EAGLE head (`eagle_suffix`) as suite
  methods: greedy output equal to plain decoding's, their records' counts, a bad setting
  refused when the suite is read."""
  import json

  path = _suite(tmp_path, tiny_chat_dir, [
      {"name": "suffix", "method": "suffix", "max_spec_tokens": 4},
      {"name": "eagle_suffix", "method": "eagle_suffix", "head": str(head_dir), "top_k": 2,
       "depth": 2, "total_tokens": 3, "max_spec_tokens": 4, "score_threshold": 1.5}])
  summary = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"), "--quiet"]))
  by_name = {m["name"]: m for m in summary["methods"]}
  assert by_name["suffix"]["overall"]["match_rate"] == 1.0
  assert by_name["eagle_suffix"]["overall"]["match_rate"] == 1.0
  recs = [json.loads(x) for x in (tmp_path / "res" / "questions.jsonl").read_text().splitlines()]
  extra = [r["extra"] for r in recs if r["method"] == "eagle_suffix"]
  assert extra and all(e["accepted_from_suffix"] <= e["accepted"] for e in extra)
  assert all(r["extra"]["verifications"] > 0 for r in recs if r["method"] == "suffix")
  bad = _suite(tmp_path, tiny_chat_dir, [{"name": "s", "method": "suffix",
                                          "min_token_prob": 1.5}])
  with pytest.raises(ConfigError, match=r"suffix: min_token_prob must lie in \[0, 1\]"):
    load_config(bad)
