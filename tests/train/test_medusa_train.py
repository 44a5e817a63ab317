"""`python -m vocabjax.train.medusa` on a tiny target: labels are the target's tokens j + 2 ahead,
training lowers the held-out loss, resume is exact, the exported heads load in Medusa's layout
and decode exactly."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from vocabjax.checkpoints.loader import load_model
from vocabjax.checkpoints.medusa import load_medusa
from vocabjax.decoding import Decoder
from vocabjax.decoding.medusa import MedusaProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models.cache import KVCache
from vocabjax.models.llamalike import forward
from vocabjax.train.eagle_data import build_eagle_features, load_eagle_features
from vocabjax.train.loop import TrainError
from vocabjax.train.medusa import MedusaJob, choose_train_vocab, main, positions, train


def _job(target_dir, data_file, out, **kw):
  base = dict(target=str(target_dir), data=(str(data_file),), out=str(out),
              features=str(out.parent / "features"), feature_layers=(0,), num_heads=3,
              train_vocab_size=None, batch_size=64, steps=40, lr=2e-2, warmup_steps=4,
              eval_every=10, checkpoint_every=10, heldout=0.25, topk=3)
  base.update(kw)
  return MedusaJob(**base)


def test_positions_pair_each_hidden_state_with_the_tokens_ahead(target_dir, data_file,
                                                                tmp_path):
  job = _job(target_dir, data_file, tmp_path / "run")
  t = load_model(target_dir, dtype="float32")
  fdir = build_eagle_features(job.eagle_job, t, (0,), show_progress=False)
  data = load_eagle_features(fdir, t, (0,), hidden=True)
  _, toks, first = data.seqs[3]
  pos = positions(data, [3], 3)
  T = len(toks)
  h, _ = forward(t.params, jnp.asarray(toks)[None], jnp.arange(T)[None],
                 KVCache.init(t.config, 1, T), config=t.config)
  # rows start at t = first - 1 (head 0 there predicts y_first, the first completion token)
  np.testing.assert_allclose(pos.hidden[0].astype(np.float32), np.asarray(h[0, first - 1]),
                             rtol=2e-3, atol=2e-3)
  # the completion was the target's greedy output: y_{t+j+1} is the token at t + j + 2
  t0 = first - 1
  for j in range(3):
    assert pos.labels[0, j] == toks[t0 + j + 2]
  # past the record's end: skipped
  assert (pos.labels[-1, 1:] == -1).all() and pos.labels[-1, 0] == data.labels[3][T - 1]
  assert choose_train_vocab(np.asarray([[5, 5, 7], [7, 7, -1]]), 2, 10).tolist() == [5, 7]


def test_training_lowers_the_loss_exports_and_decodes(target_dir, data_file, tmp_path):
  job = _job(target_dir, data_file, tmp_path / "run")
  summary = train(job, show_progress=False)
  start, final = summary["start"], summary["final"]
  assert final["heldout_loss"] < 0.8 * start["heldout_loss"]
  assert final["acc_0"] > start["acc_0"] + 0.1
  log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
  assert [r["step"] for r in log] == [0, 10, 20, 30, 40]
  t = load_model(target_dir, dtype="float32")
  mc, heads, rec = load_medusa(tmp_path / "run" / "heads", target_config=t.config,
                               target_params=t.params)
  assert mc.num_heads == 3 and mc.shared_lm_head and rec["fingerprint"]
  data = load_eagle_features(job.eagle_job.features_dir)
  prompts = [list(map(int, toks[:first + 1])) for _, toks, first in data.seqs[:6]]
  ar = Decoder(t.params, t.config).generate(prompts, max_new_tokens=16)
  choices = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
  res = SpeculativeEngine(t.params, t.config,
                          MedusaProposer(t.params, t.config, heads, mc,
                                         choices=choices)).generate(prompts, max_new_tokens=16)
  assert res.tokens == ar.tokens
  # the trained heads draft the target's text: more than one token per step on average
  assert res.stats.tau > 1.3


@pytest.mark.extended
def test_resume_is_exact_and_subset_training(target_dir, data_file, tmp_path):
  full = train(_job(target_dir, data_file, tmp_path / "a", steps=20, train_vocab_size=150),
               show_progress=False)
  job = _job(target_dir, data_file, tmp_path / "b", steps=20, train_vocab_size=150)
  assert main(["--config", _yaml(tmp_path, job), "--quiet", "--stop-after", "10"]) == 0
  part = train(job, show_progress=False)
  assert part["final"]["heldout_loss"] == pytest.approx(full["final"]["heldout_loss"], rel=1e-5)
  assert full["train_vocab"] == 150 and 0 <= full["labels_outside_train_vocab"] < 1


def _yaml(tmp_path, job):
  import dataclasses

  import yaml

  d = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(job).items()}
  path = tmp_path / "medusa.yaml"
  path.write_text(yaml.safe_dump(d))
  return str(path)


def test_bad_input(target_dir, data_file, tmp_path):
  with pytest.raises(TrainError, match="train_vocab_size needs shared_lm_head"):
    _job(target_dir, data_file, tmp_path / "x", shared_lm_head=False, train_vocab_size=100)
  with pytest.raises(TrainError, match="num_heads >= 1"):
    _job(target_dir, data_file, tmp_path / "x", num_heads=0)
  with pytest.raises(TrainError, match=r"train_vocab_size=999 must be in \[1, V="):
    train(_job(target_dir, data_file, tmp_path / "y", train_vocab_size=999,
               features=str(tmp_path / "fy")), show_progress=False)
  assert not (tmp_path / "fy").exists()  # refused before any feature was built
  # shards without the final hidden state (an EAGLE-only build) are refused by name
  import dataclasses

  from vocabjax.train.eagle_data import build_eagle_features as build

  job = _job(target_dir, data_file, tmp_path / "z", features=str(tmp_path / "fz"))
  t = load_model(target_dir, dtype="float32")
  build(dataclasses.replace(job.eagle_job, final_hidden=False), t, (0,), show_progress=False)
  with pytest.raises(TrainError, match="holds features of other data or models|no final hidden"):
    train(job, show_progress=False)


def test_random_heldout_split(target_dir, data_file, tmp_path):
  """`heldout_split: random` (as the EAGLE trainer's): as many held-out prompts as the last
  ones, another job; the default keeps the fingerprint jobs had before the field existed."""
  import dataclasses
  import hashlib

  from vocabjax.train.loop import RUN_ONLY_FIELDS

  kw = dict(steps=4, warmup_steps=1, eval_every=4, checkpoint_every=4)
  last = _job(target_dir, data_file, tmp_path / "last", **kw)
  before = dataclasses.asdict(last)
  for k in (*RUN_ONLY_FIELDS, "heldout_split"):
    before.pop(k, None)
  assert last.train_fingerprint() == hashlib.sha256(
      json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
  rnd = _job(target_dir, data_file, tmp_path / "rnd", heldout_split="random", **kw)
  assert rnd.train_fingerprint() != last.train_fingerprint()
  a, b = train(last, show_progress=False), train(rnd, show_progress=False)
  assert a["heldout_records"] == b["heldout_records"] > 0
  # other prompts held out: the same initial heads score them differently
  assert a["start"]["heldout_loss"] != pytest.approx(b["start"]["heldout_loss"], rel=1e-4)
  with pytest.raises(TrainError, match="heldout_split='first' is not 'last' or 'random'"):
    _job(target_dir, data_file, tmp_path / "x", heldout_split="first")
