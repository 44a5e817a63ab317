"""Multi-turn self-refinement (`self_refine`): each question answered, then revised twice, every
turn's prompt holding the method's own earlier answers; greedy speculative methods see the same
conversation as plain decoding, turn by turn; a resumed run continues a conversation from its
recorded turns."""

import json

import pytest
import yaml

from vocabjax.errors import ConfigError
from vocabjax.eval.__main__ import main, parse_args
from vocabjax.eval.runner import RECORDS
from vocabjax.prompts import (REFINE_FOLLOWUPS, DatasetSpec, encode_conversation, load_prompts,
                              suite_datasets)

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Again."]},
    {"question_id": 4, "category": "qa", "turns": ["Who are you?"]},
    {"question_id": 5, "category": "qa", "turns": ["Where is Rome?"]},
]


SHORT = ("Revise it.", "Again.")  # the tiny model's context is 256 tokens of bytes


@pytest.fixture
def suite(tmp_path, tiny_chat_dir, monkeypatch):
  monkeypatch.setattr("vocabjax.prompts.REFINE_FOLLOWUPS", SHORT)
  bench = tmp_path / "bench.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  cfg = {"name": "tiny_refine", "target": str(tiny_chat_dir), "draft": str(tiny_chat_dir),
         "datasets": [{"kind": "self_refine", "path": str(bench), "per_group": 1}],
         "max_new_tokens": 8, "chat": True,
         "methods": [{"name": "ar", "method": "ar"},
                     {"name": "chain_g2", "method": "chain", "gamma": 2},
                     {"name": "suffix", "method": "suffix"}]}
  path = tmp_path / "refine.yaml"
  path.write_text(yaml.safe_dump(cfg))
  return path, cfg


def _run(path, out, *extra):
  return main(parse_args(["--config", str(path), "--out", str(out), "--quiet", *extra]))


def _records(out):
  return [json.loads(line) for line in (out / RECORDS).read_text().splitlines()]


def test_self_refine_prompts_are_spec_bench_questions_with_two_revisions(tmp_path):
  bench = tmp_path / "b.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  prompts = load_prompts([DatasetSpec("self_refine", path=str(bench))])
  assert [p.qid for p in prompts] == ["self_refine/1", "self_refine/4", "self_refine/5"]
  p = prompts[0]
  assert p.turns == ("Write a haiku.", *REFINE_FOLLOWUPS) and len(p.turns) == 3
  assert [p.turn_qid(t) for t in range(3)] == ["self_refine/1", "self_refine/1/turn2",
                                               "self_refine/1/turn3"]
  assert [p.turn_group(t) for t in range(3)] == [f"self_refine/turn{t}" for t in (1, 2, 3)]
  shipped = load_prompts(suite_datasets("self_refine"))  # four conversations of 3 turns
  assert [p.category for p in shipped] == ["coding", "humanities", "writing", "qa"]
  assert all(len(p.turns) == 3 for p in shipped)


def test_a_conversation_holds_the_earlier_answers(tiny_chat_dir):
  from transformers import AutoTokenizer

  tok = AutoTokenizer.from_pretrained(tiny_chat_dir)
  one = encode_conversation(tok, ["Hi."], [], chat=True)
  two = encode_conversation(tok, ["Hi.", "Again."], ["Hello there."], chat=True)
  assert two[:len(one)] == one  # the first turn's prompt, then its answer and the next turn
  text = tok.decode(two)
  assert text.index("Hi.") < text.index("Hello there.") < text.index("Again.")
  plain = encode_conversation(tok, ["Hi.", "Again."], ["Hello."], chat=False)
  assert tok.decode(plain) == "Hi.\n\nHello.\n\nAgain."
  with pytest.raises(ValueError, match="2 turns need 1 answers, got 0"):
    encode_conversation(tok, ["Hi.", "Again."], [], chat=True)


