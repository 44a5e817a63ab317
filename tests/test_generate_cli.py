"""`python -m vocabjax.generate` end to end on a tiny checkpoint with a real tokenizer."""

import json
import re
import subprocess
import sys

import pytest

from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder
from vocabjax.generate import main, parse_args
from vocabjax.prompts import encode_prompts


def test_main_writes_ids_text_and_timing(tiny_chat_dir, tmp_path, capsys):
  out = tmp_path / "stats.json"
  cfg = parse_args(["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--prompt",
                    "Hello", "--chat", "--max-new-tokens", "7", "--output", str(out)])
  stats = main(cfg)
  saved = json.loads(out.read_text())
  assert saved["output_ids"] == stats["output_ids"] and len(saved["output_ids"]) == 2
  assert all(len(ids) <= 7 for ids in saved["output_ids"])
  assert {"compile_s", "prefill_s", "decode_s", "tokens_per_s"} <= set(saved["timing"])
  assert saved["settings"]["chat"] is True and saved["dtype"] == "float32"
  # same ids as the library call with the chat template applied
  model = load_model(tiny_chat_dir)
  ids = encode_prompts(model.tokenizer, ["def add(a, b):", "Hello"], chat=True)
  assert ids == saved["prompt_ids"]
  assert model.tokenizer.decode(ids[0]).startswith("<|im_start|>user")
  lib = Decoder(model.params, model.config).generate(ids, max_new_tokens=7,
                                                     eos_token_ids=model.eos_token_ids)
  assert lib.tokens == saved["output_ids"]
  assert saved["texts"][0] in capsys.readouterr().out


def test_chat_template_variables_reach_the_template(tiny_thinking_dir):
  """--chat-kwarg KEY=VALUE renders the chat template with that variable (YAML-typed: false is
  the boolean), as Qwen3's `enable_thinking` switch needs; without --chat it is refused."""
  from transformers import AutoTokenizer

  d = tiny_thinking_dir
  tok = AutoTokenizer.from_pretrained(d)
  base = ["--target", str(d), "--prompt", "Hello", "--chat", "--max-new-tokens", "2", "--quiet"]
  plain = main(parse_args(base))["prompt_ids"][0]
  off = main(parse_args(base + ["--chat-kwarg", "enable_thinking=false"]))
  assert tok.decode(off["prompt_ids"][0]).endswith("<think></think>")
  assert not tok.decode(plain).endswith("</think>")
  on = main(parse_args(base + ["--chat-kwarg", "enable_thinking=true"]))["prompt_ids"][0]
  assert on == plain and off["settings"]["chat_template_kwargs"] == (("enable_thinking", False),)
  with pytest.raises(ValueError, match="--chat-kwarg enable_thinking=... sets a chat template "
                                       "variable: give --chat too"):
    parse_args(["--target", "x", "--prompt", "p", "--chat-kwarg", "enable_thinking=false"])
  with pytest.raises(ValueError, match="--chat-kwarg 'nothing': expected KEY=VALUE"):
    parse_args(["--target", "x", "--prompt", "p", "--chat", "--chat-kwarg", "nothing"])


def test_sampling_is_seeded(tiny_chat_dir):
  args = ["--target", str(tiny_chat_dir), "--prompt", "Hello", "--max-new-tokens", "12",
          "--temperature", "1.0", "--top-p", "0.95", "--quiet"]
  a = main(parse_args(args + ["--seed", "1"]))["output_ids"]
  b = main(parse_args(args + ["--seed", "1"]))["output_ids"]
  c = main(parse_args(args + ["--seed", "2"]))["output_ids"]
  assert a == b and a != c


