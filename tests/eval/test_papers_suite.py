"""The papers' suite (configs/eval/papers*.yaml) cannot rot: it parses, and every method in it
builds and runs on tiny models with greedy identity, each file it names (EAGLE heads, subsets,
counts, rankers) replaced by a tiny stand-in of the same kind. A method added to the suite with a
file that has no stand-in here fails the test by name."""

import json

import jax
import numpy as np
import pytest
import yaml

from vocabjax.calibrate.select import load_or_select
from vocabjax.eval import load_config
from vocabjax.eval.__main__ import main, parse_args
from vocabjax.prompts import EVAL_CONFIG_DIR

from tests.helpers.eval import QUESTIONS

K_STANDIN = {"vocabtrim": 48, "frspec": 48, "specvocab": 32, "eagle": 32}  # k within V = 320
FILE_KEYS = ("head", "subset", "counts", "ranker")
SWEEP = {4096: 16, 8192: 24, 16384: 32, 65536: 64}  # FR-Spec's sweep K -> its stand-in's k


def _suite_dict(name):
  return yaml.safe_load((EVAL_CONFIG_DIR / f"{name}.yaml").read_text())


# what the papers' comparison asks of every suite: plain decoding; the full-vocabulary head
# (chain, tree); VocabTrim and FR-Spec 32K on it; EAGLE-3's 32K head; SpecVocab k = 512-2048
# on it; the 0.5B drafter full / VocabTrim / FR-Spec / SpecVocab
REQUIRED = ("ar", "full_chain", "full_tree", "full_vt32k", "full_fr32k", "full_sv512",
            "full_sv1024", "full_sv2048", "eagle3_32k", "lm_chain_g3", "lm_vt32k", "lm_fr32k",
            "lm_sv1024")


def test_the_three_suites_share_their_methods():
  """papers_small is papers.yaml on fewer questions; papers_t1 is it at temperature 1 over
  seeds, on the required methods (the greedy suites' extras left out), each as in papers."""
  full = _suite_dict("papers")
  assert full["temperature"] == 0.0
  d = _suite_dict("papers_small")
  assert d["methods"] == full["methods"] and d["target"] == full["target"]
  t1 = _suite_dict("papers_t1")
  assert t1["temperature"] == 1.0 and len(t1["seeds"]) >= 3 and t1["target"] == full["target"]
  assert [m["name"] for m in t1["methods"]] == list(REQUIRED)
  by = {m["name"]: m for m in full["methods"]}
  assert all(m == by[m["name"]] for m in t1["methods"])
  names = [m["name"] for m in full["methods"]]
  assert names[0] == "ar" and len(set(names)) == len(names)


@pytest.fixture(scope="module")
def full_head_dir(tiny_chat_dir, tmp_path_factory):
  """An untrained EAGLE-3 head for the tiny chat model over its whole vocabulary (the papers'
  full-vocabulary head: draft_vocab_size = V, d2t the identity)."""
  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.models.eagle import init_eagle
  from vocabjax.train.eagle_step import head_config
  from vocabjax.train.features import model_identity

  m = load_model(tiny_chat_dir, dtype="float32")
  hc = head_config(m.config, (0, 1), m.config.vocab_size)
  p = init_eagle(jax.random.key(1), hc, scale=0.2)
  p["d2t"] = jax.numpy.zeros((m.config.vocab_size,), jax.numpy.int32)
  return save_eagle3(p, hc, tmp_path_factory.mktemp("fullhead") / "head",
                     target=model_identity(m))


def _standins(counts, head_dir, full_head_dir, ranker_file, tiny_chat_dir):  # noqa: F811
  """Real path in the suite -> its tiny stand-in."""
  from vocabjax.checkpoints.loader import load_model

  text, gen = counts
  m = load_model(tiny_chat_dir, dtype="float32")
  for c in (text, gen):  # the subset files the EAGLE methods name
    load_or_select(c, m.tokenizer, m.config.vocab_size, k=48)
  for k in SWEEP.values():  # FR-Spec's sweep: growing stand-ins for 4K .. 64K
    load_or_select(text, m.tokenizer, m.config.vocab_size, k=k)
  cal = "train/calibration"
  return {
      **{f"{cal}/stdlib_code/subset-k{real}.npz": text.parent / f"subset-k{k}.npz"
         for real, k in SWEEP.items()},
      "train/eagle/papers/fullvocab/head": full_head_dir,
      "train/eagle/papers/v32k/head": head_dir,
      f"{cal}/target_generated/subset-k32768.npz": gen.parent / "subset-k48.npz",
      f"{cal}/stdlib_code/subset-k32768.npz": text.parent / "subset-k48.npz",
      f"{cal}/target_generated/counts.npz": gen,
      f"{cal}/stdlib_code/counts.npz": text,
      "train/ranker/d56_tied/ranker.safetensors": ranker_file,
      # the target's own SVD ranker stands in for the full head's (its LM head is the target's)
      "train/ranker/papers/d96/ranker.safetensors": ranker_file,
      "train/ranker/papers/d192/ranker.safetensors": ranker_file,
      "train/ranker/papers/d96_tied/ranker.safetensors": ranker_file,
  }


