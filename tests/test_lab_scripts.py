"""Lab scripts (kernels/, train/, eval/) that other runs depend on (step_programs.py: the prepared GPU
run's step timing), loaded by path: they are not part of the package."""

import json
import types

import pytest
from tests.helpers.lab import load_script, tiny_configs
from tests.helpers.lab import script_path


@pytest.mark.extended
def test_step_programs_times_steps_and_projects_from_a_run(tmp_path):
  sp = load_script("step_programs")
  t, d = tiny_configs(tmp_path)
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


@pytest.mark.extended
def test_step_programs_times_specvocab_chains(tmp_path):
  """The SpecVocab chain steps (XLA's gather and the dispatcher) beside the full-vocabulary
  chain; `kernel` needs a GPU/TPU backend and says so on the CPU."""
  sp = load_script("step_programs")
  t, d = tiny_configs(tmp_path)
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
  sp = load_script("step_programs")
  t, d = tiny_configs(tmp_path)
  common = ["--target", str(t), "--draft", str(d), "--out", str(tmp_path / "o")]
  with pytest.raises(SystemExit):  # no plain step to compare with
    sp.main(common + ["--methods", "eagle_k1d4"])
  with pytest.raises(SystemExit):  # no room for the steps
    sp.main(common + ["--context", "100", "--max-len", "128"])
  with pytest.raises(FileNotFoundError, match="no summary.json"):
    sp.main(common + ["--run", str(tmp_path / "missing")])


def test_papers_pipeline_names_existing_recipes_in_order():
  """eval/papers_pipeline.sh (the papers' comparison in one command): valid bash, and
  every recipe and suite it runs exists, heads before the rankers that read them."""
  import re
  import subprocess

  script = script_path("papers_pipeline.sh")
  subprocess.run(["bash", "-n", str(script)], check=True)
  text = "\n".join(line for line in script.read_text().splitlines()
                   if not line.lstrip().startswith("#"))  # the commands, not the comments
  root = script.parents[1]
  recipes = re.findall(r"configs/train/[\w/]+\.yaml", text)
  assert recipes[:2] == ["configs/train/eagle_papers/fullvocab.yaml",
                         "configs/train/eagle_papers/v32k.yaml"]
  for path in recipes:
    assert (root / path).is_file(), path
  for r in re.search(r"for r in ([\w ]+); do", text).group(1).split():
    assert (root / "configs/train/ranker_papers" / f"{r}.yaml").is_file(), r
  suite = re.search(r'SUITE="\$\{SUITE:-(\w+)\}"', text).group(1)
  assert (root / "configs/eval" / f"{suite}.yaml").is_file()
  assert text.index("vocabjax.train.ranker") < text.index("vocabjax.eval")


def test_sizing_batch_takes_each_cells_median_round(monkeypatch):
  """eval/sizing_batch.py --repeats: one row per (batch, method), the median round's, with every
  round's tok/s in order, equal to plain decoding only if every round was."""
  monkeypatch.syspath_prepend(str(script_path("sizing_batch").parent))  # its pair_study import
  sb = load_script("sizing_batch")
  rows = [{"round": i, "batch": 4, "method": "ar", "tok_s": t, "equal_ar": True}
          for i, t in enumerate([10.0, 12.0, 11.0])]
  rows += [{"round": i, "batch": 4, "method": "x", "tok_s": t, "equal_ar": i != 1, "tau": i}
           for i, t in enumerate([9.0, 8.0, 10.0])]
  got = {r["method"]: r for r in sb.merged(rows)}
  assert got["ar"]["tok_s"] == 11.0 and got["ar"]["rounds"] == [10.0, 12.0, 11.0]
  assert got["x"]["tok_s"] == 9.0 and got["x"]["tau"] == 0 and got["x"]["round"] == 0
  assert got["x"]["equal_ar"] is False and got["ar"]["equal_ar"] is True


def test_sizing_batch_interleaves_methods_batch_by_batch(monkeypatch):
  """eval/sizing_batch.py --interleave: every method decodes a batch before the next batch, the
  order rotated batch by batch; each method's tokens and decode seconds summed over its batches."""
  monkeypatch.syspath_prepend(str(script_path("sizing_batch").parent))
  sb = load_script("sizing_batch")
  calls = []

  class Fake:
    def __init__(self, name):
      self.name = name

    def generate(self, rows, max_new_tokens, eos_token_ids):
      calls.append((self.name, rows[0]))
      return types.SimpleNamespace(tokens=[[r] for r in rows], decode_s=1.0 + len(rows),
                                   stats=None)

  decs = {n: Fake(n) for n in ("ar", "x", "y")}
  got = sb._decode(decs, [0, 1, 2, 3, 4, 5], 2, 8, interleave=True)
  assert calls == [("ar", 0), ("x", 0), ("y", 0), ("x", 2), ("y", 2), ("ar", 2),
                   ("y", 4), ("ar", 4), ("x", 4)]
  assert got["x"][0] == [[0], [1], [2], [3], [4], [5]] and got["x"][1] == 9.0
  calls.clear()
  sb._decode(decs, [0, 1, 2, 3], 2, 8)
  assert calls == [("ar", 0), ("ar", 2), ("x", 0), ("x", 2), ("y", 0), ("y", 2)]