@pytest.mark.parametrize("flags,message", [
    (["--temperature", "-1"], "temperature must be >= 0, got self.temperature=-1.0"),
    (["--top-p", "1.5"], "top_p must be in (0, 1], got self.top_p=1.5"),
    (["--max-new-tokens", "0"], "max_new_tokens must be > 0, got 0"),
    (["--max-len", "8"], "exceeds the cache length max_len=8"),
    (["--temperature", "inf"], "temperature must be finite"),
    (["--stop", ""], "stop strings must be non-empty"),
    (["--set", "candidates=2"], "method 'ar' has no parameter 'candidates'; it takes none"),
    (["--method", "pld", "--set", "candidates=0"], "1 <= candidates <= 4096"),
    (["--method", "pld", "--set", "gamma=three"], "--set gamma=three: expected int, got 'three'"),
    (["--method", "pld", "--set", "gamma"], "--set 'gamma': expected KEY=VALUE"),
    (["--method", "pld", "--set", "gamma=2", "--set", "gamma=3"],
     "--set gives ['gamma'] more than once"),
    (["--method", "crossvocab", "--draft", "d", "--set", "ngram=maybe"],
     "expected a boolean (true/false), got 'maybe'"),
    (["--method", "specvocab", "--draft", "d"], "method 'specvocab' needs parameter 'ranker'"),
    (["--method", "pld", "--time-split"], "--method pld has none"),
    (["--method", "pld", "--set", "sizing_table=8"],
     "pld.sizing_table='8': sizing table entry '8': expected BATCH:LENGTH"),
])
def test_cli_bad_input_exits_2_with_message(tiny_chat_dir, tmp_path, flags, message, capsys):
  """One `error:` line naming the value, exit 2, nothing written (in process: the `python -m`
  entry point itself is run by the non-UTF-8 prompt test below)."""
  from vocabjax.generate import cli

  out = tmp_path / "never.json"
  assert cli(["--target", str(tiny_chat_dir), "--prompt", "Hello there, a longer prompt",
              "--output", str(out), *flags]) == 2
  err = capsys.readouterr().err
  assert message in err and err.startswith("error: ") and err.count("\n") == 1, err
  assert not out.exists()


def test_every_registered_method_is_reachable_with_its_parameters_listed():
  """--method takes every registered method and --help lists each one's parameters (generated
  from its dataclass, so a new method or parameter shows up by itself)."""
  from vocabjax.generate import methods_help
  from vocabjax.methods import METHODS

  lines = {ln.split(":")[0].split()[0]: ln for ln in methods_help().splitlines()[1:]}
  assert set(lines) == set(METHODS) and len(METHODS) >= 11
  for name, m in METHODS.items():
    assert all(f"{k}{'' if k in m.defaults else '*'}: " in lines[name] for k in m.fields)
    required = {k: {int: "1", float: "0.5", bool: "true", str: "x"}[t]
                for k, t in m.fields.items() if k not in m.defaults}
    flags = ["--target", "t", "--prompt", "p", "--method", name,
             *[f for k, v in required.items() for f in ("--set", f"{k}={v}")]]
    flags += ["--draft", "d"] if m.needs_draft else []
    try:  # parse as far as the method's own value checks (files are checked at build time)
      cfg = parse_args(flags)
    except ValueError as e:
      assert "needs parameter" not in str(e) and "no parameter" not in str(e), (name, e)
    else:
      assert cfg.method == name and dict(cfg.params) == {
          k: {"1": 1, "0.5": 0.5, "true": True, "x": "x"}[v] for k, v in required.items()}


def test_timed_methods_are_the_decoders_that_time_their_steps(pair_models, tiny_medusa_dir):
  """The registry's `timed` (what --time-split accepts before loading anything) agrees with
  the decoders' own `times_step_parts`."""
  from vocabjax.methods import METHODS

  target, draft = pair_models
  built = {"ar": {}, "chain": {"gamma": 2}, "tree": {"top_k": 2, "depth": 2, "total_tokens": 3},
           "pld": {}, "medusa": {"heads": str(tiny_medusa_dir)}}
  for name, params in built.items():
    m = METHODS[name]
    dec = m.make(target, draft if m.needs_draft else None, params)
    assert dec.times_step_parts == m.timed, name