@pytest.mark.extended
def test_every_turn_is_lossless_and_resumes_from_its_recorded_turns(suite, tmp_path):
  from transformers import AutoTokenizer

  path, cfg = suite
  out = tmp_path / "res"
  summary = _run(path, out)
  recs = _records(out)
  assert len(recs) == 2 * 3 * 3  # 2 conversations x 3 turns x 3 methods
  assert summary["groups"] == ["self_refine/turn1", "self_refine/turn2", "self_refine/turn3"]
  by = {(r["method"], r["qid"]): r for r in recs}
  tok = AutoTokenizer.from_pretrained(cfg["target"])
  for qid in ("self_refine/1", "self_refine/4"):
    ar = [by[("ar", qid if t == 1 else f"{qid}/turn{t}")] for t in (1, 2, 3)]
    assert [r["turn"] for r in ar] == [1, 2, 3]
    # each turn's prompt is the conversation so far: longer than the turn before by its answer
    assert ar[0]["prompt_tokens"] < ar[1]["prompt_tokens"] < ar[2]["prompt_tokens"]
    first = tok.decode(ar[0]["output_ids"], skip_special_tokens=True)
    turn2 = encode_conversation(tok, ["Write a haiku." if qid.endswith("/1") else
                                      "Who are you?", SHORT[0]], [first], chat=True)
    assert ar[1]["prompt_tokens"] == len(turn2)
    for name in ("chain_g2", "suffix"):  # greedy: the same answers, turn by turn
      for t, r in enumerate(ar, 1):
        assert by[(name, r["qid"])]["output_ids"] == r["output_ids"], (name, r["qid"])
  for m in summary["methods"]:
    assert m["overall"]["match_rate"] == 1.0
  # interrupted after a conversation's first turn: the rerun continues it from the record
  keep = [r for r in recs if not (r["method"] == "suffix" and r["qid"].startswith(
      "self_refine/4/"))]
  (out / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in keep))
  _run(path, out)
  again = {(r["method"], r["qid"]): r["output_ids"] for r in _records(out)}
  assert len(again) == 18 and again == {k: r["output_ids"] for k, r in by.items()}
  # and drafted as the uninterrupted run did: the resumed run's global suffix tree was rebuilt
  # from the recorded answers (in their order) before it answered anything new
  redone = [r for r in _records(out) if r["method"] == "suffix" and
            r["qid"].startswith("self_refine/4/")]
  assert redone and sum(by[("suffix", r["qid"])]["accepted"] for r in redone) > 0
  for r in redone:
    was = by[("suffix", r["qid"])]
    assert (r["steps"], r["accepted"], r["step_drafted"]) == (
        was["steps"], was["accepted"], was["step_drafted"]), r["qid"]


def test_a_conversation_outgrowing_max_len_names_the_turn(suite, tmp_path):
  path, cfg = suite
  ar_only = {**cfg, "methods": cfg["methods"][:1]}
  probe = tmp_path / "probe.yaml"
  probe.write_text(yaml.safe_dump(ar_only))
  _run(probe, tmp_path / "probe")
  recs = _records(tmp_path / "probe")
  turn1 = max(r["prompt_tokens"] for r in recs if r["turn"] == 1)
  assert min(r["prompt_tokens"] for r in recs if r["turn"] == 2) > turn1 + 8
  bad = tmp_path / "short.yaml"  # room for every first turn and its 8 new tokens, not more
  bad.write_text(yaml.safe_dump({**ar_only, "max_len": turn1 + 8}))
  with pytest.raises(ConfigError, match=r"self_refine/\d turn 2: the conversation so far is "
                                        r"\d+ tokens; with 8 slots for new tokens it exceeds "
                                        r"max_len="):
    _run(bad, tmp_path / "short")


@pytest.mark.extended
def test_reuse_takes_every_turn_and_the_followups_are_in_the_questions_hash(suite, tmp_path,
                                                                            monkeypatch):
  from vocabjax.eval.provenance import questions_hash

  path, cfg = suite
  first = tmp_path / "first.yaml"
  first.write_text(yaml.safe_dump({**cfg, "methods": cfg["methods"][:2]}))
  _run(first, tmp_path / "a")
  old = {(r["method"], r["qid"]): r for r in _records(tmp_path / "a")}
  assert len(old) == 2 * 3 * 2
  _run(path, tmp_path / "b", "--reuse", str(tmp_path / "a"))  # + suffix
  new = _records(tmp_path / "b")
  assert len(new) == 18
  for r in new:  # every turn of ar and chain copied as recorded (times included), not redone
    if r["method"] != "suffix":
      assert r.pop("reused_from") == str(tmp_path / "a")
      assert r == old[(r["method"], r["qid"])]
  # the later turns' text is part of the questions: other follow-ups are other questions
  prompts = load_prompts([DatasetSpec("self_refine", path=cfg["datasets"][0]["path"],
                                      per_group=1)])
  before = questions_hash(prompts)
  monkeypatch.setattr("vocabjax.prompts.REFINE_FOLLOWUPS", ("Revise.", "Again."))
  assert questions_hash(load_prompts([DatasetSpec("self_refine",
                                                  path=cfg["datasets"][0]["path"],
                                                  per_group=1)])) != before
