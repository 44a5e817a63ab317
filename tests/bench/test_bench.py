"""python -m vocabjax.bench on tiny configs, and the projection arithmetic by hand."""

import json

import pytest

from vocabjax.bench import shapes
from vocabjax.bench.__main__ import main
from vocabjax.bench.engine import BenchError, Head
from vocabjax.bench.project import BenchTimes, interpolate, project, render
from vocabjax.io import read_jsonl

TARGET = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "tie_word_embeddings": False}
DRAFT = {"model_type": "qwen2", "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
         "tie_word_embeddings": True}


@pytest.fixture
def configs(tmp_path):
  t, d = tmp_path / "t.json", tmp_path / "d.json"
  t.write_text(json.dumps(TARGET))
  d.write_text(json.dumps(DRAFT))
  return str(t), str(d)


def _args(configs, out, *extra):
  t, d = configs
  return ["--target", t, "--draft", d, "--dtypes", "float32", "--batch", "1", "2",
          "--tokens", "1", "3", "--draft-tokens", "1", "--heads", "full", "trim:128",
          "specvocab:16", "--head-rows", "1", "2", "--context", "8", "--repeats", "1",
          "--bandwidth-mib", "4", "--out", str(out), "--no-progress", *extra]


def test_every_program_of_the_grid_is_timed_once_and_a_rerun_resumes(configs, tmp_path,
                                                                       capsys):
  out = tmp_path / "bench"
  assert main(_args(configs, out)) == 0
  rows = read_jsonl(out / "rows.jsonl")
  # target: 2 batches x 2 T; drafter: 2 batches x (1 body + 2 rows x 3 heads)
  assert len(rows) == 2 * 2 + 2 * (1 + 2 * 3)
  assert {(r["program"], r["B"], r["T"], r["head"]) for r in rows if r["role"] == "target"} == {
      ("target", B, T, "") for B in (1, 2) for T in (1, 3)}
  assert all(r["s"] > 0 and r["GBps"] > 0 for r in rows)
  # bytes of the target's B=1, T=3 program, by hand: per layer wq 64x64, wk and wv 32x64,
  # wo 64x64, gate and up 128x64, down 64x128 (f32), two layers; the untied head 512 x 64;
  # K and V of 2 layers x 32 wide for 8 + 3 positions
  per_layer = (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 128 * 64) * 4
  expected = 2 * per_layer + 512 * 64 * 4 + 2 * (8 + 3) * 2 * 32 * 4
  row = next(r for r in rows if r["program"] == "target" and r["B"] == 1 and r["T"] == 3)
  assert row["bytes"] == expected
  trim = next(r for r in rows if r["head"] == "trim:128" and r["B"] == 1 and r["T"] == 1)
  assert trim["bytes"] == 128 * 32 * 4
  bench = json.loads((out / "bench.json").read_text())
  assert bench["meta"]["read_GBps"] > 0 and len(bench["rows"]) == len(rows)
  assert all(r["read_GBps"] == bench["meta"]["read_GBps"] for r in rows)  # its run's probe
  assert bench["meta"]["models"][configs[0]]["vocab_size"] == 512
  md = (out / "bench.md").read_text()
  assert "| float32 | 2 | 3 |" in md and "specvocab:16" in md

  capsys.readouterr()
  assert main(_args(configs, out)) == 0  # nothing left to time
  err = capsys.readouterr().err
  assert "0 programs to time, 18 already" in err and "read bandwidth" not in err
  assert len(read_jsonl(out / "rows.jsonl")) == len(rows)

  # other settings: refused, then moved aside with --overwrite
  assert main(_args(configs, out, "--repeats", "2")) == 2
  assert "another device or other settings" in capsys.readouterr().err
  assert main(_args(configs, out, "--repeats", "2", "--overwrite")) == 0
  assert len(list(tmp_path.glob("bench.replaced-*"))) == 1


@pytest.mark.parametrize("extra, message", [
    (["--heads", "trim:100000"], "exceed"),
    (["--heads", "trim:0"], "positive size"),
    (["--heads", "top:5"], "expected full, trim:K or specvocab:k"),
    (["--tokens", "0"], "tokens must be positive"),
])
def test_bad_settings_name_the_value(configs, tmp_path, capsys, extra, message):
  assert main(_args(configs, tmp_path / "b") + extra) == 2
  err = capsys.readouterr().err
  assert message in err
  assert not (tmp_path / "b" / "rows.jsonl").exists()