def test_the_python_api_refuses_a_draft_as_the_command_line_does(pair_models):
  """`METHODS[name].make` with a draft model for a method that takes none (it was left out
  without a word), or without one for a method that needs it: a ConfigError naming both."""
  from vocabjax.eval.config import ConfigError
  from vocabjax.methods import METHODS

  target, draft = pair_models
  for name in ("suffix", "pld", "ar"):
    with pytest.raises(ConfigError, match=f"method '{name}' takes no draft model"):
      METHODS[name].make(target, draft, {})
  with pytest.raises(ConfigError, match="method 'chain' needs a draft model"):
    METHODS["chain"].make(target, None, {"gamma": 2})
  with pytest.raises(ConfigError, match=r"method 'chain': params must be a mapping or a "
                                        r"ChainParams, got None"):
    METHODS["chain"].make(target, draft, None)
  with pytest.raises(ConfigError, match=r"chain.gamma must be int, got None"):
    METHODS["chain"].make(target, draft, {"gamma": None})


@pytest.fixture(scope="module")
def pair_models(tiny_chat_dir):
  m = load_model(tiny_chat_dir, dtype="float32")
  return m, m


@pytest.mark.extended(params=["method_flags1"])
@pytest.mark.parametrize("method_flags", [["--method", "chain", "--set", "gamma=3"],
                                          ["--method", "tree", "--set", "top_k=2",
                                           "--set", "depth=3", "--set", "total_tokens=5"]])
def test_speculative_methods_match_ar(tiny_chat_dir, tiny_dirs, tmp_path, method_flags):
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--prompt", "Hi",
          "--max-new-tokens", "12", "--quiet"]
  ar = main(parse_args(base))
  spec = main(parse_args(base + ["--draft", str(tiny_chat_dir), *method_flags, "--time-split",
                                 "--output", str(tmp_path / "s.json")]))
  assert spec["output_ids"] == ar["output_ids"]
  saved = json.loads((tmp_path / "s.json").read_text())
  if "chain" in method_flags:
    assert saved["speculative"]["acceptance_rate"] == 1.0  # drafter == target
  # (a tree proposes 5 nodes and accepts one path, so its rate is below 1)
  assert saved["speculative"]["tau"] > 1
  split = saved["speculative"]["time_split"]
  assert split["verification_s"] > 0 and split["drafter_head_s"] > 0
  assert split["decode_s"] == pytest.approx(split["drafter_s"] + split["drafter_head_s"]
                                            + split["verification_s"] + split["other_s"]
                                            - split["parts_excess_s"])
  assert split["other_s"] >= 0 and split["parts_excess_s"] >= 0


def test_batch_size_repeats_prompts(tiny_chat_dir):
  out = main(parse_args(["--target", str(tiny_chat_dir), "--prompt", "a", "--prompt", "b",
                         "--batch-size", "5", "--max-new-tokens", "3", "--quiet"]))
  assert len(out["output_ids"]) == 5 and out["prompt_ids"][0] == out["prompt_ids"][2]


def test_rows_decode_continuously_with_the_batched_outputs(tiny_chat_dir, tmp_path):
  """--rows 2 over three prompts, plain and speculative (prompt lookup): the batched outputs."""
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--prompt", "Hi",
          "--prompt", "Hello there, how are you today?", "--max-new-tokens", "9", "--quiet"]
  batched = main(parse_args(base))
  cont = main(parse_args(base + ["--rows", "2", "--output", str(tmp_path / "c.json")]))
  assert cont["output_ids"] == batched["output_ids"]
  assert cont["finish_reasons"] == batched["finish_reasons"]
  saved = json.loads((tmp_path / "c.json").read_text())
  assert saved["settings"]["rows"] == 2 and saved["timing"]["generated_tokens"] == sum(
      map(len, batched["output_ids"]))
  pld = main(parse_args(base + ["--rows", "2", "--method", "pld"]))
  assert pld["output_ids"] == batched["output_ids"]
  assert len(pld["speculative"]["accepted_per_step_row"][0]) == 2  # the stats' rows: cache rows


