"""`python -m vocabjax.calibrate`: text / jsonl / datasets / generated sources, resume, select,
plots and bad input, on tiny models with a real (tiny) BPE tokenizer."""

import dataclasses
import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from vocabjax.calibrate import (CalibrationError, Counts, CountJob, run_count, special_ids,
                                tokenizer_identity)
from vocabjax.calibrate.__main__ import main
from vocabjax.calibrate.select import load_or_select, subset_for
from vocabjax.vocab import SubsetError, VocabSubset

DOCS = ["def f(x):\n    return x + 1\n", "the quick brown fox", "import os\nprint(os.sep)\n",
        "hello world " * 5, "class A:\n    pass\n"]


@pytest.fixture()
def corpus(tmp_path):
  d = tmp_path / "corpus"
  (d / "pkg" / "site-packages").mkdir(parents=True)
  for i, t in enumerate(DOCS[:3]):
    (d / "pkg" / f"m{i}.py").write_text(t)
  (d / "pkg" / "site-packages" / "skipped.py").write_text("never counted")
  (d / "notes.bin").write_text("not matched by the globs")
  j = tmp_path / "docs.jsonl"
  j.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS[3:]))
  return d, j


def _expected(tok_dir, texts, V):
  tok = AutoTokenizer.from_pretrained(tok_dir)
  ids = [i for t in texts for i in tok(t, add_special_tokens=False)["input_ids"]]
  return np.bincount(ids, minlength=V)


def test_text_counts_equal_tokenizer_bincount(tiny_chat_dir, corpus, tmp_path):
  d, j = corpus
  out = tmp_path / "out"
  assert main(["count", "--model", str(tiny_chat_dir), "--out", str(out), "--text", str(d),
               "--jsonl", str(j), "--docs-per-unit", "2", "--quiet"]) == 0
  c = Counts.load(out / "counts.npz")
  np.testing.assert_array_equal(c.counts, _expected(tiny_chat_dir, DOCS, c.vocab_size))
  tok = AutoTokenizer.from_pretrained(tiny_chat_dir)
  assert c.meta["tokenizer_id"] == tokenizer_identity(tok)
  assert c.meta["kind"] == "text" and c.meta["documents"] == 5
  assert c.meta["timing"]["tokenize_tokens_per_s"] > 0 and c.meta["timing"]["count_s"] > 0
  for f in ("rank_frequency.png", "coverage.png", "calibration.json"):
    assert (out / f).stat().st_size > 0
  assert not (out / "counts.partial.npz").exists()


def test_interrupted_run_resumes_to_the_same_counts(tiny_chat_dir, corpus, tmp_path):
  d, j = corpus
  job = CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "r"), text=(str(d),),
                 jsonl=(str(j),), docs_per_unit=1)
  assert run_count(job, max_units=2, progress=False) is None  # interrupted after 2 of 5 units
  assert (tmp_path / "r" / "counts.partial.npz").exists()
  resumed = run_count(job, progress=False)
  full = run_count(CountJob(**{**job.__dict__, "out": str(tmp_path / "f")}), progress=False)
  np.testing.assert_array_equal(resumed.counts, full.counts)
  assert resumed.meta["documents"] == 5
  again = run_count(job, progress=False)  # done: reloaded, not recounted
  np.testing.assert_array_equal(again.counts, full.counts)
  other = CountJob(**{**job.__dict__, "limit": 2})
  with pytest.raises(CalibrationError, match="counts of another job"):
    run_count(other, progress=False)
  assert run_count(other, overwrite=True, progress=False).meta["documents"] == 2


def test_finish_writes_what_was_counted(tiny_chat_dir, corpus, tmp_path):
  d, j = corpus
  job = CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "r"), text=(str(d),),
                 jsonl=(str(j),), docs_per_unit=1)
  with pytest.raises(CalibrationError, match="no partial counts of this job to finish"):
    run_count(job, finish=True, progress=False)
  run_count(job, max_units=2, progress=False)
  early = run_count(job, finish=True, progress=False)
  assert early.meta["units_done"] == 2 and early.meta["units_total"] == 5
  np.testing.assert_array_equal(early.counts, _expected(tiny_chat_dir, DOCS[:2], early.vocab_size))