def test_a_run_cut_short_keeps_the_reports_of_the_models_it_finished(configs, tmp_path,
                                                                      monkeypatch):
  """A device step's time limit may stop the bench mid-way: bench.json / bench.md already
  hold the target's rows (written after each model), and a rerun times only the rest."""
  from vocabjax.bench import engine

  real = engine.median_s
  calls = []

  def stop_in_the_drafter(call, *a, **kw):
    calls.append(1)
    if len(calls) == 6:  # the probe, 4 target programs (2 B x 2 T), the drafter's first
      raise KeyboardInterrupt
    return real(call, *a, **kw)

  monkeypatch.setattr(engine, "median_s", stop_in_the_drafter)
  out = tmp_path / "bench"
  with pytest.raises(KeyboardInterrupt):
    main(_args(configs, out))
  bench = json.loads((out / "bench.json").read_text())
  assert {r["role"] for r in bench["rows"]} == {"target"} and len(bench["rows"]) == 4
  assert "| float32 | 2 | 3 |" in (out / "bench.md").read_text()
  monkeypatch.setattr(engine, "median_s", real)
  assert main(_args(configs, out)) == 0
  assert len(json.loads((out / "bench.json").read_text())["rows"]) == 18

def test_an_unknown_model_is_named(tmp_path, capsys):
  assert main(["--target", "no-such-model", "--draft", "qwen2.5-0.5b-instruct", "--out",
               str(tmp_path / "b")]) == 2
  assert "no-such-model" in capsys.readouterr().err


def test_known_shapes_have_their_published_sizes():
  # parameter counts of the published checkpoints (model cards): a typo in a shape shows here
  published = {"llama-3.1-8b-instruct": 8.03e9, "qwen2.5-7b-instruct": 7.62e9,
               "llama-3.2-1b-instruct": 1.24e9, "qwen2.5-0.5b-instruct": 0.494e9,
               "qwen2.5-coder-1.5b-instruct": 1.54e9, "smollm2-135m-instruct": 0.135e9,
               "mistral-nemo-12b-instruct": 12.2e9, "qwen3-8b": 8.2e9, "qwen3-0.6b": 0.6e9}
  for name, n in published.items():
    _, cfg = shapes.resolve_config(name)
    assert abs(cfg.num_params() - n) / n < 0.01, (name, cfg.num_params())
  for target, draft in shapes.PAIRS.values():
    assert shapes.resolve_config(target)[1].arch == shapes.resolve_config(draft)[1].arch


def test_head_specs():
  assert Head.parse("full") == Head("full")
  assert Head.parse("specvocab:1024", rank=32) == Head("specvocab", 1024, 32)
  with pytest.raises(BenchError, match="exceed"):
    Head.parse("trim:600").check(512, "m")


def test_interpolation():
  pts = {1: 10.0, 3: 14.0, 5: 30.0}
  assert interpolate(pts, 3) == (14.0, "")
  assert interpolate(pts, 2) == (12.0, "interpolated")
  assert interpolate(pts, 4) == (22.0, "interpolated")
  assert interpolate(pts, 7) == (46.0, "extrapolated")


def _bench_rows():
  rows = []

  def add(model, program, T, s, head=""):
    rows.append({"model": model, "role": "target" if program == "target" else "draft",
                 "program": program, "dtype": "bfloat16", "B": 1, "T": T, "head": head, "s": s})
  for T, s in ((1, 0.010), (4, 0.012), (8, 0.016)):
    add("big", "target", T, s)
  for T, s in ((1, 0.002), (2, 0.003)):
    add("small", "drafter_body", T, s)
  for rows_, s in ((1, 0.001), (2, 0.0014)):
    add("small", "drafter_head", rows_, s, "full")
    add("small", "drafter_head", rows_, s / 4, "trim:1000")
  add("small", "drafter_head", 1, 0.0002, "specvocab:64")
  return rows