@pytest.mark.parametrize("flags,message", [
    (["--rows", "0"], "--rows must be >= 1, got 0"),
    (["--method", "pld", "--draft", "d"], "--method pld drafts without a drafter model"),
    (["--rows", "2", "--mesh", "data=2,model=1"], "a model-parallel mesh (data=1)"),
])
def test_rows_refuses_what_it_cannot_do(flags, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    parse_args(["--target", "x", "--prompt", "p", *flags])


def test_stream_prints_the_text_as_it_comes(tiny_chat_dir, capsys):
  """--stream: the text printed through transformers' TextStreamer, as the run's text (chain:
  an accepted block at once); the closing report line still goes to stderr."""
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--max-new-tokens", "12",
          "--draft", str(tiny_chat_dir), "--method", "chain", "--set", "gamma=3"]
  out = main(parse_args(base + ["--stream"]))
  printed = capsys.readouterr()
  assert printed.out.rstrip("\n") == out["texts"][0] and out["settings"]["stream"]
  assert "[vocabjax] chain: 12 tokens" in printed.err


@pytest.mark.parametrize("flags,message", [
    (["--stream", "--quiet"], "--stream prints the text as it comes and --quiet prints none"),
    (["--stream", "--prompt", "q"], "--stream prints one prompt's text; this run has 2 prompts"),
    (["--stream", "--batch-size", "3"], "this run has 3 prompts"),
    (["--stream", "--rows", "1"], "--stream prints one prompt's text as one row decodes it"),
])
def test_stream_refuses_what_it_cannot_print(flags, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    parse_args(["--target", "x", "--prompt", "p", *flags])


def test_method_needs_a_drafter():
  with pytest.raises(ValueError, match="--method chain needs --draft"):
    parse_args(["--target", "x", "--prompt", "p", "--method", "chain"])


def test_draft_vocab_subset(tiny_chat_dir, tmp_path):
  """--set subset=: a saved subset trims the drafter's head; output still equals AR; a subset
  counted with another tokenizer is refused."""
  import numpy as np

  from vocabjax.calibrate.counts import tokenizer_identity
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.vocab import VocabSubset

  tok = load_model(tiny_chat_dir).tokenizer
  V = 320
  good = VocabSubset(ids=np.arange(0, V, 3), vocab_size=V, tokenizer_id=tokenizer_identity(tok))
  good.save(tmp_path / "sub.npz")
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--max-new-tokens",
          "12", "--quiet"]
  ar = main(parse_args(base))
  chain = ["--draft", str(tiny_chat_dir), "--method", "chain", "--set", "gamma=4"]
  spec = main(parse_args(base + chain + ["--set", f"subset={tmp_path / 'sub.npz'}"]))
  assert spec["output_ids"] == ar["output_ids"]
  assert spec["speculative"]["acceptance_rate"] < 1.0  # drafter == target, but trimmed
  VocabSubset(ids=good.ids, vocab_size=V, tokenizer_id="vocab9-sha256:0").save(
      tmp_path / "other.npz")
  with pytest.raises(ValueError, match="counted with tokenizer 'vocab9-sha256:0'"):
    main(parse_args(base + chain + ["--set", f"subset={tmp_path / 'other.npz'}"]))
  with pytest.raises(ValueError, match="method 'ar' has no parameter 'subset'"):
    parse_args(base + ["--set", f"subset={tmp_path / 'sub.npz'}"])