def test_local_datasets_source(tiny_chat_dir, tmp_path):
  import datasets

  ds = datasets.Dataset.from_dict({"content": DOCS * 3})
  ds.save_to_disk(str(tmp_path / "ds"))
  c = run_count(CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "o"),
                         dataset=str(tmp_path / "ds"), field="content", num_proc=2),
                progress=False)
  np.testing.assert_array_equal(c.counts, _expected(tiny_chat_dir, DOCS * 3, c.vocab_size))
  here = run_count(CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "o1"),  # the default:
                            dataset=str(tmp_path / "ds"), field="content"),    # no workers
                   progress=False)
  np.testing.assert_array_equal(here.counts, c.counts)
  with pytest.raises(CalibrationError, match="no column 'text'"):
    run_count(CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "o2"),
                       dataset=str(tmp_path / "ds")), progress=False)


def test_generated_counts_only_the_completions(tiny_chat_dir, tmp_path):
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding import Decoder
  from vocabjax.prompts import encode_prompts

  prompts = tmp_path / "p.jsonl"
  texts = [f"say {w}" for w in ("a", "bb", "hello", "x y", "fox", "one two three")]
  prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]})
                             + "\n" for i, t in enumerate(texts)))
  job = CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "g"), kind="generated",
                 prompts=(str(prompts),), exclude_suites=(), batch_size=4, max_new_tokens=9,
                 max_len=128)
  c = run_count(job, progress=False)
  m = load_model(tiny_chat_dir)
  ids = encode_prompts(m.tokenizer, texts, chat=True)
  gen = [t for p in ids for t in Decoder(m.params, m.config).generate(
      [p], max_new_tokens=9, eos_token_ids=m.eos_token_ids, max_len=128).tokens[0]]
  np.testing.assert_array_equal(c.counts, np.bincount(gen, minlength=c.vocab_size))
  assert c.meta["kind"] == "generated" and c.meta["timing"]["generate_tokens_per_s"] > 0
  lines = (tmp_path / "g" / "generated.jsonl").read_text().splitlines()
  assert len(lines) == 6 and sum(len(json.loads(x)["completion_ids"]) for x in lines) == c.total
  # continuous batching (2 rows per unit of 4 prompts): the same completions, in the same order;
  # another job (fingerprint), while a job without rows keeps the one it had before
  cont = dataclasses.replace(job, out=str(tmp_path / "g2"), rows=2)
  c2 = run_count(cont, progress=False)
  np.testing.assert_array_equal(c2.counts, c.counts)
  assert (tmp_path / "g2" / "generated.jsonl").read_text().splitlines() == lines
  assert cont.fingerprint() != job.fingerprint() and "rows" not in job.as_dict()
  with pytest.raises(CalibrationError, match=r"rows=5 must be in \[1, batch_size=4\]"):
    dataclasses.replace(job, rows=5)


