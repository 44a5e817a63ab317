"""The newer vocabulary methods through the registry, from the files their commands make
(`calibrate count`, `calibrate select --coverage-latency`, `calibrate index`, a router, low-rank
factors) on a tiny chat model pair: greedy output equals plain decoding; bad files and settings
are one-line errors."""

import numpy as np
import pytest

from vocabjax.calibrate import CountJob, run_count
from vocabjax.calibrate.__main__ import main as calibrate
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder
from vocabjax.errors import ConfigError
from vocabjax.methods import METHODS
from vocabjax.models.identity import drafter_identity
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.testing.tiny import save_tiny_variant
from vocabjax.vocab.clustered import ClusterRouter, fit_clusters
from vocabjax.vocab.incontext import InContextError, load_index
from vocabjax.vocab.ranked import svd_ranker

from tests.helpers.train import write_completions

DOCS = ["def f(x):\n    return x + 1\n", "the quick brown fox jumps", "import os\nprint(os.sep)\n"]


@pytest.fixture(scope="module")
def files(tiny_chat_dir, tmp_path_factory):
  """A drafter of the target's tokenizer, counts, completions and each method's files."""
  root = tmp_path_factory.mktemp("newer")
  draft_dir = save_tiny_variant("qwen2_bias", root / "draft", seed=4, with_tokenizer=True)
  (root / "corpus").mkdir()
  for i, t in enumerate(DOCS):
    (root / "corpus" / f"d{i}.py").write_text(t)
  run_count(CountJob(model=str(tiny_chat_dir), out=str(root / "c"), text=(str(root / "corpus"),)),
            progress=False)
  comp = write_completions(tiny_chat_dir, root / "generated.jsonl", n=6, max_new_tokens=10)
  counts = root / "c" / "counts.npz"
  assert calibrate(["index", str(comp), "--model", str(tiny_chat_dir), "--counts", str(counts),
                    "--core", "16", "--n", "2", "--out", str(root / "idx.npz")]) == 0
  assert calibrate(["select", str(counts), "--model", str(tiny_chat_dir), "--coverage-latency",
                    "--drafter", str(draft_dir), "--k-min", "8", "--out",
                    str(root / "cl.npz")]) == 0
  draft = load_model(draft_dir, dtype="float32")
  members = fit_clusters(np.asarray(lm_head_weight(draft.params, draft.config)), 8, iters=2)
  rs = np.random.RandomState(0)
  ClusterRouter(members, rs.randn(8, draft.config.hidden_size).astype(np.float32),
                np.zeros(8, np.float32), drafter_identity(draft.params, draft.config)
                ).save(root / "router.safetensors")
  svd_ranker(draft.params, draft.config, 8).save(root / "factors.safetensors")
  return {"draft": draft, "counts": str(counts), "index": str(root / "idx.npz"),
          "subset": str(root / "cl.npz"), "router": str(root / "router.safetensors"),
          "factors": str(root / "factors.safetensors"), "completions": str(comp)}


CASES = {
    "microspec": lambda f: {"counts": f["counts"], "core": 16, "window": 24},
    "evospec": lambda f: {"counts": f["counts"], "index": f["index"], "base": 16, "window": 24},
    "dynaspec": lambda f: {"router": f["router"], "top": 2},
    "slimspec": lambda f: {"factors": f["factors"]},
    "covtrim": lambda f: {"subset": f["subset"]},
}