@pytest.mark.extended
def test_every_method_builds_and_keeps_greedy_output(counts, head_dir, full_head_dir,  # noqa: F811
                                                     ranker_file, tmp_path, tiny_chat_dir):
  d = _suite_dict("papers")
  swap = _standins(counts, head_dir, full_head_dir, ranker_file, tiny_chat_dir)
  methods = []
  for m in d["methods"]:
    m = dict(m)
    for key in FILE_KEYS:
      if key in m:
        assert m[key] in swap, f"method {m['name']}: no tiny stand-in for {key}={m[key]!r}"
        m[key] = str(swap[m[key]])
    if m["method"] in K_STANDIN and "k" in m:
      m["k"] = K_STANDIN[m["method"]]
    methods.append(m)
  bench = tmp_path / "bench.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[1:3]))
  cfg = {**d, "target": str(tiny_chat_dir), "draft": str(tiny_chat_dir),
         "datasets": [{"kind": "spec_bench", "path": str(bench), "per_group": 1}],
         "max_new_tokens": 8, "max_len": 128, "methods": methods}
  path = tmp_path / "papers.yaml"
  path.write_text(yaml.safe_dump(cfg))
  load_config(path)  # every method's parameters check out
  summary = main(parse_args(["--config", str(path), "--out", str(tmp_path / "res"), "--quiet"]))
  by = {m["name"]: m for m in summary["methods"]}
  assert set(by) == {m["name"] for m in d["methods"]}
  for name, rec in by.items():
    assert rec["overall"]["match_rate"] == 1.0, name  # greedy identity with plain decoding
  V = 320
  assert by["full_chain"]["draft_vocab_size"] == V  # the target's whole head
  from vocabjax.vocab.subset import VocabSubset

  cal = "train/calibration"
  for name, sub in (("full_vt32k", "target_generated"), ("full_fr32k", "stdlib_code")):
    K = len(VocabSubset.load(swap[f"{cal}/{sub}/subset-k32768.npz"]).ids)
    assert by[name]["draft_vocab_size"] == K < V, name  # the subset's rows, not the head's V
  sweep = [by[f"full_fr{n}"]["draft_vocab_size"] for n in ("4k", "8k", "16k", "32k", "64k")]
  assert sweep == sorted(set(sweep)) and sweep[-1] < V, sweep  # rows grow with K
  assert by["eagle3_32k"]["draft_vocab_size"] == 48  # the stand-in head's own rows
  rows = 32 + -(-(V * 8 + 8 * 64) // 64)  # a ranker's k + its cost in head rows (d' 8, d 64)
  assert by["full_sv512"]["draft_vocab_size"] == rows < V
  assert np.isfinite(by["full_tree"]["overall"]["tau"])

  # the report in the papers' layout reads the run (eval/papers_report.py)
  import importlib.util
  from pathlib import Path

  script = Path(__file__).parents[2] / "eval" / "papers_report.py"
  spec = importlib.util.spec_from_file_location("papers_report", script)
  rep = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(rep)
  assert rep.main([str(tmp_path / "res")]) == 0
  text = (tmp_path / "res" / "report.md").read_text()
  rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
  assert set(by) <= set(rows)
  assert "| 1.00x |" in rows["full_chain"]  # its own throughput relative to itself
  assert "## Throughput per Spec-Bench group (tokens/s)" in text and "| MBSU |" in text
  mbsu = by["full_fr32k"]["overall"]["mbsu"]
  assert f"| {mbsu:.2f} |" in rows["full_fr32k"]  # the run's MBSU in the FR-Spec table
  assert (tmp_path / "res" / "tau_vs_vocab_rows.png").stat().st_size > 0
  # beside FR-Spec's per-group tables: its ratios computed from its figures, ours from the run
  assert "## Beside the papers' per-group figures" in text
  pub = [a / b for a, b in zip(rep.FRSPEC_TAU["32k"], rep.FRSPEC_TAU["full"])]
  assert f"| {sum(pub) / len(pub):.0%} |" in rows["FR-Spec Table 1, Llama-3-8B, FR 32k"]
  g = next(g for g in rep.FRSPEC_GROUPS if g in by["full_fr32k"]["by_group"])
  ratio = by["full_fr32k"]["by_group"][g]["tau"] / by["full_chain"]["by_group"][g]["tau"]
  first = next(line for line in text.splitlines() if line.startswith("| ours, full_fr32k |"))
  cells = first.split(" | ")  # the tau table's row (the tokens/s table's comes after it)
  assert cells[1 + rep.FRSPEC_GROUPS.index(g)] == f"{ratio:.0%}"
  gain = by["full_sv1024"]["overall"]["tokens_per_s"] / by["eagle3_32k"]["overall"][
      "tokens_per_s"] - 1
  assert f"| {gain:+.1%} |" in text


def test_methods_on_one_head_share_one_copy_without_its_lm_head(full_head_dir, tiny_chat_dir):
  """The suite's 13 methods on the full-vocabulary head load it once (it OOM-killed a 24 GB
  machine as 13 copies), and with `lm_head: target` its own rows are not read."""
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.methods import METHODS
  from vocabjax.methods.eagle import _eagle_head

  m = load_model(tiny_chat_dir, dtype="float32")

  def spec(**kw):
    return METHODS["eagle"].params(**{"head": str(full_head_dir), "top_k": 1, "depth": 4,
                                      "total_tokens": 4, **kw})

  target = spec(lm_head="target")
  a, hc = _eagle_head(m, target)
  b, _ = _eagle_head(m, spec(lm_head="target", top_k=4, total_tokens=16))
  assert a is b and "lm_head" not in a and hc.draft_vocab_size == m.config.vocab_size
  own, _ = _eagle_head(m, spec(lm_head="own"))
  assert own["lm_head"].shape == (m.config.vocab_size, m.config.hidden_size)
  other = load_model(tiny_chat_dir, dtype="float32")  # another target object: loaded again
  c, _ = _eagle_head(other, target)
  assert c is not a
  np.testing.assert_array_equal(np.asarray(c["layer"]["wq"]), np.asarray(a["layer"]["wq"]))
  # a caller that frees its models drops the shared heads' references to them too
  import gc
  import weakref

  from vocabjax.methods.eagle import release_loaded_heads

  gone = weakref.ref(other.params["embed"])
  del other, c
  release_loaded_heads()
  gc.collect()
  assert gone() is None  # nothing kept the other target's weights alive
  assert _eagle_head(m, target)[0] is not a  # loaded afresh


def test_the_report_figures_give_each_method_its_own_style_and_each_family_a_colour():
  """With the papers' 18 methods (recorded in eval/results/papers/small) no two share a
  colour-and-marker style (matplotlib's 10-colour cycle gave full_chain and full_sv2048 one),
  the EAGLE head's methods share their family's colour, and the vocabulary axis is log with
  FR-Spec's published points beside."""
  from pathlib import Path

  from vocabjax.eval.report import method_styles, plots

  root = Path(__file__).resolve().parents[2]
  summary = json.loads((root / "eval/results/papers/small/summary.json").read_text())
  ms = [m for m in summary["methods"] if m["method"] != "ar"]
  styles = method_styles(ms)
  assert len(ms) == 18 and len({(c, mk) for c, mk, _ in styles.values()}) == 18
  assert len({(c, h) for c, _, h in styles.values()}) == 18  # the bars: colour and hatch
  full = {styles[m["name"]][0] for m in ms if m["name"].startswith("full_")}
  lm = {styles[m["name"]][0] for m in ms if m["name"].startswith("lm_")}
  assert len(full) == 1 and len(lm) == 1 and full != lm
  import importlib.util

  spec = importlib.util.spec_from_file_location("papers_report",
                                                root / "eval/papers_report.py")
  pr = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(pr)
  pts = pr.frspec_points()
  assert [x for x, _ in pts] == [128256, 65536, 32768, 16384, 8192]
  assert abs(pts[2][1] - sum(pr.FRSPEC_TAU["32k"]) / 7) < 1e-9
  import tempfile

  with tempfile.TemporaryDirectory() as d:
    paths = plots(summary, Path(d), extra_points=[("FR-Spec", pts)])
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