def test_torch_backend_generates_the_same_completions(tiny_chat_dir, tmp_path):
  """`backend: torch` (transformers' generate, f32 here): each unit one left-padded batch, the
  same greedy completions as vocabjax's (a row ends at its EOS, kept); another job, while a
  vocabjax job keeps the fingerprint it had; settings it cannot honour are refused."""
  prompts = tmp_path / "p.jsonl"
  texts = [f"say {w}" for w in ("a", "bb", "hello", "x y", "fox", "one two three", "z")]
  prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]})
                             + "\n" for i, t in enumerate(texts)))
  job = CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "jax"), kind="generated",
                 prompts=(str(prompts),), exclude_suites=(), batch_size=4, max_new_tokens=12,
                 max_len=128)
  tj = dataclasses.replace(job, out=str(tmp_path / "torch"), backend="torch",
                           torch_dtype="float32")
  a, b = run_count(job, progress=False), run_count(tj, progress=False)
  read = lambda d: [json.loads(x) for x in (tmp_path / d / "generated.jsonl").read_text().splitlines()]
  ja, tb = read("jax"), read("torch")
  assert len(ja) == len(tb) == len(texts)
  assert [r["completion_ids"] for r in tb] == [r["completion_ids"] for r in ja]
  assert [r["prompt"] for r in tb] == [r["prompt"] for r in ja]
  np.testing.assert_array_equal(b.counts, a.counts)
  assert tj.fingerprint() != job.fingerprint() and "backend" not in job.as_dict()
  assert b.meta["timing"]["generate_tokens_per_s"] > 0
  with pytest.raises(CalibrationError, match=r"rows=2 \(continuous batching\) is vocabjax's"):
    dataclasses.replace(tj, rows=2)
  with pytest.raises(CalibrationError, match="torch_dtype='int8' is not one of"):
    dataclasses.replace(tj, torch_dtype="int8")
  with pytest.raises(CalibrationError, match="unknown backend 'jax'"):
    dataclasses.replace(job, backend="jax")
  assert main(["count", "--model", str(tiny_chat_dir), "--out", str(tmp_path / "x"),
               "--text", str(prompts), "--backend", "torch"]) == 2


def test_generated_prompts_leave_out_suite_questions_in_another_wrapper(tiny_chat_dir, tmp_path):
  """A suite's question is left out of a generated job's prompts however it is wrapped (case,
  whitespace, an appended instruction: GSM8K's test problems are Spec-Bench's math questions)."""
  from vocabjax.calibrate.run import calibration_prompts
  from vocabjax.prompts import DatasetSpec, load_prompts

  suite = tmp_path / "mini.yaml"
  suite.write_text("name: mini\ndatasets:\n  - {kind: spec_bench, per_group: 1}\n")
  q = load_prompts([DatasetSpec(kind="spec_bench", per_group=1)])[0].text
  texts = [q.upper() + "\nLet's think step by step.", "  " + q.replace(" ", "\n "),
           "a question of no suite", "another one"]
  prompts = tmp_path / "p.jsonl"
  prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]})
                             + "\n" for i, t in enumerate(texts)))
  job = CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "g"), kind="generated",
                 prompts=(str(prompts),), exclude_suites=(str(suite),), max_len=4096)
  tok = AutoTokenizer.from_pretrained(tiny_chat_dir)
  kept = [tok.decode(x) for x in calibration_prompts(job, tok)]
  assert len(kept) == 2 and all("question" in k or "another" in k for k in kept)
  assert len(calibration_prompts(dataclasses.replace(job, exclude_suites=()), tok)) == 4


