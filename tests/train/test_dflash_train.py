"""`python -m vocabjax.train.dflash` on a tiny target: the training pass computes what block
drafting computes, the labels and anchors are the completion's, training raises the held-out
accepted length, the export loads and decodes greedy-identically, resume is exact, the features
are an EAGLE job's, bad input."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.models import CFG
from vocabjax.checkpoints.dflash import load_dflash
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder
from vocabjax.decoding.dflash import DFlashProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models import init_params
from vocabjax.models.cache import KVCache
from vocabjax.models.dflash import (DFlashConfig, block_forward, context_prefill, init_dflash,
                                    training_forward)
from vocabjax.train.dflash import DFlashJob, main, train
from vocabjax.train.dflash_step import block_labels, valid_anchors
from vocabjax.train.eagle_data import build_eagle_features, load_eagle_features
from vocabjax.train.loop import TrainError

_training_forward = jax.jit(training_forward, static_argnames=("config",))
_block_forward = jax.jit(block_forward, static_argnames=("config",))
_context_prefill = jax.jit(context_prefill, static_argnames=("config",))


def _config(block=4, **changes):
  layer = CFG.replace(arch="qwen3", qk_norm=True, attention_bias=False, num_layers=2)
  return DFlashConfig(layer=layer, target_hidden_size=CFG.hidden_size, target_layer_ids=(0, 1),
                      block_size=block, mask_token_id=5, **changes)


@pytest.mark.parametrize("case", ["plain", "sliding-causal-scaled"])
def test_training_pass_computes_what_block_drafting_computes(case):
  """Each block of a window, drafted in one training pass, equals `block_forward` over a draft
  cache holding the window's entries before its anchor; a window at other absolute positions
  (the end of a long record) gives the same (RoPE is relative)."""
  dc = _config(4)
  if case != "plain":
    dc = dataclasses.replace(dc, causal=True, input_embedding_scale=1.3,
                             layer=dc.layer.replace(layer_types=("sliding_attention",
                                                                 "full_attention"),
                                                    sliding_window=3))
  dp = init_dflash(jax.random.key(1), dc, scale=0.3)
  embed = init_params(jax.random.key(2), CFG)["embed"]
  rs = np.random.RandomState(0)
  B, T = 2, 12
  tokens = jnp.asarray(rs.randint(0, CFG.vocab_size, (B, T)), jnp.int32)
  feats = jnp.asarray(rs.randn(B, T, dc.fused_width), jnp.float32)
  anchors = jnp.asarray([[1, 4, 9], [2, 3, 11]], jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(T), (B, T))
  got = np.asarray(_training_forward(dp, embed, tokens, feats, pos, anchors, config=dc))
  shifted = _training_forward(dp, embed, tokens, feats, pos + 37, anchors, config=dc)
  np.testing.assert_allclose(np.asarray(shifted), got, atol=2e-5)
  for b in range(B):
    for j, a in enumerate(np.asarray(anchors[b]).tolist()):
      cache = KVCache.init(dc.cache_config(), 1, T + dc.block_size)
      if a:
        cache = _context_prefill(dp, feats[b:b + 1, :a], cache, config=dc).with_lengths(
            jnp.asarray([a], jnp.int32))
      block = jnp.asarray([[int(tokens[b, a])] + [dc.mask_token_id] * (dc.block_size - 1)])
      want, _ = _block_forward(dp, embed, block, jnp.zeros((1, 1, dc.fused_width)),
                               jnp.zeros((1,), jnp.int32), cache, config=dc)
      np.testing.assert_allclose(got[b, j], np.asarray(want[0]), atol=2e-5,
                                 err_msg=f"row {b} anchor {a}")


def test_labels_and_anchors_are_the_completions():
  """A block's labels are the text after its anchor, weighted exp(-(k - 1) / gamma) where they
  are completion tokens inside the window, 0 past it or on a padded anchor."""
  dc = _config(4)
  T = 8
  batch = {"tokens": jnp.arange(10, 10 + T)[None], "completion": jnp.asarray(
               [[0, 0, 0, 1, 1, 1, 1, 0]], jnp.float32),  # slot 7: padding
           "anchors": jnp.asarray([[3, 5, 0]]), "keep": jnp.asarray([[1.0, 1.0, 0.0]])}
  labels, valid, weights = block_labels(batch, dc, 2.0)
  np.testing.assert_array_equal(np.asarray(labels[0, 0]), [14, 15, 16])
  np.testing.assert_array_equal(np.asarray(valid[0]), [[1, 1, 1], [1, 0, 0], [0, 0, 0]])
  np.testing.assert_allclose(np.asarray(weights[0, 0]), np.exp(-np.arange(3) / 2.0))


def _job(target_dir, data_file, out, **kw):
  base = dict(target=str(target_dir), data=(str(data_file),), out=str(out),
              features=str(out.parent / "features"), target_layer_ids=(0,), num_layers=1,
              intermediate_size=64, block_size=4, mask_token_id=3, seq_len=48, batch_size=4,
              anchors=6, steps=60, lr=3e-3, warmup_steps=4, eval_every=20,
              checkpoint_every=20, heldout=0.25, eval_stride=1, vocab_block=128)
  base.update(kw)
  return DFlashJob(**base)


def test_anchors_sit_in_the_completion(target_dir, data_file, tmp_path):
  job = _job(target_dir, data_file, tmp_path / "run")
  t = load_model(target_dir, dtype="float32")
  data = load_eagle_features(build_eagle_features(job.feature_job((0,)), t, (0,),
                                                  show_progress=False), t, (0,))
  for r in range(len(data.seqs)):
    _, toks, first = data.seqs[r]
    s = max(0, len(toks) - job.seq_len)
    a = valid_anchors(data, r, job.seq_len)
    assert len(a) == len(toks) - first - 2  # every completion token with one after it
    assert (s + a > first).all() and (s + a + 1 < len(toks)).all()


@pytest.mark.extended
def test_training_raises_the_accepted_length_exports_and_decodes(target_dir, data_file,
                                                                  tmp_path):
  job = _job(target_dir, data_file, tmp_path / "run")
  summary = train(job, show_progress=False)
  start, final = summary["start"], summary["final"]
  assert summary["complete"] and final["heldout_loss"] < 0.9 * start["heldout_loss"]
  assert final["tau"] > start["tau"] + 0.4 and final["acc_1"] > start["acc_1"] + 0.2
  log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
  assert [r["step"] for r in log] == [0, 20, 40, 60]
  t = load_model(target_dir, dtype="float32")
  dc, dp = load_dflash(tmp_path / "run" / "drafter", target_config=t.config)
  assert dc.target_layer_ids == (0,) and dc.block_size == 4 and dc.mask_token_id == 3
  rec = json.loads((tmp_path / "run" / "drafter" / "config.json").read_text())["vocabjax"]
  assert rec["row"] == summary["exported"] and rec["row"]["tau"] == max(r["tau"] for r in log)
  # decoding with it: plain greedy's tokens, and more of them accepted than untrained
  data = load_eagle_features(job.feature_job().features_dir)
  prompts = [list(map(int, toks[:first + 1])) for _, toks, first in data.seqs[:6]]
  ar = Decoder(t.params, t.config).generate(prompts, max_new_tokens=16)

  def run(params):
    return SpeculativeEngine(t.params, t.config, DFlashProposer(t.params, t.config, params, dc)
                             ).generate(prompts, max_new_tokens=16)

  res, res0 = run(dp), run(init_dflash(jax.random.key(0), dc))
  assert res.tokens == ar.tokens and res0.tokens == ar.tokens
  assert res.stats.tau > res0.stats.tau + 0.3, (res.stats.tau, res0.stats.tau)
  # the features are an EAGLE job's over the same layers: nothing to build again
  shards = sorted((tmp_path / "features").glob("shard-*.npz"))
  mtimes = [p.stat().st_mtime_ns for p in shards]
  build_eagle_features(job.feature_job((0,)), t, (0,), show_progress=False)
  assert [p.stat().st_mtime_ns for p in shards] == mtimes


@pytest.mark.extended
def test_resume_is_exact(target_dir, data_file, tmp_path):
  kw = dict(steps=8, eval_every=4, checkpoint_every=2, select_by=None)
  train(_job(target_dir, data_file, tmp_path / "straight", **kw), show_progress=False)
  resumed = _job(target_dir, data_file, tmp_path / "resumed", **kw)
  first = train(resumed, show_progress=False, stop_after=3)
  assert not first["complete"] and not (tmp_path / "resumed" / "drafter").exists()
  train(resumed, show_progress=False)
  _, a = load_dflash(tmp_path / "straight" / "drafter")
  _, b = load_dflash(tmp_path / "resumed" / "drafter")
  for (path, va), vb in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(va), np.asarray(vb), err_msg=str(path))


def test_bad_input(target_dir, data_file, tmp_path, capsys):
  with pytest.raises(TrainError, match=r"target_layer_ids=\[0, 1\]: layers \[1\] are not in "
                                       r"0 \.\. 0"):
    train(_job(target_dir, data_file, tmp_path / "a", target_layer_ids=(0, 1),
               features=str(tmp_path / "fa")), show_progress=False)
  assert not (tmp_path / "fa").exists()  # refused before any feature was built
  with pytest.raises(TrainError, match="mask_token_id=999 lies outside the vocabulary"):
    train(_job(target_dir, data_file, tmp_path / "b", mask_token_id=999,
               features=str(tmp_path / "fb")), show_progress=False)
  for change, msg in [({"block_size": 1}, "block_size=1"),
                      ({"seq_len": 3}, "seq_len=3 is shorter than a block"),
                      ({"loss_decay_gamma": 0.0}, "loss_decay_gamma=0.0 must be > 0"),
                      ({"select_by": "acc_0"}, "select_by='acc_0'"),
                      ({"anchors": 0}, "anchors=0")]:
    with pytest.raises(TrainError, match=msg):
      _job(target_dir, data_file, tmp_path / "x", **change)
  bad = tmp_path / "bad.yaml"
  bad.write_text(f"target: {target_dir}\ndata: {data_file}\nout: x\nanchor: 3\n")
  assert main(["--config", str(bad)]) == 2
  assert "unknown fields ['anchor']" in capsys.readouterr().err


@pytest.mark.extended
def test_a_ranker_for_a_trained_drafter(target_dir, data_file, tmp_path):
  """SpecVocab over a DFlash drafter: a ranker trained on the drafter's drafted positions (the
  rows its policy reads at decoding, over the features it was trained on) ranks its greedy
  tokens and drafts losslessly; an EAGLE head and a drafter at once are refused."""
  from vocabjax.train.features import load_features
  from vocabjax.train.ranker import RankerJob, train as train_ranker
  from vocabjax.vocab.ranked import Ranker, SpeculativeVocab

  job = _job(target_dir, data_file, tmp_path / "run", steps=40)
  train(job, show_progress=False)
  drafter = tmp_path / "run" / "drafter"
  rjob = RankerJob(drafter=str(target_dir), data=(str(data_file),), out=str(tmp_path / "r"),
                   dflash_drafter=str(drafter), eagle_features=job.features, anchor_stride=2,
                   rank=8, steps=30, batch_tokens=64, lr=1e-2, warmup_steps=3, eval_every=10,
                   checkpoint_every=10, heldout=0.25, recall_k=(4, 16, 64), vocab_block=100,
                   label="drafter", vocab="tied", select_by="recall@16_drafter")
  summary = train_ranker(rjob, show_progress=False)
  assert summary["complete"] and summary["final"]["recall@16_drafter"] > 0.8

  t = load_model(target_dir, dtype="float32")
  dc, dp = load_dflash(drafter, target_config=t.config)
  feats = load_features(rjob.features_dir)
  data = load_eagle_features(job.feature_job().features_dir)
  # record 2's rows: its anchors 0, 2, 4, ... of the completion, each block's drafted
  # positions, as one pass of block drafting computes them over the record's features
  rec, toks, first = data.seqs[2]
  mine = feats.record == rec
  anchors = valid_anchors(data, 2, len(toks))[::2]
  a = int(anchors[1])
  cache = KVCache.init(dc.cache_config(), 1, len(toks) + dc.block_size)
  cache = _context_prefill(dp, jnp.asarray(data.feats[2][None, :a], jnp.float32), cache,
                           config=dc).with_lengths(jnp.asarray([a], jnp.int32))
  embed = t.params["embed"]
  block = jnp.asarray([[int(toks[a])] + [dc.mask_token_id] * (dc.block_size - 1)])
  h, _ = _block_forward(dp, embed, block, jnp.zeros((1, 1, dc.fused_width)),
                        jnp.zeros((1,), jnp.int32), cache, config=dc)
  G = dc.gamma
  np.testing.assert_allclose(feats.hidden[mine][G:2 * G], np.asarray(h[0, 1:]), atol=2e-4)
  np.testing.assert_array_equal(feats.label[mine][G:2 * G], toks[a + 1:a + 1 + G])

  prompts = [list(map(int, s[:f + 1])) for _, s, f in data.seqs[:4]]
  ar = Decoder(t.params, t.config).generate(prompts, max_new_tokens=12)
  vocab = SpeculativeVocab(Ranker.load(tmp_path / "r" / "ranker.safetensors"), k=16)
  res = SpeculativeEngine(t.params, t.config, DFlashProposer(
      t.params, t.config, dp, dc, draft_vocab=vocab)).generate(prompts, max_new_tokens=12)
  assert res.tokens == ar.tokens and res.stats.tau > 1.0
  with pytest.raises(TrainError, match="give eagle_head or dflash_drafter, not both"):
    dataclasses.replace(rjob, eagle_head=str(drafter))


@pytest.mark.extended  # a head of its own stays in the core
def test_a_softmax_over_the_frequent_tokens(target_dir, data_file, tmp_path):
  """`loss_vocab`: the training softmax over the head's rows of the training completions' most
  frequent tokens (labels outside weigh nothing); the held-out figures still read the whole
  head, and the drafter still drafts through it losslessly."""
  from vocabjax.train.dflash import loss_vocab_ids

  job = _job(target_dir, data_file, tmp_path / "run", loss_vocab=48)
  summary = train(job, show_progress=False)
  assert summary["loss_rows"] == 48 and summary["complete"]
  assert summary["final"]["tau"] > summary["start"]["tau"] + 0.3
  data = load_eagle_features(job.feature_job().features_dir)
  ids = loss_vocab_ids(data, range(len(data.seqs)), 5, 320)
  counts = np.bincount(np.concatenate([t[f + 1:] for _, t, f in data.seqs]), minlength=320)
  assert sorted(counts[ids]) == sorted(counts)[-5:] and (np.diff(ids) > 0).all()
  t = load_model(target_dir, dtype="float32")
  dc, dp = load_dflash(tmp_path / "run" / "drafter", target_config=t.config)
  prompts = [list(map(int, s[:f + 1])) for _, s, f in data.seqs[:4]]
  ar = Decoder(t.params, t.config).generate(prompts, max_new_tokens=12)
  res = SpeculativeEngine(t.params, t.config, DFlashProposer(t.params, t.config, dp, dc)
                          ).generate(prompts, max_new_tokens=12)
  assert res.tokens == ar.tokens


@pytest.mark.extended
def test_a_head_of_its_own(target_dir, data_file, tmp_path):
  """`draft_vocab_size`: a head of its own over the training completions' most frequent tokens,
  started from the target's rows and trained with the layers; exported in speculators' layout
  (d2t offsets to those ids), it drafts only them and decodes as plain decoding does."""
  job = _job(target_dir, data_file, tmp_path / "run", draft_vocab_size=48)
  summary = train(job, show_progress=False)
  assert summary["complete"] and summary["draft_vocab_size"] == 48
  start, final = summary["start"], summary["final"]
  assert final["tau"] > start["tau"] + 0.3 and 0.5 < final["coverage"] <= 1.0
  raw = json.loads((tmp_path / "run" / "drafter" / "config.json").read_text())
  assert raw["speculators_model_type"] == "dflash" and raw["aux_hidden_state_layer_ids"] == [1]
  t = load_model(target_dir, dtype="float32")
  dc, dp = load_dflash(tmp_path / "run" / "drafter", target_config=t.config)
  data = load_eagle_features(job.feature_job().features_dir)
  assert dc.draft_vocab_size == 48 and dp["lm_head"].shape == (48, t.config.hidden_size)
  got = np.asarray(dp["d2t"]) + np.arange(48)  # the training completions' 48 commonest ids
  seen = np.concatenate([s[f + 1:] for _, s, f in data.seqs])
  counts = np.bincount(seen, minlength=t.config.vocab_size)
  assert (np.diff(got) > 0).all() and counts[got].sum() >= np.sort(counts)[-48:].sum() * 0.9
  prompts = [list(map(int, s[:f + 1])) for _, s, f in data.seqs[:4]]
  ar = Decoder(t.params, t.config).generate(prompts, max_new_tokens=12)
  res = SpeculativeEngine(t.params, t.config, DFlashProposer(t.params, t.config, dp, dc)
                          ).generate(prompts, max_new_tokens=12)
  assert res.tokens == ar.tokens and res.stats.tau > 1.2
  with pytest.raises(TrainError, match="a head of its own is its softmax already"):
    _job(target_dir, data_file, tmp_path / "x", draft_vocab_size=48, loss_vocab=32)


def test_allow_bin_reaches_a_trainers_target(target_dir, data_file, tmp_path, capsys,
                                            monkeypatch):
  """A target with only pickled weights: a trainer's command line refuses it with the remedy,
  and `--allow-bin` (as generate's and eval's) reads it."""
  import shutil

  import torch
  import yaml
  from safetensors.numpy import load_file

  monkeypatch.setenv("VOCABJAX_ALLOW_BIN", "0")  # restored after, whatever --allow-bin sets
  pickled = tmp_path / "pickled"
  shutil.copytree(target_dir, pickled)
  weights = load_file(pickled / "model.safetensors")
  torch.save({k: torch.from_numpy(v.copy()) for k, v in weights.items()},
             pickled / "pytorch_model.bin")
  (pickled / "model.safetensors").unlink()
  job = dataclasses.asdict(_job(pickled, data_file, tmp_path / "run", steps=2, eval_every=2,
                                warmup_steps=1,
                                checkpoint_every=2))
  cfg = tmp_path / "job.yaml"
  cfg.write_text(yaml.safe_dump({k: list(v) if isinstance(v, tuple) else v
                                 for k, v in job.items() if v is not None}))
  assert main(["--config", str(cfg), "--quiet"]) == 2
  assert "only pickled PyTorch weights" in capsys.readouterr().err
  assert main(["--config", str(cfg), "--quiet", "--allow-bin"]) == 0
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["complete"]