def test_llamacpp_anchor_splits_where_the_time_goes():
  """eval/llamacpp_anchor.py's split table: prompt and decode seconds summed, tokens a step after
  each prompt's first, a step's parts in ms, and the tokens a step 1.5x llama.cpp plain needs."""
  an = load_script("llamacpp_anchor")
  plain = {"generations": [{"qid": 1, "tokens": list(range(10)), "seconds": 2.0}],
           "peak_gb": 1.0}
  gen = {"qid": 1, "tokens": list(range(10)), "seconds": 2.5, "prefill_s": 0.5,
         "decode_s": 1.8, "steps": 3, "sized": {"0": 1, "3": 2}}
  split = {"drafter_s": 0.1, "drafter_head_s": 0.05, "verification_s": 0.4,
           "target_step_s": 0.3, "verify_tokens": 4}
  results = {"llamacpp": {"llama.cpp plain": plain},
             "vocabjax-spec": {"vocabjax chain": {"generations": [gen], "peak_gb": 2.0,
                                                  "step_split": split},
                               "vocabjax slow": {"generations": [dict(gen, prefill_s=1.5,
                                                                      decode_s=0.8)],
                                                 "peak_gb": 2.0}}}
  rows = an.split_rows(results)
  assert len(rows) == 4
  # goal 7.5 tok/s: 10 tokens in 1.333 s, less 0.5 s prompt and 0.2 s outside both: 0.633 s
  # of 600 ms steps, for 9 tokens
  assert rows[2] == ("| vocabjax chain (drafts chosen: 0: 1, 3: 2) | 0.50 | 1.80 | 3 | 3.00 | "
                     "600.0 | 100.0, 50.0, 400.0, 300.0 (4 tokens verified) | 8.53 |")
  assert rows[3].endswith("| - | none: prompt processing alone takes longer |")
  assert an.table(results)[3].startswith("| vocabjax chain | 4.00 | 0.80x |")


def test_sizing_batch_pools_the_rounds_decode_time(monkeypatch):
  """eval/sizing_batch.py's pooled speedup: plain decoding's decode seconds summed over the
  rounds over the method's (the same tokens every round: 1 / tok/s summed)."""
  monkeypatch.syspath_prepend(str(script_path("sizing_batch").parent))
  sb = load_script("sizing_batch")
  rows = [{"batch": 4, "method": "ar", "rounds": [10.0, 20.0]},
          {"batch": 4, "method": "x", "rounds": [20.0, 10.0]},
          {"batch": 4, "method": "y", "rounds": [20.0, 40.0]}]
  got = sb.pooled(rows)
  assert got[(4, "x")] == pytest.approx(1.0) and got[(4, "y")] == pytest.approx(2.0)


def test_llamacpp_anchor_pools_rounds():
  """eval/llamacpp_anchor.py --rounds: a method's generations of every round in one list (tok/s
  over them all), its peak the largest, and each round's ratio to llama.cpp plain beside."""
  an = load_script("llamacpp_anchor")

  def res(cpp_s, vj_s, peak):
    return {"llamacpp": {"llama.cpp plain": {"generations": [
                {"qid": 1, "tokens": [1, 2, 3, 4], "seconds": cpp_s}], "peak_gb": 1.0},
                         "llama.cpp version": "x"},
            "vocabjax-plain": {"vocabjax plain": {"generations": [
                {"qid": 1, "tokens": [1, 2, 3, 4], "seconds": vj_s}], "peak_gb": peak}}}

  rounds = [res(2.0, 1.0, 1.5), res(2.0, 3.0, 1.2)]
  got = an.pooled(rounds)
  vj = got["vocabjax-plain"]["vocabjax plain"]
  assert len(vj["generations"]) == 2 and vj["peak_gb"] == 1.5
  assert an.rate(vj) == pytest.approx(2.0)  # 8 tokens in 4 s
  assert len(rounds[0]["vocabjax-plain"]["vocabjax plain"]["generations"]) == 1  # not mutated
  rows = an.table(got, rounds)
  assert rows[0].endswith("| x llama.cpp plain, each round |")
  # pooled 2.0 / 2.0 tok/s; round 1 4.0 / 2.0, round 2 1.33 / 2.0
  assert rows[3] == "| vocabjax plain | 2.00 | 1.00x | 2/2 | 2/2 | 1.50 | 2.00x, 0.67x |"
  assert not an.table(got, rounds[:1])[0].endswith("each round |")