@pytest.mark.extended(params=["covtrim-tree", "evospec-tree", "microspec-tree", "dynaspec-tree"])
@pytest.mark.parametrize("depth", [0, 2], ids=["chain", "tree"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_registry_methods_decode_as_plain_greedy(tiny_chat_dir, files, name, depth):
  target = load_model(tiny_chat_dir, dtype="float32")
  prompts = [target.tokenizer("def add(a, b):")["input_ids"], target.tokenizer("Hi")["input_ids"]]
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=12)
  shape = {"top_k": 2, "depth": 2, "total_tokens": 4} if depth else {"gamma": 3}
  dec = METHODS[name].make(target, files["draft"], {**CASES[name](files), **shape})
  assert dec.generate(prompts, max_new_tokens=12).tokens == ar.tokens


def test_index_records_its_tokenizer_and_core(tiny_chat_dir, files, tmp_path, capsys):
  target = load_model(tiny_chat_dir, dtype="float32")
  idx = load_index(files["index"], vocab_size=target.config.vocab_size)
  assert idx.shape == (target.config.vocab_size, 2) and (idx[:, 0] >= 0).any()
  with pytest.raises(InContextError, match="was counted with tokenizer"):
    load_index(files["index"], tokenizer_id="vocab9-sha256:feed")
  with pytest.raises(InContextError, match="indexes a vocabulary of"):
    load_index(files["index"], vocab_size=7)
  bad = tmp_path / "bad.npz"
  bad.write_bytes(b"not a zip")
  with pytest.raises(InContextError, match="not a readable successor index"):
    load_index(bad)
  empty = tmp_path / "empty.jsonl"
  empty.write_text("")
  assert calibrate(["index", str(empty), "--model", str(tiny_chat_dir), "--counts",
                    files["counts"], "--core", "16", "--out", str(tmp_path / "i.npz")]) == 2
  assert "empty calibration set" in capsys.readouterr().err


def test_bad_settings_name_the_value(tiny_chat_dir, files):
  target = load_model(tiny_chat_dir, dtype="float32")
  cases = [
      ("microspec", {"counts": files["counts"], "window": 0}, "window=0"),
      ("evospec", {"counts": files["counts"], "index": "/no/such.npz", "base": 16,
                   "window": 8},
       "evospec.index='/no/such.npz': no such file"),
      ("dynaspec", {"router": files["router"], "top": 9}, r"top=9 clusters must be in \[1, C=8\]"),
      ("dynaspec", {"router": files["factors"]}, "not a vocabjax router file"),
      ("slimspec", {"factors": files["router"]}, "not a readable ranker file"),
      ("covtrim", {"subset": "/no/such.npz"}, "no such file"),
  ]
  for name, params, message in cases:
    with pytest.raises(ConfigError, match=message):
      METHODS[name].make(target, files["draft"], params)
  vt = tiny_chat_dir.parent / "vt.npz"
  assert calibrate(["select", files["counts"], "--model", str(tiny_chat_dir), "--k", "20",
                    "--out", str(vt)]) == 0
  with pytest.raises(ConfigError, match="not by coverage and latency"):
    METHODS["covtrim"].make(target, files["draft"], {"subset": str(vt)})


@pytest.fixture(scope="module")
def head_dir(tiny_chat_dir, tmp_path_factory):
  """An untrained EAGLE-3 head over the tiny chat model's whole vocabulary."""
  import jax

  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.models.eagle import init_eagle
  from vocabjax.train.eagle_step import head_config
  from vocabjax.train.features import model_identity

  m = load_model(tiny_chat_dir, dtype="float32")
  hc = head_config(m.config, (0, 1), m.config.vocab_size)
  p = init_eagle(jax.random.key(1), hc, scale=0.2)
  p["d2t"] = jax.numpy.zeros((m.config.vocab_size,), jax.numpy.int32)
  return save_eagle3(p, hc, tmp_path_factory.mktemp("head") / "head", target=model_identity(m))


@pytest.mark.parametrize("vocab", [
    "microspec:counts={counts},core=16,window=24",
    "evospec:counts={counts},index={index},base=16,window=24",
    "covtrim:subset={subset}"], ids=["microspec", "evospec", "covtrim"])
def test_an_eagle_head_drafts_under_the_newer_policies(tiny_chat_dir, files, head_dir, vocab):
  target = load_model(tiny_chat_dir, dtype="float32")
  prompts = [target.tokenizer("def add(a, b):")["input_ids"], target.tokenizer("Hi")["input_ids"]]
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=12)
  spec = vocab.format(**files)
  params = {"head": str(head_dir), "lm_head": "target", "top_k": 2, "depth": 2,
            "total_tokens": 4, "vocab": spec}
  dec = METHODS["eagle"].make(target, None, params)
  assert type(dec.proposer.draft_vocab).__name__ in ("InContextVocab", "VocabSubset")
  assert dec.generate(prompts, max_new_tokens=12).tokens == ar.tokens
  name = spec.split(":")[0]
  want = {"microspec": 16 + 24, "evospec": 16 + 24}.get(name)
  assert METHODS["eagle"].head_rows(METHODS["eagle"].parse(params, "t")) == (
      want or len(np.load(files["subset"])["d2t"]))
  with pytest.raises(ConfigError, match="a subset, a ranker or a vocab policy, one of them"):
    METHODS["eagle"].make(target, None, {**params, "subset": files["subset"]})
  with pytest.raises(ConfigError, match="names no head policy"):
    METHODS["eagle"].make(target, None, {**params, "vocab": "vocabtrim:k=3"})


