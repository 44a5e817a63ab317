"""`python -m vocabjax.train.ranker` on a tiny drafter/target pair: features, training lowers
the loss, exact resume, export round trip, joint mode, bad input."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer
from vocabjax.models.llamalike import lm_head, lm_head_weight
from vocabjax.testing.tiny import save_tiny_variant
from vocabjax.train.features import build_features, load_features
from vocabjax.train.loop import TrainError

from tests.helpers.train import write_completions
from vocabjax.train.ranker import RankerJob, job_from_dict, main, train
from vocabjax.vocab.ranked import Ranker, RankerError, SpeculativeVocab


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("ranker_pair")
  draft = save_tiny_variant("qwen2_bias", root / "draft", seed=3, with_tokenizer=True)
  target = save_tiny_variant("qwen2_bias", root / "target", seed=4, with_tokenizer=True)
  return draft, target


@pytest.fixture(scope="module")
def data_file(pair_dirs, tmp_path_factory):
  """16 completion records: chat prompts and the target's own greedy completions."""
  _, target = pair_dirs
  return write_completions(target, tmp_path_factory.mktemp("data") / "generated.jsonl",
                           n=16, max_new_tokens=12)


def _job(pair_dirs, data_file, out, **kw):
  draft, target = pair_dirs
  base = dict(drafter=str(draft), target=str(target), data=(str(data_file),), out=str(out),
              features=str(out.parent / "features"), rank=8, steps=30, batch_tokens=64,
              lr=1e-2, warmup_steps=3, eval_every=10, checkpoint_every=10, heldout=0.25,
              teacher_top=4, recall_k=(4, 16, 64), vocab_block=100, init="random")
  base.update(kw)
  return RankerJob(**base)


@pytest.mark.extended
def test_features_are_the_models_own_states(pair_dirs, data_file, tmp_path):
  job = _job(pair_dirs, data_file, tmp_path / "run")
  feats = load_features(build_features(job.feature_spec, show_progress=False))
  draft, target = (load_model(p, dtype="float32") for p in pair_dirs)
  rec, toks, first = feats.seqs[2]
  rows = np.flatnonzero(feats.record == rec)
  n = len(toks) - 1 - first
  assert len(rows) == n == 12  # one row per completion token
  from vocabjax.models.cache import KVCache
  from vocabjax.models.llamalike import forward

  def states(m):
    T = len(toks)
    h, _ = forward(m.params, jnp.asarray(toks)[None], jnp.arange(T)[None],
                   KVCache.init(m.config, 1, T), config=m.config)
    return h[0, first:first + n]

  np.testing.assert_allclose(feats.hidden[rows], np.asarray(states(draft)), rtol=1e-4,
                             atol=1e-4)
  t_logits = np.asarray(lm_head(target.params, states(target), config=target.config))
  np.testing.assert_array_equal(feats.label[rows], t_logits.argmax(-1))
  np.testing.assert_array_equal(feats.top_ids[rows][:, 0], feats.label[rows])
  # the target generated these completions greedily: its teacher-forced argmax is the text
  np.testing.assert_array_equal(feats.label[rows], toks[first + 1:])
  d_logits = np.asarray(lm_head(draft.params, states(draft), config=draft.config))
  np.testing.assert_array_equal(feats.draft_argmax[rows], d_logits.argmax(-1))
  assert json.loads((tmp_path / "features" / "meta.json").read_text())["complete"]


@pytest.mark.extended
@pytest.mark.parametrize("loss", ["ce", "kl"])
def test_training_lowers_the_loss_and_the_ranker_drafts_losslessly(pair_dirs, data_file,
                                                                   tmp_path, loss):
  job = _job(pair_dirs, data_file, tmp_path / "run", loss=loss)
  summary = train(job, show_progress=False)
  log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
  assert [r["step"] for r in log] == [0, 10, 20, 30]
  assert log[-1]["heldout_loss"] < log[0]["heldout_loss"] - 0.1
  assert log[-1]["train_loss"] < log[1]["train_loss"]
  assert log[-1]["recall@16_target"] >= log[0]["recall@16_target"]
  assert summary["complete"] and (tmp_path / "run" / "curves.png").stat().st_size > 0
  r = Ranker.load(tmp_path / "run" / "ranker.safetensors")
  assert r.rank == 8 and r.meta["steps"] == 30
  best = min(log, key=lambda row: row["heldout_loss"])  # exported: the best held-out step
  assert r.meta["exported_step"] == best["step"] == summary["exported"]["step"]
  assert r.meta["final"]["heldout_loss"] == best["heldout_loss"]
  draft, target = (load_model(p, dtype="float32") for p in pair_dirs)
  r.check_drafter(draft.params, draft.config)
  with pytest.raises(RankerError, match="another drafter"):
    r.check_drafter(target.params, target.config)
  prompts = [[5, 9, 30], [7]]
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=16)
  spec = SpeculativeEngine(
      target.params, target.config,
      ChainProposer(draft.params, draft.config, target.config, gamma=3,
                    draft_vocab=SpeculativeVocab(r, k=16)))
  assert spec.generate(prompts, max_new_tokens=16).tokens == ar.tokens