def test_select_keeps_specials_and_refuses_other_tokenizers(tiny_chat_dir, corpus, tmp_path):
  d, j = corpus
  run_count(CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "c"), text=(str(d),)),
            progress=False)
  counts_path = tmp_path / "c" / "counts.npz"
  tok = AutoTokenizer.from_pretrained(tiny_chat_dir)
  c = Counts.load(counts_path)
  sub = subset_for(c, tok, c.vocab_size, [tok.eos_token_id], k=20)
  specials = {i for i in tok.all_special_ids if i < c.vocab_size}
  assert len(specials) >= 3 and specials <= set(sub.ids.tolist())
  assert sub.size == 20
  keep = set(special_ids(tok, [tok.eos_token_id]))
  inside = [i for i in sub.ids if i not in keep]
  outside = [i for i in range(c.vocab_size) if i not in keep and i not in set(sub.ids)]
  assert c.counts[inside].min() >= c.counts[outside].max()  # the rest are the most frequent
  # saved beside the counts, then reloaded (not reselected); a stale file is an error
  first = load_or_select(counts_path, tok, c.vocab_size, k=20)
  assert (tmp_path / "c" / "subset-k20.npz").exists()
  assert np.array_equal(load_or_select(counts_path, tok, c.vocab_size, k=20).ids, first.ids)
  VocabSubset(ids=first.ids[:-1], vocab_size=c.vocab_size,
              tokenizer_id=first.tokenizer_id).save(tmp_path / "c" / "subset-k20.npz")
  with pytest.raises(CalibrationError, match="differs from the top-20 subset"):
    load_or_select(counts_path, tok, c.vocab_size, k=20)
  # counts of another tokenizer
  other = Counts(counts=c.counts, meta={**c.meta, "tokenizer_id": "vocab9-sha256:feed"})
  with pytest.raises(CalibrationError, match="cannot select a subset"):
    subset_for(other, tok, c.vocab_size, k=20)
  with pytest.raises(CalibrationError, match="counted with tokenizer 'vocab9"):
    other.save(tmp_path / "o.npz")
    Counts.load(tmp_path / "o.npz", tokenizer_id=c.meta["tokenizer_id"])
  # CLI select: K out of range, top-p outside (0, 1]
  out = tmp_path / "s.npz"
  assert main(["select", str(counts_path), "--model", str(tiny_chat_dir), "--k", "32",
               "--out", str(out)]) == 0
  assert VocabSubset.load(out).size == 32
  for bad in (["--k", str(c.vocab_size + 1)], ["--k", "0"], ["--top-p", "0"],
              ["--top-p", "1.5"]):
    assert main(["select", str(counts_path), "--model", str(tiny_chat_dir), *bad,
                 "--out", str(out)]) == 2
  with pytest.raises(SubsetError, match=r"k=0 must be in \[1"):
    subset_for(c, tok, c.vocab_size, k=0)
  with pytest.raises(SubsetError, match="top_p=1.5 must be in"):
    subset_for(c, tok, c.vocab_size, top_p=1.5)


def test_bad_sources_and_files(tiny_chat_dir, tmp_path, capsys):
  (tmp_path / "empty").mkdir()
  with pytest.raises(CalibrationError, match="empty calibration source"):
    run_count(CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "o"),
                       text=(str(tmp_path / "empty"),)), progress=False)
  assert not (tmp_path / "o").exists()  # nothing written for an empty source
  (tmp_path / "blank.txt").write_text("")
  with pytest.raises(CalibrationError, match="produced no tokens"):
    run_count(CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "o2"),
                       text=(str(tmp_path / "blank.txt"),)), progress=False)
  # no counts.partial.npz left behind to refuse the corrected rerun into the same --out
  assert not (tmp_path / "o2").exists()
  (tmp_path / "real.txt").write_text("the quick brown fox")
  assert run_count(CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "o2"),
                            text=(str(tmp_path / "real.txt"),)), progress=False).total > 0
  assert main(["count", "--model", str(tiny_chat_dir), "--out", str(tmp_path / "o3"),
               "--text", str(tmp_path / "missing")]) == 2
  assert "calibration source not found" in capsys.readouterr().err
  with pytest.raises(CalibrationError, match="needs --text, --jsonl or --dataset"):
    CountJob(model="m", out="o")
  bad = tmp_path / "bad.npz"
  bad.write_bytes(b"PK\x03\x04 truncated")
  with pytest.raises(CalibrationError, match="not a readable counts file"):
    Counts.load(bad)
  with pytest.raises(CalibrationError, match="no counts file"):
    Counts.load(tmp_path / "nope.npz")


def test_plot_overlays_several_counts(tmp_path):
  for name, seed in (("a", 0), ("b", 1)):
    counts = np.random.RandomState(seed).zipf(1.5, 500).clip(0, 99).astype(np.int64)
    Counts(counts=np.bincount(counts, minlength=100), meta={"kind": "text"}).save(
        tmp_path / name / "counts.npz")
  assert main(["plot", f"code={tmp_path / 'a' / 'counts.npz'}", str(tmp_path / "b" / "counts.npz"),
               "--out", str(tmp_path / "plots")]) == 0
  assert (tmp_path / "plots" / "coverage.png").stat().st_size > 0


