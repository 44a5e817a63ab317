"""Fixtures of the eval tests: a tiny suite on a chat model, counts files, an EAGLE head
directory and a ranker file made from the tiny model."""

import json

import pytest
import yaml

from tests.helpers.eval import QUESTIONS
from vocabjax.calibrate import CountJob, run_count


@pytest.fixture
def suite(tmp_path, tiny_chat_dir):
  """A YAML suite on a tiny chat model drafting for itself, and a Spec-Bench-format file."""
  bench = tmp_path / "bench.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  cfg = {"name": "tiny", "target": str(tiny_chat_dir), "draft": str(tiny_chat_dir),
         "datasets": [{"kind": "spec_bench", "path": str(bench), "per_group": 2}],
         "max_new_tokens": 10, "max_len": 128,
         "methods": [{"name": "ar", "method": "ar"},
                     {"name": "chain_g2", "method": "chain", "gamma": 2},
                     {"name": "tree", "method": "tree", "top_k": 2, "depth": 2,
                      "total_tokens": 3}]}
  path = tmp_path / "tiny.yaml"
  path.write_text(yaml.safe_dump(cfg))
  return path, cfg


@pytest.fixture(scope="module")
def counts(tmp_path_factory, tiny_chat_dir):
  """Counts of a raw text corpus and of the tiny model's own completions."""
  root = tmp_path_factory.mktemp("counts")
  (root / "corpus.txt").write_text("def add(a, b):\n    return a + b\n" * 3 +
                                   "Who are you? Bonjour le monde. Write a haiku.\n")
  text = run_count(CountJob(model=str(tiny_chat_dir), out=str(root / "text"),
                            text=(str(root / "corpus.txt"),)), progress=False)
  prompts = root / "p.jsonl"
  prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]})
                             + "\n" for i, t in enumerate(["hi", "add two numbers", "a poem"])))
  gen = run_count(CountJob(model=str(tiny_chat_dir), out=str(root / "gen"), kind="generated",
                           prompts=(str(prompts),), exclude_suites=(), batch_size=3,
                           max_new_tokens=12, max_len=128), progress=False)
  assert text.total > 0 and gen.total > 0
  return root / "text" / "counts.npz", root / "gen" / "counts.npz"


@pytest.fixture(scope="module")
def ranker_file(tiny_chat_dir, tmp_path_factory):
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.vocab.ranked import svd_ranker

  m = load_model(tiny_chat_dir, dtype="float32")
  return svd_ranker(m.params, m.config, rank=8).save(
      tmp_path_factory.mktemp("ranker") / "r.safetensors")


@pytest.fixture(scope="module")
def head_dir(tiny_chat_dir, tmp_path_factory):
  """An untrained EAGLE-3 head for the tiny chat model (48-token vocabulary), exported."""
  import jax
  import numpy as np

  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.models.eagle import init_eagle
  from vocabjax.train.eagle_step import head_config
  from vocabjax.train.features import model_identity

  m = load_model(tiny_chat_dir, dtype="float32")
  hc = head_config(m.config, (0, 1), 48)
  p = init_eagle(jax.random.key(0), hc, scale=0.2)
  ids = np.arange(0, 96, 2)
  p["d2t"] = jax.numpy.asarray(ids - np.arange(48))
  return save_eagle3(p, hc, tmp_path_factory.mktemp("head") / "head",
                     target=model_identity(m))
