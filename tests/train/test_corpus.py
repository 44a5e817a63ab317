"""`python -m vocabjax.train.corpus`: records the trainers read, cut, chat-wrapped, shuffled by
seed, with a per-source summary; eval-suite questions left out; bad input refused."""

import json

import pytest
from vocabjax.checkpoints.loader import load_tokenizer_and_vocab
from vocabjax.errors import ConfigError
from vocabjax.prompts import in_suites, suite_questions
from vocabjax.train.corpus import build_corpus, main
from vocabjax.train.features import read_records


@pytest.fixture()
def suite(tmp_path):
  """A suite of the shared split's first question per group (no extra packages needed)."""
  path = tmp_path / "mini.yaml"
  path.write_text("name: mini\ndatasets:\n  - {kind: spec_bench, per_group: 1}\n")
  return path


@pytest.fixture()
def generated(tmp_path):
  path = tmp_path / "target_generated" / "generated.jsonl"
  path.parent.mkdir()
  path.write_text("".join(json.dumps({"prompt": f"q{i}", "completion_ids": [5, 6, 7 + i]})
                          + "\n" for i in range(5)))
  return path


def test_records_sources_and_summary(tiny_chat_dir, suite, generated):
  tok, V = load_tokenizer_and_vocab(tiny_chat_dir)
  recs, summary = build_corpus(["stdlib:3", f"jsonl:{generated}"], tok, max_completion=32,
                               seed=1, exclude_suites=[str(suite)], eos_token_id=1)
  assert summary["stdlib"] == {"records": 3, "positions": 96}  # long files: cut at 32
  assert summary[f"jsonl:{generated}"] == {"records": 5, "positions": 15}
  assert len(recs) == 8
  std = [r for r in recs if r["source"].startswith("stdlib/")]
  assert len(std) == 3 and all(len(r["completion_ids"]) == 32 for r in std)
  assert all(max(r["completion_ids"]) < V for r in std)
  # chat-wrapped prompts naming the module
  head = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                 add_generation_prompt=True)[:10]
  assert all(r["prompt"].startswith(head) and "standard library module" in r["prompt"]
             for r in std)
  # given records keep their ids and get their directory as source
  gen = sorted((r for r in recs if r["source"].startswith("target_generated/")),
               key=lambda r: r["prompt"])
  assert [r["completion_ids"] for r in gen] == [[5, 6, 7 + i] for i in range(5)]
  # shuffled by the seed: another seed, another order of the same records
  again, _ = build_corpus(["stdlib:3", f"jsonl:{generated}"], tok, max_completion=32, seed=1,
                          exclude_suites=[str(suite)], eos_token_id=1)
  other, _ = build_corpus(["stdlib:3", f"jsonl:{generated}"], tok, max_completion=32, seed=2,
                          exclude_suites=[str(suite)], eos_token_id=1)
  assert again == recs and [r["source"] for r in other] != [r["source"] for r in recs]


def test_suite_questions_are_left_out(suite):
  used = suite_questions([str(suite)])
  assert len(used) >= 6
  # a suite prompt is matched inside a longer text and the other way round, whitespace and
  # case aside (GSM8K's questions are Spec-Bench's math questions with a suffix added)
  q = used[0]
  assert in_suites(q.upper() + "\nLet's think step by step.", used)
  assert in_suites("  " + q.replace(" ", "\n "), used)
  assert not in_suites("a question of no suite at all, surely", used)


def test_cli_writes_atomically_and_bad_input(tiny_chat_dir, suite, generated, tmp_path, capsys):
  out = tmp_path / "corpus" / "mix.jsonl"
  assert main(["--target", str(tiny_chat_dir), "--out", str(out), "--source", "stdlib:2",
               "--source", f"jsonl:{generated}", "--max-completion", "24",
               "--exclude-suites", str(suite)]) == 0
  recs = read_records([out])
  assert len(recs) == 7
  summary = json.loads((tmp_path / "corpus" / "mix.jsonl.summary.json").read_text())
  assert summary["total"]["records"] == 7 and "--source stdlib:2" in summary["command"]
  tok, _ = load_tokenizer_and_vocab(tiny_chat_dir)
  for bad, msg in [(["nope"], "unknown source 'nope'"), (["stdlib:0"], "positive integer"),
                   ([f"jsonl:{tmp_path / 'missing.jsonl'}"], "no data file")]:
    with pytest.raises(ValueError, match=msg):
      build_corpus(bad, tok, exclude_suites=[str(suite)])
  with pytest.raises(ConfigError, match="max_completion=8 must be >= 16"):
    build_corpus(["stdlib:1"], tok, max_completion=8, exclude_suites=[str(suite)])
  # a failing build leaves the file written before as it was
  before = out.read_text()
  assert main(["--target", str(tiny_chat_dir), "--out", str(out), "--source", "nope",
               "--exclude-suites", str(suite)]) == 2
  assert "unknown source" in capsys.readouterr().err and out.read_text() == before


def test_jsonl_ids_outside_the_targets_vocabulary_are_refused(tiny_chat_dir, suite, tmp_path,
                                                              capsys):
  """A jsonl: source holding ids past the target's V (or non-integers) is refused naming the
  file, line and ids, before anything is written (it trained until a NaN loss)."""
  _, V = load_tokenizer_and_vocab(tiny_chat_dir)
  bad = tmp_path / "gen" / "bad.jsonl"
  bad.parent.mkdir()
  bad.write_text(json.dumps({"prompt": "q", "completion_ids": [5, 6]}) + "\n"
                 + json.dumps({"prompt": "q2", "completion_ids": [5, V + 211]}) + "\n")
  out = tmp_path / "corpus.jsonl"
  assert main(["--target", str(tiny_chat_dir), "--out", str(out), "--source", f"jsonl:{bad}",
               "--exclude-suites", str(suite)]) == 2
  err = capsys.readouterr().err
  assert f"bad.jsonl:2: completion_ids [{V + 211}] lie outside the vocabulary [0, {V})" in err
  assert not out.exists()
  bad.write_text(json.dumps({"prompt": "q", "completion_ids": [5, 6.5]}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1 is not a completion record .*list of "
                                       r"integers"):
    read_records([bad])