def test_ranker_vocabulary(tiny_chat_dir, tmp_path):
  """--method specvocab: SpecVocab drafting from a ranker file; output equals AR; a ranker of
  another drafter is refused; k larger than the vocabulary is an error."""
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.testing.tiny import save_tiny_variant
  from vocabjax.vocab.ranked import svd_ranker

  m = load_model(tiny_chat_dir, dtype="float32")
  other = save_tiny_variant("qwen2_bias", tmp_path / "other", seed=5, with_tokenizer=True)
  svd_ranker(m.params, m.config, rank=4).save(tmp_path / "r.safetensors")
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--max-new-tokens",
          "12", "--quiet"]
  ar = main(parse_args(base))
  sv = ["--method", "specvocab", "--set", f"ranker={tmp_path / 'r.safetensors'}"]
  spec = main(parse_args(base + ["--draft", str(tiny_chat_dir), *sv, "--set", "k=8",
                                 "--set", "top_k=2", "--set", "depth=3",
                                 "--set", "total_tokens=5"]))
  assert spec["output_ids"] == ar["output_ids"]
  with pytest.raises(ValueError, match="trained for another drafter"):
    main(parse_args(base + ["--draft", str(other), *sv, "--set", "k=8"]))
  with pytest.raises(ValueError, match="specvocab.k=2048 exceeds the ranker's vocabulary of 320"):
    main(parse_args(base + ["--draft", str(tiny_chat_dir), *sv, "--set", "k=2048"]))
  with pytest.raises(ValueError, match="method 'specvocab' needs parameter 'k'"):
    parse_args(base + ["--draft", "d", *sv])


@pytest.mark.extended
def test_eagle_head(tiny_chat_dir, tmp_path):
  """--method eagle --set head=: tree drafting with an EAGLE-3 head directory; output equals
  AR with the head's own and the target's LM head (restricted by a ranker); a head for another
  target is refused; --method eagle without a head is an error."""
  import jax
  import numpy as np

  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.models.eagle import init_eagle
  from vocabjax.testing.tiny import save_tiny_variant
  from vocabjax.train.eagle_step import head_config
  from vocabjax.train.features import model_identity
  from vocabjax.vocab.ranked import svd_ranker

  m = load_model(tiny_chat_dir, dtype="float32")
  hc = head_config(m.config, (0, 1), 40)
  p = init_eagle(jax.random.key(0), hc, scale=0.2)
  p["d2t"] = jax.numpy.asarray(np.arange(0, 120, 3) - np.arange(40))
  head = save_eagle3(p, hc, tmp_path / "head", target=model_identity(m))
  svd_ranker(m.params, m.config, rank=4).save(tmp_path / "r.safetensors")
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--max-new-tokens",
          "12", "--quiet"]
  ar = main(parse_args(base))
  eagle = ["--method", "eagle", "--set", f"head={head}", "--set", "top_k=2", "--set",
           "depth=3", "--set", "total_tokens=5"]
  spec = main(parse_args(base + eagle))
  assert spec["output_ids"] == ar["output_ids"] and spec["speculative"]["tau"] >= 1
  spec = main(parse_args(base + eagle + ["--set", "lm_head=target", "--set",
                                         f"ranker={tmp_path / 'r.safetensors'}", "--set",
                                         "k=8"]))
  assert spec["output_ids"] == ar["output_ids"]
  # gated by the head's confidence: the record says in how many steps the head drafted
  spec = main(parse_args(base + eagle + ["--set", "min_confidence=0.999"]))
  assert spec["output_ids"] == ar["output_ids"]
  assert spec["speculative"]["head_steps"] == 0 and spec["speculative"]["tau"] == 1.0
  with pytest.raises(ValueError, match="min_confidence=1.5 must lie in"):
    parse_args(base + eagle + ["--set", "min_confidence=1.5"])
  other = save_tiny_variant("qwen2_bias", tmp_path / "other", seed=5, with_tokenizer=True)
  with pytest.raises(ValueError, match="was trained for another target"):
    main(parse_args(["--target", str(other), *base[2:], *eagle]))
  with pytest.raises(ValueError, match="method 'eagle' needs parameter 'head'"):
    parse_args(base + ["--method", "eagle"])
  with pytest.raises(ValueError, match="method 'pld' has no parameter 'min_confidence'"):
    parse_args(base + ["--method", "pld", "--set", "min_confidence=0.3"])