@pytest.mark.extended
def test_tied_ranker_on_the_drafters_own_tokens(pair_dirs, data_file, tmp_path):
  """label: drafter, vocab: tied: the ranker is U P over the drafter's frozen head, starts as
  the SVD ranker exactly, learns the drafter's greedy token (no target needed), and exports
  the materialized U P that decodes losslessly."""
  from vocabjax.vocab.ranked import svd_ranker

  job = _job(pair_dirs, data_file, tmp_path / "t", target=None, label="drafter", vocab="tied",
             init="svd", features=str(tmp_path / "fd"), steps=40, select_by=None)
  summary = train(job, show_progress=False)
  draft, target = (load_model(p, dtype="float32") for p in pair_dirs)
  log = [json.loads(x) for x in (tmp_path / "t" / "log.jsonl").read_text().splitlines()]
  svd = svd_ranker(draft.params, draft.config, 8)
  feats = load_features(tmp_path / "fd")
  from vocabjax.train.ranker import recall
  held = feats.rows(np.isin(feats.record, np.unique(feats.record)[-4:]))  # heldout 0.25 of 16
  assert log[0]["recall@4_drafter"] == pytest.approx(
      recall({"down": svd.down, "vocab": svd.vocab}, held, (4,))["recall@4_drafter"])
  assert log[-1]["heldout_loss"] < log[0]["heldout_loss"] - 0.1  # CE toward the drafter's token
  assert log[-1]["recall@4_drafter"] > log[0]["recall@4_drafter"]
  r = Ranker.load(tmp_path / "t" / "ranker.safetensors")
  assert r.meta["label"] == "drafter" and r.meta["vocab"] == "tied" and summary["complete"]
  U = np.asarray(lm_head_weight(draft.params, draft.config), np.float64)
  assert np.linalg.matrix_rank(r.vocab.astype(np.float64)) == 8
  # W_vocab lies in the column space of U: U P for some P (least squares is exact)
  P, *_ = np.linalg.lstsq(U, r.vocab, rcond=None)
  np.testing.assert_allclose(U @ P, r.vocab, atol=1e-4)
  prompts = [[5, 9, 30], [7]]
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=16)
  spec = SpeculativeEngine(
      target.params, target.config,
      ChainProposer(draft.params, draft.config, target.config, gamma=3,
                    draft_vocab=SpeculativeVocab(r, k=16)))
  assert spec.generate(prompts, max_new_tokens=16).tokens == ar.tokens
  # the label/vocab options change the job's fingerprint; the defaults keep old ones
  assert job.train_fingerprint() != _job(pair_dirs, data_file, tmp_path / "t", target=None,
                                         vocab="tied", init="svd",
                                         features=str(tmp_path / "fd"), steps=40,
                                         select_by=None).train_fingerprint()