def test_binary_files_are_skipped_and_bad_bytes_reported(tmp_path):
  """A text source holding a binary file (NUL bytes) and a text file with one latin-1 byte:
  the binary file is not counted, the other is counted with U+FFFD; both are warned about."""
  from vocabjax.calibrate.run import CountJob, text_documents

  src = tmp_path / "src"
  src.mkdir()
  (src / "good.txt").write_text("plain text")
  (src / "blob.txt").write_bytes(b"\x00\x01\x02ELF" * 50)
  (src / "latin.txt").write_bytes(b"caf\xe9 " + b"and a line of ordinary text " * 10)
  job = CountJob(model="m", out=str(tmp_path / "o"), text=(str(src),))
  with pytest.warns(RuntimeWarning) as record:
    docs = text_documents(job)
  messages = " ".join(str(w.message) for w in record)
  assert "skipped 1 binary files" in messages and "blob.txt" in messages
  assert "1 files hold bytes that are not UTF-8" in messages and "latin.txt" in messages
  assert sorted(d[:4] for d in docs) == ["caf\ufffd", "plai"]


def test_coverage_latency_picks_the_utility_argmax():
  """Every k's utility against the rule's choice, on Zipf counts; the coverage floor; bad
  settings name the value."""
  from vocabjax.vocab.subset import coverage_latency

  V, body = 1000, 300
  counts = (1e6 / np.arange(1, V + 1) ** 1.1).astype(np.int64)
  c = coverage_latency(counts, body_rows=body, alpha=0.5, k_min=1)
  cov = np.cumsum(np.sort(counts)[::-1]) / counts.sum()
  ks = np.arange(1, V + 1)
  util = 0.5 * cov + 0.5 * (1 - (body + ks) / (body + V))
  assert c["k"] == int(ks[np.argmax(util)]) and 1 < c["k"] < V
  assert c["coverage"] == pytest.approx(cov[c["k"] - 1])
  # coverage weighs more: a larger k; a floor above the argmax's coverage: the floor's k
  assert coverage_latency(counts, body_rows=body, alpha=0.9, k_min=1)["k"] > c["k"]
  floor = coverage_latency(counts, body_rows=body, alpha=0.5, k_min=1, min_coverage=0.99)
  assert floor["k"] == int(np.searchsorted(cov, 0.99) + 1)
  # a costlier drafter body makes the head's rows matter less: k grows
  assert coverage_latency(counts, body_rows=30 * body, k_min=1)["k"] >= c["k"]
  with pytest.raises(SubsetError, match="alpha=1.5 must be in"):
    coverage_latency(counts, body_rows=body, alpha=1.5)
  with pytest.raises(SubsetError, match=r"k range \[50, 2000\] must lie in \[1, V=1000\]"):
    coverage_latency(counts, body_rows=body, k_max=2000)
  with pytest.raises(SubsetError, match="empty calibration set"):
    coverage_latency(np.zeros(10), body_rows=body)


def test_select_coverage_latency_cli(tiny_chat_dir, corpus, tmp_path, capsys):
  d, _ = corpus
  run_count(CountJob(model=str(tiny_chat_dir), out=str(tmp_path / "c"), text=(str(d),)),
            progress=False)
  counts_path = tmp_path / "c" / "counts.npz"
  out = tmp_path / "cl.npz"
  assert main(["select", str(counts_path), "--model", str(tiny_chat_dir),
               "--coverage-latency", "--drafter", str(tiny_chat_dir), "--k-min", "4",
               "--out", str(out)]) == 0
  sub = VocabSubset.load(out)
  meta = dict(sub.meta)
  assert "coverage_latency(alpha=0.5" in meta["rule"] and sub.size == int(
      meta["rule"].rsplit("k=", 1)[1])
  assert f"K={sub.size} of V=" in capsys.readouterr().out
  assert main(["select", str(counts_path), "--model", str(tiny_chat_dir),
               "--coverage-latency", "--out", str(out)]) == 2
  assert "name it with --drafter" in capsys.readouterr().err