def test_an_eagle_head_under_a_router_and_factors_of_its_head(tiny_chat_dir, files, head_dir,
                                                              tmp_path):
  """DynaSpec and SlimSpec on an EAGLE head drafting through the target's head: a router and
  factors made for that head (the identity `train.router` / `train.ranker` give a head's
  files) draft losslessly; the 0.5B-style drafter's router is refused by the head."""
  from vocabjax.train.ranker import head_drafter_identity
  from vocabjax.vocab.ranked import Ranker, svd_of_head

  target = load_model(tiny_chat_dir, dtype="float32")
  rows = np.asarray(lm_head_weight(target.params, target.config))
  ident = head_drafter_identity(target, {"lm_head": rows})
  members = fit_clusters(rows, 8, iters=2)
  rs = np.random.RandomState(1)
  ClusterRouter(members, rs.randn(8, target.config.hidden_size).astype(np.float32),
                np.zeros(8, np.float32), ident).save(tmp_path / "router.safetensors")
  r = svd_of_head(rows, 8)
  Ranker(down=r.down, vocab=r.vocab, drafter=ident).save(tmp_path / "factors.safetensors")
  prompts = [target.tokenizer("def add(a, b):")["input_ids"], target.tokenizer("Hi")["input_ids"]]
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=12)
  base = {"head": str(head_dir), "lm_head": "target", "top_k": 2, "depth": 2,
          "total_tokens": 4}
  for vocab, kind in ((f"dynaspec:router={tmp_path / 'router.safetensors'},top=2",
                       "ClusteredVocab"),
                      (f"slimspec:factors={tmp_path / 'factors.safetensors'}", "LowRankHead")):
    dec = METHODS["eagle"].make(target, None, {**base, "vocab": vocab})
    assert type(dec.proposer.draft_vocab).__name__ == kind
    assert dec.generate(prompts, max_new_tokens=12).tokens == ar.tokens
  from vocabjax.vocab.clustered import RouterError

  with pytest.raises(RouterError, match="the router was fitted for another drafter"):
    METHODS["eagle"].make(target, None, {**base,
                                         "vocab": f"dynaspec:router={files['router']},top=2"})


def test_coverage_latency_weighs_an_eagle_heads_cost(tiny_chat_dir, files, head_dir, tmp_path,
                                                    capsys):
  """`calibrate select --coverage-latency --drafter HEAD --head`: the cost per drafted token is
  the head's one layer and fc (`EagleConfig.num_params`), far below a model drafter's, so k*
  is the rule's argmax at that cost; the subset drafts losslessly on the head; --head without
  --coverage-latency, or on a directory that is no head, is one line."""
  from vocabjax.calibrate.select import drafter_body_rows
  from vocabjax.checkpoints.eagle2 import load_head_config
  from vocabjax.vocab.subset import VocabSubset, coverage_latency

  out = tmp_path / "head_cl.npz"
  assert calibrate(["select", files["counts"], "--model", str(tiny_chat_dir), "--coverage-latency",
                    "--drafter", str(head_dir), "--head", "--k-min", "8", "--out",
                    str(out)]) == 0
  sub = VocabSubset.load(out)
  meta = dict(sub.meta)
  hc = load_head_config(head_dir)
  assert meta["body_rows"] == drafter_body_rows(hc) == -(-hc.num_params(head_rows=0)
                                                        // hc.hidden_size)
  from vocabjax.calibrate import Counts

  want = coverage_latency(Counts.load(files["counts"]).counts, body_rows=meta["body_rows"],
                          k_min=8)
  assert sub.size == want["k"] and meta["drafter_kind"] == "head"
  target = load_model(tiny_chat_dir, dtype="float32")
  prompts = [target.tokenizer("def add(a, b):")["input_ids"]]
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=12)
  dec = METHODS["eagle"].make(target, None, {"head": str(head_dir), "lm_head": "target",
                                             "top_k": 1, "depth": 3, "total_tokens": 3,
                                             "vocab": f"covtrim:subset={out}"})
  assert dec.generate(prompts, max_new_tokens=12).tokens == ar.tokens
  capsys.readouterr()
  assert calibrate(["select", files["counts"], "--model", str(tiny_chat_dir), "--k", "8",
                    "--head", "--out", str(tmp_path / "x.npz")]) == 2
  assert "--head says what --drafter is for --coverage-latency" in capsys.readouterr().err
  assert calibrate(["select", files["counts"], "--model", str(tiny_chat_dir), "--coverage-latency",
                    "--drafter", str(tmp_path), "--head", "--out",
                    str(tmp_path / "y.npz")]) == 2
  assert "is not a readable EAGLE head" in capsys.readouterr().err