@pytest.mark.extended
def test_medusa_heads(tiny_chat_dir, tiny_medusa_dir, tmp_path):
  """--method medusa --set heads=: a chain of the heads' top-1 tokens, a JSON tree, and the
  heads restricted by a subset all equal AR; heads for another target and a tree deeper than
  the heads are refused."""
  import numpy as np

  from vocabjax.calibrate.counts import tokenizer_identity
  from vocabjax.testing.tiny import save_tiny_variant
  from vocabjax.vocab.subset import VocabSubset

  m = load_model(tiny_chat_dir, dtype="float32")
  heads = tiny_medusa_dir
  VocabSubset(np.arange(0, m.config.vocab_size, 2), m.config.vocab_size,
              tokenizer_id=tokenizer_identity(m.tokenizer)).save(tmp_path / "sub.npz")
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--max-new-tokens",
          "12", "--quiet"]
  ar = main(parse_args(base))
  med = ["--method", "medusa", "--set", f"heads={heads}"]
  for extra in ([], ["--set", "choices=[[0], [1], [0, 0], [1, 0]]"],
                ["--set", "top_k=2", "--set", f"subset={tmp_path / 'sub.npz'}"]):
    spec = main(parse_args(base + med + extra))
    assert spec["output_ids"] == ar["output_ids"] and spec["speculative"]["tau"] >= 1
  other = save_tiny_variant("qwen2_bias", tmp_path / "other", seed=5, with_tokenizer=True)
  with pytest.raises(ValueError, match="trained for another target"):
    main(parse_args(["--target", str(other), *base[2:], *med]))
  with pytest.raises(ValueError, match=r"medusa.choices: .*3 deep but there are 2 heads"):
    parse_args(base + med + ["--set", "choices=[[0], [0, 0], [0, 0, 0]]"])
  with pytest.raises(ValueError, match="method 'medusa' needs parameter 'heads'"):
    parse_args(base + ["--method", "medusa"])


@pytest.mark.extended
def test_crossvocab_method_with_another_tokenizer(tiny_chat_dir, tmp_path):
  """--method crossvocab: a drafter with its own trained tokenizer; output = AR, n-gram stats
  (the run without n-grams in continuous batching: one row decoding both prompts in turn)."""
  from vocabjax.testing.tiny import tiny_hf_model, tiny_tokenizer

  tok = tiny_tokenizer(340, corpus=["The lazy dog sleeps while the quick fox runs.",
                                    "def mul(a, b):\n    return a * b\n"] * 20)
  d = tmp_path / "drafter"
  tiny_hf_model("llama", seed=5, vocab_size=len(tok)).save_pretrained(d)
  tok.save_pretrained(d)
  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--prompt", "Hi",
          "--max-new-tokens", "12", "--quiet"]
  ar = main(parse_args(base))
  for extra in ([], ["--set", "ngram=false", "--rows", "1"]):
    out = main(parse_args(base + ["--draft", str(d), "--method", "crossvocab", "--set",
                                  "gamma=3", *extra]))
    assert out["output_ids"] == ar["output_ids"]
    sp = out["speculative"]
    assert {"ngram_drafted", "drafter_tokens", "ngram_cache"} <= set(sp) and sp["tau"] >= 1
  with pytest.raises(ValueError, match="adaptive"):
    parse_args(base + ["--draft", str(d), "--method", "crossvocab", "--set", "adaptive=true"])
  with pytest.raises(ValueError, match="method 'chain' has no parameter 'ngram'"):
    parse_args(base + ["--draft", str(d), "--method", "chain", "--set", "ngram=false"])