@pytest.mark.extended
def test_resume_is_exact(pair_dirs, data_file, tmp_path):
  kw = dict(steps=20, eval_every=5, select_by="recall@4_target")
  straight = train(_job(pair_dirs, data_file, tmp_path / "a", **kw), show_progress=False)
  job_b = _job(pair_dirs, data_file, tmp_path / "b", **kw)
  part = train(job_b, show_progress=False, stop_after=10)
  assert not part["complete"] and not (tmp_path / "b" / "ranker.safetensors").exists()
  resumed = train(job_b, show_progress=False)
  assert resumed["complete"]
  a = Ranker.load(tmp_path / "a" / "ranker.safetensors")
  b = Ranker.load(tmp_path / "b" / "ranker.safetensors")
  np.testing.assert_array_equal(a.down, b.down)
  np.testing.assert_array_equal(a.vocab, b.vocab)
  assert straight["final"]["heldout_loss"] == resumed["final"]["heldout_loss"]
  log = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
  assert [r["step"] for r in log] == [0, 5, 10, 15, 20]
  # the export is the first evaluated step with the best recall, also across the resume
  top = max(r["recall@4_target"] for r in log)
  first_best = next(r["step"] for r in log if r["recall@4_target"] == top)
  assert a.meta["exported_step"] == b.meta["exported_step"] == first_best
  # a finished run is not redone, and another job may not reuse its checkpoints
  with pytest.raises(TrainError, match="another training job"):
    train(_job(pair_dirs, data_file, tmp_path / "b", **{**kw, "rank": 4}), show_progress=False)
  # nor overwrite its outputs once its checkpoints/ (and the job.json inside) are gone: the
  # marker beside the outputs still says whose they are
  import shutil
  shutil.rmtree(tmp_path / "b" / "checkpoints")
  before = (tmp_path / "b" / "ranker.safetensors").read_bytes()
  with pytest.raises(TrainError, match="outputs of another training job"):
    train(_job(pair_dirs, data_file, tmp_path / "b", **{**kw, "rank": 4}), show_progress=False)
  (tmp_path / "b" / "vocabjax-job.json").unlink()  # outputs of a job that cannot be identified
  with pytest.raises(TrainError, match="cannot be identified"):
    train(_job(pair_dirs, data_file, tmp_path / "b", **{**kw, "rank": 4}), show_progress=False)
  assert (tmp_path / "b" / "ranker.safetensors").read_bytes() == before
  # that is the run as a repository commits it (log, summary and exports; no checkpoints, no
  # marker): the job its summary.json records rebuilds it, from step 0, as its command says
  again = train(job_b, show_progress=False)
  assert again["complete"] and (tmp_path / "b" / "vocabjax-job.json").exists()
  assert again["final"]["heldout_loss"] == straight["final"]["heldout_loss"]


@pytest.mark.extended
def test_joint_mode_trains_drafter_and_ranker(pair_dirs, data_file, tmp_path):
  job = _job(pair_dirs, data_file, tmp_path / "j", mode="joint", steps=6, eval_every=3,
             checkpoint_every=3, joint_batch=2, seq_len=64, lr=3e-3)
  summary = train(job, show_progress=False)
  assert summary["complete"]
  tuned = load_model(tmp_path / "j" / "drafter", dtype="float32")
  orig = load_model(pair_dirs[0], dtype="float32")
  assert not np.allclose(tuned.params["embed"], orig.params["embed"])
  r = Ranker.load(tmp_path / "j" / "ranker.safetensors")
  r.check_drafter(tuned.params, tuned.config)  # the ranker belongs to the tuned drafter
  with pytest.raises(RankerError, match="another drafter"):
    r.check_drafter(orig.params, orig.config)
  log = [json.loads(x) for x in (tmp_path / "j" / "log.jsonl").read_text().splitlines()]
  assert np.isfinite(log[-1]["train_loss"]) and log[-1]["heldout_loss"] < log[0]["heldout_loss"]


def test_bad_input(pair_dirs, data_file, tmp_path):
  with pytest.raises(TrainError, match="loss='kl' needs a target"):
    _job(pair_dirs, data_file, tmp_path / "x", loss="kl", target=None)
  with pytest.raises(TrainError, match=r"unknown fields \['rnak'\]"):
    job_from_dict({"drafter": "d", "data": "x", "out": "o", "rnak": 3})
  with pytest.raises(RankerError, match="rank d'=65 exceeds the drafter's hidden size d=64"):
    train(_job(pair_dirs, data_file, tmp_path / "r", rank=65), show_progress=False)
  empty = tmp_path / "empty.jsonl"
  empty.write_text("")
  with pytest.raises(TrainError, match="no completion records"):
    build_features(_job(pair_dirs, empty, tmp_path / "e", features=str(tmp_path / "fe"))
                   .feature_spec)
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "x"}\n')
  with pytest.raises(TrainError, match="bad.jsonl:1 is not a completion record"):
    build_features(_job(pair_dirs, bad, tmp_path / "b", features=str(tmp_path / "fb"))
                   .feature_spec)
  # features of one drafter/target are not reused for another
  fdir = tmp_path / "shared"
  build_features(_job(pair_dirs, data_file, tmp_path / "s", features=str(fdir)).feature_spec,
                 show_progress=False)
  swapped = _job(pair_dirs, data_file, tmp_path / "s", features=str(fdir),
                 drafter=str(pair_dirs[1]), target=str(pair_dirs[0]))
  with pytest.raises(TrainError, match="features of other data or models"):
    build_features(swapped.feature_spec)
  with pytest.raises(TrainError, match="label='drafter' trains cross-entropy"):
    _job(pair_dirs, data_file, tmp_path / "x", loss="kl", label="drafter")
  with pytest.raises(TrainError, match="vocab='tied' is for mode='frozen'"):
    _job(pair_dirs, data_file, tmp_path / "x", mode="joint", vocab="tied")
  with pytest.raises(TrainError, match="label='teacher' is not one of"):
    _job(pair_dirs, data_file, tmp_path / "x", label="teacher")
  cfg = tmp_path / "c.yaml"
  cfg.write_text("drafter: d\nout: o\n")
  assert main(["--config", str(cfg)]) == 2