def test_the_comparison_suites_parse_and_differ_only_where_they_say():
  """vocab_methods.yaml names every vocabulary method of the registry (but OmniDraft's, whose
  drafter has another tokenizer) with parameters its dataclass takes, vocab_methods_all both
  suites' methods and OmniDraft's with its own drafter; the two sampled suites
  differ only in draft_in_set (and name), each beside plain decoding."""
  import yaml

  from vocabjax.prompts import EVAL_CONFIG_DIR

  def suite(name):
    return yaml.safe_load((EVAL_CONFIG_DIR / f"{name}.yaml").read_text())

  full = suite("vocab_methods")
  kinds = {m["method"] for m in full["methods"]}
  assert kinds >= {"ar", "chain", "vocabtrim", "frspec", "specvocab", *CASES}
  for m in full["methods"]:
    params = {k: v for k, v in m.items() if k not in ("name", "method")}
    METHODS[m["method"]].parse(params, m["name"], check_files=False)
  # on an EAGLE head over the target's full head: every head policy, the seeds' subsets and
  # ranker, each parameter one the head method takes
  from vocabjax.methods.vocab import HEAD_POLICIES

  eagle = suite("vocab_methods_eagle")
  policies = set()
  for m in eagle["methods"]:
    params = {k: v for k, v in m.items() if k not in ("name", "method")}
    METHODS[m["method"]].parse(params, m["name"], check_files=False)
    policies.add(params.get("vocab", "").partition(":")[0])
  assert policies >= set(HEAD_POLICIES)
  assert {m["method"] for m in eagle["methods"]} == {"ar", "eagle"}
  assert any("subset" in m for m in eagle["methods"]) and any("ranker" in m
                                                              for m in eagle["methods"])
  # the combined suite: both suites' methods in one run (drafter `d_`, head `e_`) and
  # OmniDraft with its own drafter of another tokenizer, the same decoding settings
  from vocabjax.eval.config import config_from_dict

  every = suite("vocab_methods_all")
  strip_name = lambda m, p: {**m, "name": m["name"].removeprefix(p)}  # noqa
  rest = [m for m in every["methods"] if m["method"] != "ar"]
  assert [strip_name(m, "d_") for m in rest if m["name"].startswith("d_")
          and m["method"] != "crossvocab"] == full["methods"][1:]
  assert [strip_name(m, "e_") for m in rest if m["name"].startswith("e_")] == eagle["methods"][1:]
  omni = [m for m in rest if m["method"] == "crossvocab"]
  assert len(omni) == 1 and omni[0]["draft"] != every["draft"]
  assert {k: v for k, v in every.items() if k not in ("name", "methods")} == {
      k: v for k, v in full.items() if k not in ("name", "methods")}
  cfg = config_from_dict(every, name="vocab_methods_all", check_files=False)
  assert [m.draft for m in cfg.methods if m.method == "crossvocab"] == [omni[0]["draft"]]
  within, outside = suite("vocab_methods_t07"), suite("vocab_methods_t07_outside")
  assert within["draft_in_set"] is True and outside["draft_in_set"] is False
  assert within["temperature"] == 0.7 and within["top_p"] == 0.9
  strip = lambda d: {k: v for k, v in d.items() if k not in ("name", "draft_in_set")}  # noqa
  assert strip(within) == strip(outside) and within["methods"][0]["method"] == "ar"


def test_a_hybrid_carries_its_heads_row_state(tiny_chat_dir, files, head_dir):
  """eagle_pld (the head's tree merged with prompt lookup's trie) under MicroSpec: the engine
  finds the row-state policy inside the hybrid; greedy output is plain decoding's."""
  target = load_model(tiny_chat_dir, dtype="float32")
  prompts = [target.tokenizer("def add(a, b): return a + b\ndef add(")["input_ids"]]
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=12)
  dec = METHODS["eagle_pld"].make(target, None, {
      "head": str(head_dir), "lm_head": "target", "top_k": 2, "depth": 2, "total_tokens": 4,
      "vocab": f"microspec:counts={files['counts']},core=16,window=24"})
  assert dec.generate(prompts, max_new_tokens=12).tokens == ar.tokens