def test_pld_and_a_bf16_drafter_from_the_command_line(tiny_chat_dir):
  base = ["--target", str(tiny_chat_dir), "--prompt", "a b c a b c a b", "--max-new-tokens",
          "12", "--quiet"]
  ar = main(parse_args(base))["output_ids"]
  pld = main(parse_args(base + ["--method", "pld", "--set", "gamma=3", "--set", "max_ngram=2"]))
  assert pld["output_ids"] == ar and pld["speculative"]["tau"] >= 1.0
  assert pld["speculative"]["verifications"] == pld["speculative"]["target_forwards"] - 1
  tree = main(parse_args(base + ["--method", "pld", "--set", "gamma=3", "--set", "candidates=3"]))
  assert tree["output_ids"] == ar
  chain = main(parse_args(base + ["--method", "chain", "--set", "gamma=4", "--draft",
                                  str(tiny_chat_dir), "--draft-dtype", "bf16"]))
  assert chain["output_ids"] == ar  # the f32 target verifies a bf16 drafter


@pytest.mark.parametrize("module", ["vocabjax.generate", "vocabjax.eval.__main__"])
def test_every_command_line_option_has_help(module, monkeypatch):
  """`--help` explains every option of generate and eval (none is a bare flag name)."""
  import argparse
  import importlib

  class Built(Exception):
    pass

  def capture(self, *a, **k):
    raise Built(self)

  monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
  with pytest.raises(Built) as e:
    importlib.import_module(module).parse_args([])
  parser = e.value.args[0]
  bare = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
  assert bare == []


def test_the_readme_test_command_prints_a_summary_line(tmp_path):
  """The README's `python -m pytest -q ...` ends with pytest's count line (the config's addopts
  must not add a second -q, which hides it)."""
  from pathlib import Path

  root = Path(__file__).resolve().parents[1]
  (tmp_path / "test_one.py").write_text("def test_ok():\n  assert True\n")
  out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(root / "setup.cfg"),
                        "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "1 passed" in out.stdout.splitlines()[-1]