def test_heldout_split_keeps_a_prompts_completions_together():
  from vocabjax.train.features import Features, heldout_records

  p = [np.array([1, 2, 3]), np.array([4, 5]), np.array([6]), np.array([7, 8])]
  # records 0-3: prompts 0-3 by model A; records 4-7: the same prompts by model B
  seqs = [(r, np.concatenate([p[r % 4], [9, 9]]), len(p[r % 4]) - 1) for r in range(8)]
  f = Features(*(None,) * 6, seqs=seqs, meta={})
  np.testing.assert_array_equal(heldout_records(f, 0.25), [3, 7])
  np.testing.assert_array_equal(heldout_records(f, 0.5), [2, 3, 6, 7])
  with pytest.raises(TrainError, match="4 distinct prompts cannot be split with heldout=0.05"):
    heldout_records(f, 0.05)
  # a random split: the same number of prompts, both models' records of each, seeded
  draws = {tuple(heldout_records(f, 0.5, "random", seed).tolist()) for seed in range(20)}
  assert all(len(d) == 4 and {r % 4 for r in d} == {r % 4 for r in d if r >= 4} for d in draws)
  assert len(draws) > 1  # the seed matters, and the same seed draws the same prompts
  np.testing.assert_array_equal(heldout_records(f, 0.5, "random", 3),
                                heldout_records(f, 0.5, "random", 3))
  with pytest.raises(TrainError, match="heldout split='first' is not 'last' or 'random'"):
    heldout_records(f, 0.5, "first")


@pytest.mark.parametrize("field, value, message", [
    ("batch_tokens", 0, "batch_tokens=0 must be >= 1"),
    ("steps", 0, "steps=0 must be >= 1"),
    ("rank", "eight", "rank must be int, got 'eight'"),
    ("lr", "fast", "lr must be float, got 'fast'"),
    ("lr", float("nan"), "lr=nan must be finite"),
])
def test_job_fields_refuse_empty_sizes_and_wrong_types(field, value, message):
  """Trainer YAML: a size that makes an empty batch and a value of the wrong type are refused
  up front with the field and value (the same check serves every trainer)."""
  with pytest.raises(TrainError, match=message):
    job_from_dict({"drafter": "d", "data": "x", "out": "o", field: value}, where="cfg")


def test_a_nan_loss_stops_training_at_its_step_keeping_the_last_checkpoint(
    pair_dirs, data_file, tmp_path, monkeypatch):
  """The loss turns NaN at step 13: the run stops with an error naming step 13, the step-10
  checkpoint stays the newest, and nothing is exported."""
  import vocabjax.train.ranker as rk
  from vocabjax.train.loop import Checkpoints

  real = rk._frozen_step

  def nan_after_12(job):
    step = real(job)

    def wrapped(state, batch, U, hyper):
      state, loss = step(state, batch, U, hyper)
      return state, loss if int(state.step) < 13 else jnp.float32(np.nan)
    return wrapped

  monkeypatch.setattr(rk, "_frozen_step", nan_after_12)
  job = _job(pair_dirs, data_file, tmp_path / "run")
  with pytest.raises(TrainError, match="loss is nan at step 13.*newest checkpoint, step 10"):
    train(job, show_progress=False)
  ckpt = Checkpoints(tmp_path / "run" / "checkpoints", job.train_fingerprint(), every=10)
  assert ckpt.latest_step() == 10
  assert not (tmp_path / "run" / "ranker.safetensors").exists()