def _run_dir(tmp_path, pld_steps="per_step"):
  d = tmp_path / "run"
  d.mkdir()
  methods = [
      {"name": "ar", "method": "ar", "framework": "vocabjax", "params": {},
       "draft_vocab_size": None},
      {"name": "chain_g3", "method": "chain", "framework": "vocabjax", "params": {"gamma": 3},
       "draft_vocab_size": 4000},
      {"name": "vt_2k", "method": "vocabtrim", "framework": "vocabjax",
       "params": {"gamma": 3, "k": 2000}, "draft_vocab_size": 2000},
      {"name": "sv", "method": "specvocab", "framework": "vocabjax",
       "params": {"gamma": 3, "k": 64}, "draft_vocab_size": 99},
      {"name": "pld", "method": "pld", "framework": "vocabjax", "params": {"gamma": 5},
       "draft_vocab_size": None},
      {"name": "eagle", "method": "eagle", "framework": "vocabjax", "params": {},
       "draft_vocab_size": 1000},
      {"name": "ar", "method": "ar", "framework": "torch", "params": {},
       "draft_vocab_size": None}]
  (d / "summary.json").write_text(json.dumps({
      "config": {"target": "big", "draft": "small", "dtype": None, "draft_dtype": None},
      "environment": {"cpu": "test cpu"}, "methods": methods}))
  split = {"drafter_calls": [[2, 1], [1, 1], [1, 1]], "verify_tokens": 4}
  (d / "splits.json").write_text(json.dumps({"chain_g3": split, "vt_2k": split, "sv": split}))
  recs = []
  # (method, tokens, steps, decode_s) for two questions each
  for name, qs in {"ar": [(101, 100, 20.0), (51, 50, 10.0)],
                   "chain_g3": [(101, 40, 12.0), (51, 20, 6.0)],
                   "vt_2k": [(101, 50, 13.0), (51, 25, 6.5)],
                   "sv": [(101, 50, 12.0), (51, 25, 6.0)],
                   "pld": [(101, 75, 16.0), (51, 75, 16.0)],
                   "eagle": [(101, 30, 9.0), (51, 15, 4.5)]}.items():
    for i, (n, steps, dec) in enumerate(qs):
      recs.append({"framework": "vocabjax", "method": name, "num_tokens": n, "steps": steps,
                   "decode_s": dec})
      if name == "pld":  # 25 steps with 4 drafts in the first question, no match elsewhere
        drafts = [4] * 25 + [0] * 50 if i == 0 else [0] * 75
        recs[-1]["drafted"] = sum(drafts)
        if pld_steps == "per_step":
          recs[-1]["step_drafted"] = drafts
        elif pld_steps == "matched":
          recs[-1]["extra"] = {"matched_steps": 25 if i == 0 else 0}
  recs.append({"framework": "torch", "method": "ar", "num_tokens": 101, "steps": None,
               "decode_s": None})
  (d / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
  return d


def test_projection_by_hand(tmp_path):
  bench = {"meta": {"device": {"device": "Fake GPU", "backend": "gpu"}, "command": "bench",
                    "models": {"big": {"vocab_size": 4000}, "small": {"vocab_size": 4000}}},
           "rows": _bench_rows()}
  proj = project(_run_dir(tmp_path), bench)
  by = {m["name"]: m for m in proj["methods"]}
  assert proj["dtype"] == "bfloat16"  # the run's dtype was not measured: the bench's
  # ar: 150 tokens after the first ones, 150 steps of 10 ms -> 100 tok/s
  assert by["ar"]["step_s"] == pytest.approx(0.010)
  assert by["ar"]["projected_tok_s"] == pytest.approx(100.0)
  # chain: target T=4 12 ms + drafter T=2 (3 ms) + head 1 ms + 2 x (2 ms + 1 ms) = 22 ms;
  # 150 tokens in 60 steps -> 150 / 1.32 s
  assert by["chain_g3"]["step_s"] == pytest.approx(0.022)
  assert by["chain_g3"]["projected_tok_s"] == pytest.approx(150 / 1.32)
  assert by["chain_g3"]["projected_speedup"] == pytest.approx(150 / 1.32 / 100)
  # vocabtrim K=2000: head linear in K between trim:1000 (0.25 ms) and full = V 4000 (1 ms):
  # 0.25 + 0.75 / 3 = 0.5 ms per call -> 12 + 3 + 2 + 2 + 3 x 0.5 = 20.5 ms, 75 steps
  assert by["vt_2k"]["step_s"] == pytest.approx(0.0205)
  assert "interpolated in K" in by["vt_2k"]["note"]
  assert by["vt_2k"]["projected_tok_s"] == pytest.approx(150 / (75 * 0.0205))
  # specvocab k=64: 0.2 ms per call -> 12 + 7 + 0.6 = 19.6 ms
  assert by["sv"]["step_s"] == pytest.approx(0.0196)
  # pld: 25 steps of T=5 (13 ms, between T=4 and T=8) and 125 of T=1 (10 ms) over 150 steps
  assert by["pld"]["step_s"] == pytest.approx((25 * 0.013 + 125 * 0.010) / 150)
  assert "per-step blocks" in by["pld"]["note"]
  assert by["eagle"]["projected_tok_s"] is None and "not projected" in by["eagle"]["note"]
  assert [m["name"] for m in proj["methods"]] == ["ar", "chain_g3", "vt_2k", "sv", "pld",
                                                  "eagle"]  # vocabjax's methods only
  # measured figures come from the run itself: ar 150 tokens / 30 s
  assert by["ar"]["measured_decode_tok_s"] == pytest.approx(5.0)
  assert by["chain_g3"]["measured_speedup"] == pytest.approx((150 / 18) / 5.0)
  md = render(proj, "cmd")
  assert "PROJECTED" in md and "| chain_g3 | 2 | 2.50 | 22.00 | 113.6 | 1.14 |" in md


@pytest.mark.parametrize("recorded, step_s, note", [
    ("matched", (25 * 0.013 + 125 * 0.010) / 150, "25 of 150 steps matched"),
    ("none", 0.014, "upper bound"),  # gamma 5: T=6, between T=4 and T=8
])
def test_pld_projection_from_older_records(tmp_path, recorded, step_s, note):
  bench = {"meta": {"device": {}, "models": {"big": {}, "small": {"vocab_size": 4000}}},
           "rows": _bench_rows()}
  pld = [m for m in project(_run_dir(tmp_path, recorded), bench)["methods"]
         if m["name"] == "pld"][0]
  assert pld["step_s"] == pytest.approx(step_s)
  assert note in pld["note"]


def test_projection_refuses_missing_rows(tmp_path):
  with pytest.raises(BenchError, match="B=4"):
    BenchTimes(_bench_rows(), 4)
  bench = {"meta": {"device": {}, "models": {"big": {}, "small": {"vocab_size": 4000}}},
           "rows": [r for r in _bench_rows() if r["program"] != "drafter_body"]}
  with pytest.raises(BenchError, match="drafter body small"):
    project(_run_dir(tmp_path), bench)


def test_project_cli(tmp_path, capsys):
  run = _run_dir(tmp_path)
  b = tmp_path / "bench"
  b.mkdir()
  (b / "bench.json").write_text(json.dumps({
      "meta": {"device": {"device": "Fake GPU", "backend": "gpu"}, "command": "bench",
               "models": {"big": {"vocab_size": 4000}, "small": {"vocab_size": 4000}}},
      "rows": _bench_rows()}))
  out = tmp_path / "proj"
  assert main(["project", "--run", str(run), "--bench", str(b), "--out", str(out)]) == 0
  assert json.loads((tmp_path / "proj.json").read_text())["methods"][0]["name"] == "ar"
  assert "PROJECTED" in (tmp_path / "proj.md").read_text()
  assert main(["project", "--run", str(run), "--bench", str(tmp_path / "nope")]) == 2
  assert "not a readable bench.json" in capsys.readouterr().err


def test_an_hf_directory_and_a_gguf_file_give_the_loaders_config(tiny_dirs, tmp_path):
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.testing.tiny import tiny_hf_model, write_tiny_gguf

  d = tiny_dirs["qwen2_bias_tied"]
  assert shapes.resolve_config(d)[1] == load_model(d, load_tokenizer=False).config
  path = write_tiny_gguf(tiny_hf_model("llama", num_attention_heads=8, num_key_value_heads=2),
                         tmp_path / "m.gguf")
  name, cfg = shapes.resolve_config(path)
  assert name == "m" and cfg == load_model(path, load_tokenizer=False).config
  (tmp_path / "bad.json").write_text("{not json")
  with pytest.raises(shapes.ShapeError, match="bad.json"):
    shapes.resolve_config(tmp_path / "bad.json")


def test_rows_without_their_meta_are_not_resumed(tmp_path):
  """rows.jsonl with meta.json deleted (or torn): the settings its rows were timed under are
  unknown, so a run refuses them (or moves them aside with --overwrite) instead of reporting
  them under a new meta.json."""
  from vocabjax.bench.run import _prepare

  out = tmp_path / "b"
  out.mkdir()
  (out / "rows.jsonl").write_text('{"model": "m", "context": 16}\n')
  meta = {"device": {"device": "cpu"}, "timing": {"context": 64}, "models": {}}
  with pytest.raises(BenchError, match="without a readable meta.json"):
    _prepare(out, dict(meta), overwrite=False)
  (out / "meta.json").write_text("{torn")
  with pytest.raises(BenchError, match="without a readable meta.json"):
    _prepare(out, dict(meta), overwrite=False)
  rows, old = _prepare(out, dict(meta), overwrite=True)
  assert rows == [] and old == {}
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith("b.replaced-")]
  # a fresh directory, and rows under matching meta, still resume
  (out / "rows.jsonl").write_text('{"model": "m"}\n')
  (out / "meta.json").write_text(json.dumps(meta))
  assert _prepare(out, dict(meta), overwrite=False)[0] == [{"model": "m"}]