@pytest.mark.parametrize("kind", ["directory", "missing_parent", "parent_is_file", "read_only"])
def test_bad_output_path_is_refused_before_loading(tmp_path, kind, monkeypatch):
  """--output that cannot take the result fails at parse time (before any model is loaded),
  naming the path; a read-only file is kept as it was."""
  import vocabjax.generate as gen

  target = {"directory": tmp_path, "missing_parent": tmp_path / "no" / "o.json",
            "parent_is_file": tmp_path / "f.txt" / "o.json",
            "read_only": tmp_path / "ro.json"}[kind]
  (tmp_path / "f.txt").write_text("x")
  if kind == "read_only":
    target.write_text("keep")
    target.chmod(0o444)
  monkeypatch.setattr(gen, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
  with pytest.raises(ValueError, match={"directory": "is a directory",
                                        "missing_parent": "does not exist",
                                        "parent_is_file": "it is a file",
                                        "read_only": "is read-only"}[kind]):
    gen.main(parse_args(["--target", "none", "--prompt", "x", "--output", str(target)]))
  if kind == "read_only":
    assert target.read_text() == "keep" and (target.stat().st_mode & 0o777) == 0o444


@pytest.mark.extended
def test_a_prompt_that_is_not_utf8_is_refused_with_its_bytes(tiny_chat_dir, tmp_path):
  """Bytes that are not UTF-8 on the command line: exit 2 naming them, not a traceback."""
  import os

  out = tmp_path / "never.json"
  proc = subprocess.run([os.fsencode(sys.executable), b"-m", b"vocabjax.generate", b"--target",
                         os.fsencode(tiny_chat_dir), b"--prompt", b"caf\xe9 latin-1",
                         b"--output", os.fsencode(out)], capture_output=True)
  err = proc.stderr.decode("utf-8", "replace")
  assert proc.returncode == 2, err
  assert "prompt 0 is not valid UTF-8 (bytes b'\\xe9'" in err and "Traceback" not in err
  assert not out.exists()


@pytest.mark.extended
def test_mesh_flag(tiny_chat_dir):
  """--mesh data=D,model=M: the same greedy ids as one device for AR and chain drafting (8
  virtual devices); a malformed shape and one that does not match the devices are refused by
  name. The flag reaches every method through one call (`method.make(..., mesh)`); each
  method on a mesh is tests/decoding/test_sharded_speculative.py's (prompt lookup and
  cross-vocabulary drafting here too cost ~8 s of a 2-core run and checked the same call)."""
  target = draft = tiny_chat_dir
  base = ["--target", str(target), "--prompt", "def add(a, b):", "--prompt", "x = 1",
          "--max-new-tokens", "10", "--quiet"]
  ar = main(parse_args(base))
  for flags in (["--mesh", "model=8"], ["--mesh", "data=2,model=4", "--method", "chain",
                                        "--draft", str(draft), "--set", "gamma=3"]):
    assert main(parse_args(base + flags))["output_ids"] == ar["output_ids"], flags
  with pytest.raises(ValueError, match=r"mesh .data=2,tensor=4.: expected data=D,model=M"):
    parse_args(base + ["--mesh", "data=2,tensor=4"])
  with pytest.raises(ValueError, match=r"mesh data=3 x model=2 does not match 8 devices"):
    main(parse_args(base + ["--mesh", "data=3,model=2"]))


@pytest.mark.extended
def test_chat_template_failures_and_reserved_variables_are_one_line(tiny_chat_dir, tmp_path):
  """A hostile chat template (stopped by transformers' sandbox), one that fails to render, and
  template variables named like apply_chat_template's own arguments are each one `error:`
  line naming the cause (before: a Jinja traceback; `messages=` replaced the conversation)."""
  import shutil
  import subprocess

  from transformers import AutoTokenizer

  d = tmp_path / "m"
  shutil.copytree(tiny_chat_dir, d)
  tok = AutoTokenizer.from_pretrained(d)
  cases = {
      "{{ ''.__class__.__mro__[1].__subclasses__() }}": "refused by transformers' sandbox",
      "{{ messages[0]['content'] | no_such_filter }}": "failed to render",
  }
  for template, words in cases.items():
    tok.chat_template = template
    tok.save_pretrained(d)
    r = subprocess.run([sys.executable, "-m", "vocabjax.generate", "--target", str(d),
                        "--prompt", "hi", "--chat"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the tokenizer's chat template ") and words in last, last
  for name in ("messages", "tokenize", "add_generation_prompt"):
    with pytest.raises(ValueError, match=rf"\['{name}'\] are apply_chat_template's own"):
      main(parse_args(["--target", str(tiny_chat_dir), "--prompt", "hi", "--chat",
                       "--chat-kwarg", f"{name}=1", "--quiet"]))


@pytest.mark.parametrize("method", ["chain", "tree", "pld"])
def test_the_drafting_methods_run_with_no_set(tiny_chat_dir, method):
  """chain, tree and prompt lookup run with their defaults (the default suite's: gamma 3; a
  tree of top-k 2, depth 4, 8 nodes; lookup gamma 4), shown by --help (before: `--method chain`
  failed with "needs parameter 'gamma'")."""
  from vocabjax.methods import METHODS

  base = ["--target", str(tiny_chat_dir), "--prompt", "def add(a, b):", "--max-new-tokens",
          "8", "--quiet"]
  draft = ["--draft", str(tiny_chat_dir)] if METHODS[method].needs_draft else []
  out = main(parse_args(base + ["--method", method, *draft]))
  assert out["output_ids"] == main(parse_args(base))["output_ids"]
  assert METHODS[method].parse({}, "test") == METHODS[method].params()
