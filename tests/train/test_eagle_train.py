"""`python -m vocabjax.train.eagle` on a tiny target: stored features are the target's own,
the training-time test computes what tree decoding computes, training lowers the held-out loss,
resume is exact, the export loads and decodes greedy-identically, bad input."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.checkpoints.eagle3 import load_eagle3
from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams
from vocabjax.models.cache import KVCache
from vocabjax.models.eagle import (default_feature_layers, eagle_forward, fuse_features,
                                   init_eagle, training_feature_layers)
from vocabjax.models.llamalike import (forward, forward_features, lm_head, lm_head_weight,
                                      rms_norm)
from vocabjax.testing.tiny import save_tiny_variant
from vocabjax.train.eagle import EagleJob, main, train
from vocabjax.train.eagle_data import build_eagle_features, load_eagle_features
from vocabjax.train.eagle_step import head_config, ttt_outputs
from vocabjax.train.loop import TrainError


LAYERS = (0, 1)
# the references below run jitted (one program per shape; op by op, every op of every shape
# was a compile of its own: ~1,400 of them in this file)
_forward_features = jax.jit(forward_features, static_argnames=("config", "layers", "fresh"))
_forward = jax.jit(forward, static_argnames=("config", "fresh"))
_ttt_outputs = jax.jit(ttt_outputs, static_argnames=("config", "steps"))
_eagle_forward = jax.jit(eagle_forward, static_argnames=("config",))


def _job(target_dir, data_file, out, **kw):
  base = dict(target=str(target_dir), data=(str(data_file),), out=str(out),
              features=str(out.parent / "features"), feature_layers=LAYERS,
              draft_vocab_size=200, ttt_steps=3, seq_len=64, batch_size=4, steps=40,
              lr=3e-3, warmup_steps=4, eval_every=10, checkpoint_every=10, heldout=0.25,
              vocab_block=128)
  base.update(kw)
  return EagleJob(**base)


def test_features_are_the_targets_own(target_dir, data_file, tmp_path):
  job = _job(target_dir, data_file, tmp_path / "run")
  t = load_model(target_dir, dtype="float32")
  data = load_eagle_features(build_eagle_features(job, t, LAYERS, show_progress=False), t,
                             LAYERS)
  assert len(data.seqs) == 24
  _, toks, first = data.seqs[5]
  T = len(toks)
  h, _, f = _forward_features(t.params, jnp.asarray(toks)[None], jnp.arange(T)[None],
                              KVCache.init(t.config, 1, T), config=t.config, layers=LAYERS)
  np.testing.assert_allclose(data.feats[5].astype(np.float32), np.asarray(f[0]), rtol=2e-3,
                             atol=2e-3)  # stored as float16
  label = np.asarray(jnp.argmax(lm_head(t.params, h[0], config=t.config), -1))
  np.testing.assert_array_equal(data.labels[5], label)
  # the target wrote these completions greedily: its labels there are the text
  np.testing.assert_array_equal(data.labels[5][first:-1], toks[first + 1:])


def test_long_sequences_pad_to_multiples_and_keep_their_features(target_dir, data_file,
                                                                  tmp_path):
  """Sequences above FORWARD_STEP tokens pad to the next multiple of it (not a power of two);
  the stored features of such a record still equal its unpadded forward."""
  from vocabjax.train.features import FORWARD_STEP, forward_len

  assert [forward_len(n) for n in (1, 17, 64, 65, 129, 200, 257)] == [16, 32, 64, 128, 192,
                                                                       256, 320]
  assert all(forward_len(n) >= n and forward_len(n) - n < FORWARD_STEP for n in range(1, 900))
  t = load_model(target_dir, dtype="float32")
  rec = json.loads(data_file.read_text().splitlines()[0])
  rs = np.random.RandomState(1)
  rec["completion_ids"] = rs.randint(0, t.config.vocab_size, 140 - len(
      t.tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"])).tolist()
  long_file = tmp_path / "long.jsonl"
  long_file.write_text(json.dumps(rec) + "\n")
  job = _job(target_dir, long_file, tmp_path / "run", features=str(tmp_path / "feats"))
  data = load_eagle_features(build_eagle_features(job, t, LAYERS, show_progress=False), t,
                             LAYERS)
  _, toks, _ = data.seqs[0]
  T = len(toks)
  assert T == 140 and forward_len(T) == 192
  h, _, f = _forward_features(t.params, jnp.asarray(toks)[None], jnp.arange(T)[None],
                              KVCache.init(t.config, 1, T), config=t.config, layers=LAYERS)
  np.testing.assert_allclose(data.feats[0].astype(np.float32), np.asarray(f[0]), rtol=2e-3,
                             atol=2e-3)
  np.testing.assert_array_equal(data.labels[0],
                                np.asarray(jnp.argmax(lm_head(t.params, h[0], config=t.config),
                                                      -1)))


def test_torch_backend_features_equal_the_jax_ones(target_dir, data_file, tmp_path):
  """transformers' forward of the same checkpoint stores what vocabjax's does (f32), under its
  own fingerprint; bf16 is refused without the torch backend, the last layer with it."""
  t = load_model(target_dir, dtype="float32")
  jx = _job(target_dir, data_file, tmp_path / "j", feature_layers=(0,), max_records=6,
            features=str(tmp_path / "fj"))
  th = _job(target_dir, data_file, tmp_path / "t", feature_layers=(0,), max_records=6,
            features=str(tmp_path / "ft"), feature_backend="torch", final_hidden=True)
  assert jx.feature_fingerprint((0,)) != th.feature_fingerprint((0,))
  fj = build_eagle_features(jx, t, (0,), show_progress=False)
  a = load_eagle_features(fj, t, (0,))
  b = load_eagle_features(build_eagle_features(th, t, (0,), show_progress=False), t, (0,),
                          hidden=True)
  assert b.meta["feature_backend"] == "torch" and len(b.seqs) == 6 and a.hidden is None
  for i in range(6):
    np.testing.assert_allclose(b.feats[i].astype(np.float32), a.feats[i].astype(np.float32),
                               rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(b.labels[i], a.labels[i])
    # the final hidden state is the normed one the LM head reads
    _, toks, _ = b.seqs[i]
    T = len(toks)
    h, _ = _forward(t.params, jnp.asarray(toks)[None], jnp.arange(T)[None],
                    KVCache.init(t.config, 1, T), config=t.config)
    np.testing.assert_allclose(b.hidden[i].astype(np.float32), np.asarray(h[0]), rtol=2e-3,
                               atol=2e-3)
  with pytest.raises(TrainError, match="hold no final hidden states"):
    load_eagle_features(fj, t, (0,), hidden=True)
  with pytest.raises(TrainError, match="feature_dtype='bfloat16' needs feature_backend: torch"):
    _job(target_dir, data_file, tmp_path / "x", feature_dtype="bfloat16")
  with pytest.raises(TrainError, match=r"last entry is normed: layers \[0, 1\]"):
    build_eagle_features(_job(target_dir, data_file, tmp_path / "y", feature_backend="torch",
                              features=str(tmp_path / "fy")), t, LAYERS, show_progress=False)


@pytest.mark.extended
def test_features_per_data_file_reuse_a_files_features(target_dir, data_file, tmp_path):
  """A job over two data files with one features directory each reads what a job with one
  directory for both reads (records numbered on across the files), and the first file's
  directory, built by a job over that file alone, is reused as it is."""
  t = load_model(target_dir, dtype="float32")
  lines = data_file.read_text().splitlines()
  first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  first.write_text("\n".join(lines[:10]) + "\n")
  second.write_text("\n".join(lines[10:]) + "\n")
  one = _job(target_dir, first, tmp_path / "one", feature_layers=(0,),
             features=str(tmp_path / "fa"), final_hidden=True)
  build_eagle_features(one, t, (0,), show_progress=False)
  shard = tmp_path / "fa" / "shard-00000.npz"
  before = shard.stat().st_mtime_ns
  both = _job(target_dir, first, tmp_path / "both", feature_layers=(0,), final_hidden=True,
              data=(str(first), str(second)), features=str(tmp_path / "fab"))
  split = _job(target_dir, first, tmp_path / "split", feature_layers=(0,), final_hidden=True,
               data=(str(first), str(second)), features=[str(tmp_path / "fa"),
                                                         str(tmp_path / "fb")])
  assert split.features == (str(tmp_path / "fa"), str(tmp_path / "fb"))
  dirs = build_eagle_features(split, t, (0,), show_progress=False)
  assert dirs == split.feature_location == [tmp_path / "fa", tmp_path / "fb"]
  assert shard.stat().st_mtime_ns == before  # the first file's features were not rebuilt
  a = load_eagle_features(build_eagle_features(both, t, (0,), show_progress=False), t, (0,),
                          hidden=True)
  b = load_eagle_features(dirs, t, (0,), hidden=True)
  assert len(a.seqs) == len(b.seqs) == len(lines)
  assert [r for r, _, _ in b.seqs] == [r for r, _, _ in a.seqs] == list(range(len(lines)))
  assert b.meta["records"] == len(lines) and b.meta["data"] == [str(first), str(second)]
  for i in range(len(lines)):
    np.testing.assert_array_equal(a.seqs[i][1], b.seqs[i][1])
    assert a.seqs[i][2] == b.seqs[i][2]
    np.testing.assert_array_equal(a.feats[i], b.feats[i])
    np.testing.assert_array_equal(a.labels[i], b.labels[i])
    np.testing.assert_array_equal(a.hidden[i], b.hidden[i])
  # a job reads them: every record trains or is held out
  summary = train(dataclasses.replace(split, steps=2, warmup_steps=1, eval_every=2,
                                      checkpoint_every=2, ttt_steps=1), show_progress=False)
  assert summary["train_records"] + summary["heldout_records"] == len(lines)
  assert summary["complete"]
  with pytest.raises(TrainError, match="features lists 1 directories for 2 data files"):
    dataclasses.replace(split, features=(str(tmp_path / "fa"),))
  with pytest.raises(TrainError, match="names a directory twice"):
    dataclasses.replace(split, features=(str(tmp_path / "fa"), str(tmp_path / "fa")))
  with pytest.raises(TrainError, match="max_records=3 needs one features directory"):
    dataclasses.replace(split, max_records=3)
  with pytest.raises(TrainError, match="one per data file: read them with feature_parts"):
    split.features_dir
  with pytest.raises(TrainError, match="made by different targets or from different layers"):
    other = _job(target_dir, second, tmp_path / "o", feature_layers=(1,),
                 features=str(tmp_path / "fc"), final_hidden=True)
    build_eagle_features(other, t, (1,), show_progress=False)
    load_eagle_features([tmp_path / "fa", tmp_path / "fc"])


@pytest.mark.parametrize("native", [True, False])
def test_bf16_torch_features_warn_on_a_cpu_without_bf16(target_dir, data_file, tmp_path,
                                                        monkeypatch, capsys, native):
  from vocabjax.kernels import cpu_matmul

  monkeypatch.setattr(cpu_matmul, "has_native_bf16", lambda: native)
  t = load_model(target_dir, dtype="float32")
  job = _job(target_dir, data_file, tmp_path / "w", feature_layers=(0,), max_records=1,
             features=str(tmp_path / "fw"), feature_backend="torch", feature_dtype="bfloat16")
  build_eagle_features(job, t, (0,), show_progress=False)
  assert ("without AVX512-BF16" in capsys.readouterr().err) == (not native)


@pytest.mark.parametrize("width", [None, 24], ids=["target_mlp", "slim_mlp"])
def test_training_time_test_computes_what_tree_decoding_computes(target_dir, width):
  """Step j of the TTT loss at entry i = the head drafting j levels below the root at entry i
  in decoding (prefix with target features, then its own outputs), positions and masks
  included; for the target's MLP width and a slim head's."""
  t = load_model(target_dir, dtype="float32")
  hc = head_config(t.config, LAYERS, t.config.vocab_size, width)
  assert hc.layer.intermediate_size == (width or t.config.intermediate_size)
  params = init_eagle(jax.random.key(1), hc, scale=0.2)
  rs = np.random.RandomState(0)
  T, steps = 12, 3
  toks = rs.randint(0, t.config.vocab_size, T)
  _, _, f = _forward_features(t.params, jnp.asarray(toks)[None], jnp.arange(T)[None],
                              KVCache.init(t.config, 1, T), config=t.config, layers=LAYERS)
  batch = {"tokens": jnp.asarray(toks)[None], "feats": f, "dlabel": jnp.zeros((1, T), jnp.int32),
           "weight": jnp.ones((1, T))}
  outs = _ttt_outputs(params, t.params["embed"], batch, config=hc, steps=steps)
  eps = hc.layer.rms_norm_eps
  for i in (0, 4, 7):
    # decoding: entries 0..i from target features, then a chain of the head's own outputs
    cache = KVCache.init(hc.layer, 1, 32)
    x, cache = _eagle_forward(params, t.params["embed"], jnp.asarray(toks[1:i + 2])[None],
                              fuse_features(params, f[:, :i + 1]), jnp.arange(i + 1)[None],
                              cache, config=hc)
    x = x[:, -1:]
    for j in range(steps):
      if j:
        x, cache = _eagle_forward(params, t.params["embed"], jnp.asarray([[toks[i + 1 + j]]]),
                                  x, jnp.asarray([[i + j]]), cache, config=hc)
      np.testing.assert_allclose(np.asarray(outs[j][0][0, i]),
                                 np.asarray(rms_norm(x[0, 0], params["final_norm"], eps)),
                                 rtol=1e-4, atol=1e-5)


def test_packed_windows_compute_what_separate_windows_compute(target_dir):
  """Two records packed in one row (then padding): every TTT step's output, label and weight at
  a record's positions equal those of the record alone; labels past a record's end (the next
  record's tokens) weigh nothing."""
  t = load_model(target_dir, dtype="float32")
  hc = head_config(t.config, LAYERS, t.config.vocab_size, 24)
  params = init_eagle(jax.random.key(2), hc, scale=0.2)
  rs = np.random.RandomState(3)
  steps, lens, T = 3, (9, 11), 23

  def alone(toks):
    n = len(toks)
    _, _, f = _forward_features(t.params, jnp.asarray(toks)[None], jnp.arange(n)[None],
                                KVCache.init(t.config, 1, n), config=t.config, layers=LAYERS)
    return {"tokens": jnp.asarray(toks)[None], "feats": f,
            "dlabel": jnp.asarray(rs.randint(0, 50, n))[None], "weight": jnp.ones((1, n))}

  recs = [alone(rs.randint(0, t.config.vocab_size, n)) for n in lens]
  F = recs[0]["feats"].shape[-1]
  packed = {"tokens": np.zeros((1, T), np.int32), "feats": np.zeros((1, T, F), np.float32),
            "dlabel": np.full((1, T), -1, np.int32), "weight": np.zeros((1, T), np.float32),
            "segment": np.full((1, T), -1, np.int32), "position": np.zeros((1, T), np.int32)}
  o = 0
  for k, (n, r) in enumerate(zip(lens, recs)):
    for key in ("tokens", "feats", "dlabel", "weight"):
      packed[key][0, o:o + n] = np.asarray(r[key][0])
    packed["segment"][0, o:o + n] = k
    packed["position"][0, o:o + n] = np.arange(n)
    o += n
  outs = _ttt_outputs(params, t.params["embed"], {k: jnp.asarray(v) for k, v in packed.items()},
                      config=hc, steps=steps)
  o = 0
  for n, r in zip(lens, recs):
    ref = _ttt_outputs(params, t.params["embed"], r, config=hc, steps=steps)
    for j in range(steps):
      (hn, label, weight), (rh, rl, rw) = outs[j], ref[j]
      valid = n - 1 - j  # queries whose label lies inside the record
      np.testing.assert_allclose(np.asarray(hn[0, o:o + valid]), np.asarray(rh[0, :valid]),
                                 rtol=1e-4, atol=1e-5)
      np.testing.assert_array_equal(np.asarray(label[0, o:o + valid]),
                                    np.asarray(rl[0, :valid]))
      np.testing.assert_array_equal(np.asarray(weight[0, o:o + valid]),
                                    np.asarray(rw[0, :valid]))
      assert valid > 0 and float(jnp.sum(weight[0, o + valid:o + n])) == 0
    o += n
  assert all(float(jnp.sum(w[0, o:])) == 0 for _, _, w in outs)  # padding


@pytest.mark.extended
def test_packed_batches_and_training(target_dir, data_file, tmp_path):
  """make_packed_batch fills rows with whole records or windows of them (segments, positions,
  completion weights as in make_batch), and a packed job trains under its own fingerprint."""
  from vocabjax.train.eagle_data import PACK_MIN, make_batch, make_packed_batch

  job = _job(target_dir, data_file, tmp_path / "run", pack=True, seq_len=128, batch_size=6)
  assert job.train_fingerprint() != _job(target_dir, data_file, tmp_path / "run")\
      .train_fingerprint()
  t = load_model(target_dir, dtype="float32")
  data = load_eagle_features(build_eagle_features(job, t, LAYERS, show_progress=False), t,
                             LAYERS)
  t2d = np.arange(t.config.vocab_size, dtype=np.int32)
  train_idx = list(range(20))
  b = make_packed_batch(data, train_idx, np.random.RandomState(0), job, t2d)
  assert b["tokens"].shape == (6, 128)
  many = 0
  for row in range(6):
    seg = b["segment"][row]
    used = int(np.sum(seg >= 0))
    assert 128 - used < PACK_MIN and np.all(seg[:used] >= 0) and np.all(seg[used:] == -1)
    many += seg.max() > 0
    for k in range(seg.max() + 1):
      at = np.flatnonzero(seg == k)
      assert np.array_equal(at, np.arange(at[0], at[-1] + 1))  # contiguous
      np.testing.assert_array_equal(b["position"][row, at], np.arange(len(at)))
      # the window is some training record's tokens [s, s + len), weighted as make_batch does
      toks = b["tokens"][row, at]
      found = [(r, s) for r in train_idx for s in range(len(data.seqs[r][1]) - len(at) + 1)
               if np.array_equal(data.seqs[r][1][s:s + len(at)], toks)]
      assert found
      r, s = found[0]
      one = make_batch(data, [r], None, dataclasses.replace(job, seq_len=len(at)), t2d,
                       window_start=s)
      for key in ("feats", "dlabel", "weight"):
        np.testing.assert_array_equal(b[key][row, at], one[key][0])
  assert many >= 3  # short records: most rows hold more than one
  summary = train(dataclasses.replace(job, steps=20, eval_every=20, checkpoint_every=20),
                  show_progress=False)
  assert summary["final"]["heldout_loss"] < 0.8 * summary["start"]["heldout_loss"]


@pytest.mark.extended
def test_training_lowers_the_loss_exports_and_decodes(target_dir, data_file, tmp_path):
  job = _job(target_dir, data_file, tmp_path / "run")
  summary = train(job, show_progress=False)
  start, final = summary["start"], summary["final"]
  assert final["heldout_loss"] < 0.7 * start["heldout_loss"]
  assert final["acc_0"] > start["acc_0"] + 0.2
  assert summary["complete"] and summary["head_vocab"] == 200
  by_source = summary["heldout_by_source"]  # records without a source field: their file's dir
  assert list(by_source) == [data_file.parent.name] and by_source[data_file.parent.name][
      "acc_0"] == pytest.approx(final["acc_0"])
  log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
  assert [r["step"] for r in log] == [0, 10, 20, 30, 40]
  assert (tmp_path / "run" / "curves.png").stat().st_size > 0

  t = load_model(target_dir, dtype="float32")
  hc, head, rec = load_eagle3(tmp_path / "run" / "head", target_config=t.config)
  assert rec["fingerprint"] and hc.draft_vocab_size == 200 and hc.feature_layers == LAYERS
  cfg = json.loads((tmp_path / "run" / "head" / "config.json").read_text())
  assert cfg["vocabjax"]["row"]["step"] == summary["exported"]["step"]
  # decoding with the trained head: identical to plain greedy, and it drafts better than an
  # untrained head of the same vocabulary
  data = load_eagle_features(job.features_dir)
  prompts = [list(map(int, toks[:first + 1])) for _, toks, first in data.seqs[:6]]
  ar = Decoder(t.params, t.config).generate(prompts, max_new_tokens=16)
  tree = TreeParams(2, 3, 6)
  res = SpeculativeEngine(t.params, t.config,
                          EagleProposer(t.params, t.config, head, hc,
                                        tree=tree)).generate(prompts, max_new_tokens=16)
  assert res.tokens == ar.tokens
  untrained = {**init_eagle(jax.random.key(0), hc), "lm_head": head["lm_head"],
               "d2t": head["d2t"]}
  res0 = SpeculativeEngine(t.params, t.config,
                           EagleProposer(t.params, t.config, untrained, hc,
                                         tree=tree)).generate(prompts, max_new_tokens=16)
  assert res0.tokens == ar.tokens
  assert res.stats.tau > res0.stats.tau + 0.3


@pytest.mark.extended
def test_resume_is_exact(target_dir, data_file, tmp_path):
  kw = dict(steps=12, eval_every=6, checkpoint_every=3, select_by=None)
  straight = _job(target_dir, data_file, tmp_path / "straight", **kw)
  train(straight, show_progress=False)
  resumed = _job(target_dir, data_file, tmp_path / "resumed", **kw)
  first = train(resumed, show_progress=False, stop_after=5)  # checkpoint at 5 (forced)
  assert not first["complete"] and not (tmp_path / "resumed" / "head").exists()
  train(resumed, show_progress=False)
  _, a, _ = load_eagle3(tmp_path / "straight" / "head")
  _, b, _ = load_eagle3(tmp_path / "resumed" / "head")
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for (path, va), vb in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(va), np.asarray(vb), err_msg=str(path))
  log = [json.loads(x)["step"] for x in
         (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
  assert log == [0, 6, 12]


@pytest.mark.extended
def test_rerunning_a_finished_job_reuses_its_per_source_evaluation(target_dir, data_file,
                                                                   tmp_path, monkeypatch):
  """A finished job rerun (the papers' pipeline reruns every part) restores its last
  checkpoint and does not evaluate again (minutes with a full-vocabulary head); a summary that
  does not match the run (another last row) is recomputed."""
  import vocabjax.train.eagle as eagle_mod

  job = _job(target_dir, data_file, tmp_path / "run", steps=6, eval_every=6,
             checkpoint_every=6)
  first = train(job, show_progress=False)
  calls = []
  real = eagle_mod.evaluate_heldout
  monkeypatch.setattr(eagle_mod, "evaluate_heldout",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  again = train(job, show_progress=False)
  assert calls == [] and again["heldout_by_source"] == first["heldout_by_source"]
  path = tmp_path / "run" / "summary.json"
  stale = json.loads(path.read_text())
  stale["final"]["acc_0"] += 0.5
  stale["heldout_by_source"][data_file.parent.name]["acc_0"] = -1.0
  path.write_text(json.dumps(stale))
  third = train(job, show_progress=False)
  assert calls and third["heldout_by_source"] == first["heldout_by_source"]


@pytest.mark.extended
def test_frozen_target_head_and_full_vocabulary(target_dir, data_file, tmp_path):
  job = _job(target_dir, data_file, tmp_path / "run", draft_vocab_size=None,
             train_lm_head=False, steps=10, eval_every=10)
  train(job, show_progress=False)
  t = load_model(target_dir, dtype="float32")
  hc, head, _ = load_eagle3(tmp_path / "run" / "head", target_config=t.config)
  assert hc.draft_vocab_size == t.config.vocab_size
  np.testing.assert_array_equal(np.asarray(head["lm_head"]), np.asarray(t.params["lm_head"]))
  assert not np.asarray(head["d2t"]).any()


@pytest.mark.extended
def test_train_fraction_keeps_the_split_and_the_vocabulary(target_dir, data_file, tmp_path):
  """A data-size ablation (`train_fraction`) trains on the first part of the training records;
  the held-out records and the head's vocabulary stay those of the whole data; a job without
  the field keeps its fingerprint; a fraction outside (0, 1] is refused by value."""
  kw = dict(steps=2, warmup_steps=1, eval_every=2, select_by=None)
  whole = train(_job(target_dir, data_file, tmp_path / "whole", **kw), show_progress=False)
  half = train(_job(target_dir, data_file, tmp_path / "half", train_fraction=0.5, **kw),
               show_progress=False)
  assert half["train_records"] == round(whole["train_records"] / 2)
  assert half["heldout_records"] == whole["heldout_records"]
  assert half["train_label_positions"] < whole["train_label_positions"]
  _, a, _ = load_eagle3(tmp_path / "whole" / "head")
  _, b, _ = load_eagle3(tmp_path / "half" / "head")
  np.testing.assert_array_equal(np.asarray(a["d2t"]), np.asarray(b["d2t"]))
  job = _job(target_dir, data_file, tmp_path / "x")
  import dataclasses
  import hashlib

  from vocabjax.train.loop import RUN_ONLY_FIELDS

  before = dataclasses.asdict(job)  # the job as written before the fields existed
  for k in (*RUN_ONLY_FIELDS, "train_fraction", "pack", "init_head", "heldout_split",
            "train_subset", "compute_dtype", "prompt_labels", "soft_labels"):
    before.pop(k, None)
  assert job.train_fingerprint() == hashlib.sha256(
      json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
  assert job.train_fingerprint() != _job(target_dir, data_file, tmp_path / "x",
                                         train_fraction=0.5).train_fingerprint()
  for bad in (0.0, 1.5):
    with pytest.raises(TrainError, match=rf"train_fraction={bad} must be in \(0, 1\]"):
      _job(target_dir, data_file, tmp_path / "x", train_fraction=bad)
  # a random held-out split: as many held-out prompts, another job
  rnd = _job(target_dir, data_file, tmp_path / "rnd", heldout_split="random", **kw)
  assert rnd.train_fingerprint() != job.train_fingerprint()
  assert train(rnd, show_progress=False)["heldout_records"] == whole["heldout_records"]
  with pytest.raises(TrainError, match="heldout_split='first' is not 'last' or 'random'"):
    _job(target_dir, data_file, tmp_path / "x", heldout_split="first")
  # a random half of the training records: as many as the first half, the same held-out ones
  rhalf = train(_job(target_dir, data_file, tmp_path / "rhalf", train_fraction=0.5,
                     train_subset="random", **kw), show_progress=False)
  assert (rhalf["train_records"], rhalf["heldout_records"]) == (half["train_records"],
                                                                half["heldout_records"])
  with pytest.raises(TrainError, match="train_subset='last' is not 'first' or 'random'"):
    _job(target_dir, data_file, tmp_path / "x", train_subset="last")


@pytest.mark.extended
def test_fine_tuning_starts_from_an_exported_head(target_dir, data_file, tmp_path):
  """`init_head`: training starts from the head's weights and vocabulary (its first held-out
  figures are the head's own on the same split), goes on lowering the loss, and its fingerprint
  follows the head; a head of another shape or target, or none, is refused before features."""
  kw = dict(steps=10, eval_every=10, select_by=None)
  base = train(_job(target_dir, data_file, tmp_path / "base", **kw), show_progress=False)
  head = str(tmp_path / "base" / "head")
  ft = _job(target_dir, data_file, tmp_path / "ft", init_head=head, steps=20)
  summary = train(ft, show_progress=False)
  for k in ("heldout_loss", "acc_0", "acc_2"):
    assert summary["start"][k] == pytest.approx(base["final"][k], rel=1e-5, abs=1e-6), k
  assert summary["final"]["heldout_loss"] < summary["start"]["heldout_loss"]
  _, a, _ = load_eagle3(head)
  _, b, _ = load_eagle3(tmp_path / "ft" / "head")
  np.testing.assert_array_equal(np.asarray(a["d2t"]), np.asarray(b["d2t"]))
  assert not np.array_equal(np.asarray(a["fc"]), np.asarray(b["fc"]))
  # the fingerprint: another head at the same path is another job; none keeps the old one
  fp = ft.train_fingerprint()
  assert fp != dataclasses.replace(ft, init_head=None).train_fingerprint()
  cfg = Path(head) / "config.json"
  raw = json.loads(cfg.read_text())
  raw["vocabjax"]["row"]["step"] = 3
  cfg.write_text(json.dumps(raw))
  assert ft.train_fingerprint() != fp

  def refused(match, **kw):
    fdir = tmp_path / "fx"
    with pytest.raises(TrainError, match=match):
      train(_job(target_dir, data_file, tmp_path / "bad", features=str(fdir), **kw),
            show_progress=False)
    assert not fdir.exists()

  refused(r"has draft_vocab_size=200, this job 150", init_head=head, draft_vocab_size=150)
  refused(r"has intermediate_size=\d+, this job 24", init_head=head, intermediate_size=24)
  refused(r"has feature_layers=\[0, 1\], this job \[1\]", init_head=head,
          feature_layers=(1,))
  refused(r"nohead.*No such file", init_head=str(tmp_path / "nohead"))
  other = save_tiny_variant("qwen2_bias", tmp_path / "other", seed=9, with_tokenizer=True)
  with pytest.raises(TrainError, match=r"init_head=.*base/head"):
    train(_job(other, data_file, tmp_path / "bad", features=str(tmp_path / "fo"),
               init_head=head), show_progress=False)
  with pytest.raises(TrainError, match="keeps that head's vocabulary"):
    _job(target_dir, data_file, tmp_path / "x", init_head=head,
         vocab_counts=(str(tmp_path / "c.npz"),))
  with pytest.raises(TrainError, match="where this job exports its own head"):
    _job(target_dir, data_file, tmp_path / "base", init_head=head)


def test_bad_input(target_dir, data_file, tmp_path):
  job = _job(target_dir, data_file, tmp_path / "run", steps=2, warmup_steps=1)
  other = save_tiny_variant("qwen2_bias", tmp_path / "other", seed=9, with_tokenizer=True)
  o = load_model(other, dtype="float32")
  t = load_model(target_dir, dtype="float32")
  fdir = build_eagle_features(job, t, LAYERS, show_progress=False)
  with pytest.raises(TrainError, match="made by another target.*fingerprint"):
    load_eagle_features(fdir, o, LAYERS)
  with pytest.raises(TrainError, match=r"fuse layers \[0, 1\], the job wants \[1\]"):
    load_eagle_features(fdir, t, (1,))
  # training for another target on these features: the shard directory refuses
  with pytest.raises(TrainError, match="holds features of other data or models"):
    train(_job(other, data_file, tmp_path / "run2", steps=2, warmup_steps=1),
          show_progress=False)
  with pytest.raises(TrainError, match=r"feature_layers=\[0, 5\] must be target layers in "
                                       r"\[0, 2\)"):
    train(_job(target_dir, data_file, tmp_path / "run3", feature_layers=(0, 5),
               features=str(tmp_path / "f3")), show_progress=False)
  with pytest.raises(TrainError, match="draft_vocab_size=999 must be in"):
    train(_job(target_dir, data_file, tmp_path / "run4", draft_vocab_size=999,
               features=str(tmp_path / "f4")), show_progress=False)
  assert not (tmp_path / "f4").exists()  # refused before any feature was built
  with pytest.raises(TrainError, match="ttt_steps=0"):
    _job(target_dir, data_file, tmp_path / "x", ttt_steps=0)
  with pytest.raises(TrainError, match="warmup_steps=4, total_steps=2"):
    _job(target_dir, data_file, tmp_path / "x", steps=2)
  # an exported head refuses another target
  train(job, show_progress=False)
  wide = save_tiny_variant("qwen2_bias", tmp_path / "wide", seed=9, vocab_size=400,
                           with_tokenizer=True)
  with pytest.raises(ValueError, match="V=400"):
    load_eagle3(tmp_path / "run" / "head",
                target_config=load_model(wide, dtype="float32").config)


def test_cli(target_dir, data_file, tmp_path, capsys):
  cfg = tmp_path / "eagle.yaml"
  cfg.write_text(f"target: {target_dir}\ndata: {data_file}\nout: {tmp_path / 'run'}\n"
                 # the shapes of `_job`'s runs: the CLI trains the program they compiled
                 f"feature_layers: [0, 1]\ndraft_vocab_size: 200\nttt_steps: 3\nseq_len: 64\n"
                 f"batch_size: 4\nvocab_block: 128\n"
                 f"steps: 4\neval_every: 2\ncheckpoint_every: 2\nwarmup_steps: 1\n"
                 f"heldout: 0.25\n")
  assert main(["--config", str(cfg), "--quiet"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["complete"] and out["final"]["step"] == 4
  assert (tmp_path / "run" / "head" / "model.safetensors").exists()
  bad = tmp_path / "bad.yaml"
  bad.write_text(f"target: {target_dir}\ndata: {data_file}\nout: x\nttt_step: 3\n")
  assert main(["--config", str(bad)]) == 2
  assert "unknown fields ['ttt_step']" in capsys.readouterr().err


@pytest.mark.extended
def test_data_source_comparison(target_dir, data_file, tmp_path, capsys):
  """train/eagle_data_source.py: heads trained on two completions of the same prompts (the
  target's own and random text) scored on the target run's held-out records; the target's own
  greedy text agrees with its labels everywhere, random text rarely; a run that trained on
  the held-out prompts is refused, one that held them out (and more) is scored."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(
      "eagle_data_source", Path(__file__).parents[2] / "train" / "eagle_data_source.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  rs = np.random.RandomState(5)
  t = load_model(target_dir, dtype="float32")
  other = tmp_path / "other.jsonl"
  recs = [json.loads(x) for x in data_file.read_text().splitlines()]
  other.write_text("".join(json.dumps({**r, "completion_ids": rs.randint(
      0, t.config.vocab_size, len(r["completion_ids"])).tolist()}) + "\n" for r in recs))
  # the packed shapes of test_packed_batches_and_training: one compiled training step
  kw = dict(steps=4, eval_every=2, checkpoint_every=4, pack=True, select_by="acc_0",
            seq_len=128, batch_size=6)  # what is scored, not how well: a few steps
  runs = []
  for name, f in (("own", data_file), ("random", other)):
    job = _job(target_dir, f, tmp_path / name, features=str(tmp_path / f"feats_{name}"), **kw)
    train(job, show_progress=False)
    runs.append(tmp_path / name)
  res = mod.compare(runs, runs[0], target=t)
  own, rnd = res["runs"]
  assert own["text_is_label"] == 1.0 and rnd["text_is_label"] < 0.5
  assert res["heldout_records"] == 6 and 0 <= rnd["on_eval"]["acc_0"] <= 1
  # the own-text head scored on its own held-out records: what training exported
  assert own["on_eval"]["acc_0"] == pytest.approx(own["own_heldout"]["acc_0"])
  assert "| own |" in mod.report(res, "cmd") and "| random |" in mod.report(res, "cmd")
  leaky, wider = tmp_path / "leaky", tmp_path / "wider"
  for out, heldout in ((leaky, 0.1), (wider, 0.5)):
    train(_job(target_dir, data_file, out, features=str(tmp_path / "feats_own"),
               **kw, heldout=heldout), show_progress=False)
  with pytest.raises(ValueError, match=r"leaky trained on \d+ of the \d+ prompts"):
    mod.compare([leaky], runs[0], target=t)
  assert [r["run"] for r in mod.compare([wider], runs[0], target=t)["runs"]] == ["wider"]
  assert mod.main(["--run", str(tmp_path / "missing"), "--eval-on", str(runs[0]),
                   "--out", str(tmp_path / "r.md")]) == 2
  assert "summary.json does not exist" in capsys.readouterr().err


@pytest.mark.extended
def test_mixed_precision_training(target_dir, data_file, tmp_path):
  """compute_dtype bfloat16: the TTT loss and its gradients stay within bf16 rounding of the
  f32 ones (but are not them), a run has its own fingerprint and still learns, and a bad
  dtype is refused."""
  from vocabjax.lowering import Lowering
  from vocabjax.train.eagle_step import ttt_loss

  t = load_model(target_dir, dtype="float32")
  hc = head_config(t.config, LAYERS, t.config.vocab_size)
  params = init_eagle(jax.random.key(2), hc, scale=0.2)
  params["lm_head"] = lm_head_weight(t.params, t.config)
  d2t = params.pop("d2t")
  rs = np.random.RandomState(1)
  B, T = 2, 24
  _, _, f = _forward_features(t.params, jnp.asarray(rs.randint(0, t.config.vocab_size, (B, T))),
                              jnp.broadcast_to(jnp.arange(T), (B, T)),
                              KVCache.init(t.config, B, T), config=t.config, layers=LAYERS)
  batch = {"tokens": jnp.asarray(rs.randint(0, t.config.vocab_size, (B, T))), "feats": f,
           "dlabel": jnp.asarray(rs.randint(0, t.config.vocab_size, (B, T))),
           "weight": jnp.ones((B, T))}
  frozen = {"embed": t.params["embed"], "d2t": d2t}

  def loss(p, on):
    return ttt_loss(p, frozen, batch, config=hc, steps=3, decay=0.8, block=128,
                    lowering=Lowering(bf16_dots=on))[0]

  out = {on: jax.jit(jax.value_and_grad(lambda p, on=on: loss(p, on)))(params)
         for on in (False, True)}
  (l32, g32), (l16, g16) = out[False], out[True]
  assert l16 != l32 and abs(float(l16) - float(l32)) < 2e-2 * abs(float(l32))
  for (path, a), b in zip(jax.tree.leaves_with_path(g32), jax.tree.leaves(g16)):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.linalg.norm(b - a) <= 5e-2 * np.linalg.norm(a), jax.tree_util.keystr(path)

  job = _job(target_dir, data_file, tmp_path / "run", compute_dtype="bfloat16", steps=20,
             eval_every=20, checkpoint_every=20)
  assert job.train_fingerprint() != dataclasses.replace(job, compute_dtype="float32")\
      .train_fingerprint()
  summary = train(job, show_progress=False)
  assert summary["final"]["heldout_loss"] < 0.8 * summary["start"]["heldout_loss"]
  with pytest.raises(TrainError, match="compute_dtype='float16'"):
    dataclasses.replace(job, compute_dtype="float16")


def test_heldout_evaluation_batches_windows_without_changing_it(target_dir, data_file, tmp_path):
  """evaluate_heldout scores batch_size windows per call (the last batch padded): the same
  figures as one window per call, records longer than a window included."""
  from vocabjax.train.eagle_step import evaluate_heldout

  job = _job(target_dir, data_file, tmp_path / "run", seq_len=16, batch_size=3)
  t = load_model(target_dir, dtype="float32")
  data = load_eagle_features(build_eagle_features(job, t, LAYERS, show_progress=False), t,
                             LAYERS)
  held = list(range(7))
  assert sum(-(-(len(data.seqs[r][1]) - 1) // 15) for r in held) % 3  # a padded last batch
  hc = head_config(t.config, LAYERS, t.config.vocab_size)
  params = init_eagle(jax.random.key(3), hc, scale=0.2)
  params["lm_head"] = lm_head_weight(t.params, t.config)
  frozen = {"embed": t.params["embed"], "d2t": params.pop("d2t")}
  t2d = np.arange(t.config.vocab_size, dtype=np.int32)
  batched = evaluate_heldout(params, frozen, data, held, job, t2d, hc, {})
  one = evaluate_heldout(params, frozen, data, held, dataclasses.replace(job, batch_size=1),
                         t2d, hc, {})
  # windows that end inside the prompt are skipped: some are here, and nothing changes
  short = dataclasses.replace(job, seq_len=8)
  assert any(s + 8 <= data.seqs[r][2] for r in held
             for s in range(0, len(data.seqs[r][1]) - 1, 7))
  every = evaluate_heldout(params, frozen, data, held, short, t2d, hc, {}, all_windows=True)
  skipped = evaluate_heldout(params, frozen, data, held, short, t2d, hc, {})
  assert batched.keys() == one.keys() == every.keys() == skipped.keys()
  for k in batched:
    assert batched[k] == pytest.approx(one[k], rel=1e-5), k
    assert skipped[k] == pytest.approx(every[k], rel=1e-5), k
  assert batched["heldout_loss"] > 0 and skipped["heldout_loss"] > 0  # labels were scored


@pytest.mark.extended
def test_prompt_labels_train_on_every_position_and_keep_the_heldout_figures(target_dir,
                                                                            data_file, tmp_path):
  """prompt_labels: training batches weigh every slot of a window (the prompt's positions too)
  where the plain job weighs completion slots only, with the same tokens, features and labels;
  the held-out evaluation (completion positions) is the same; the job has its own fingerprint
  and counts the prompt's positions among its training labels."""
  from vocabjax.train.eagle_step import evaluate_heldout
  from vocabjax.train.eagle_data import make_batch, make_packed_batch

  plain = _job(target_dir, data_file, tmp_path / "plain", pack=True, seq_len=128,
               batch_size=6)  # test_packed_batches_and_training's shapes: its program
  job = dataclasses.replace(plain, out=str(tmp_path / "run"), prompt_labels=True)
  assert job.train_fingerprint() != dataclasses.replace(plain, out=job.out).train_fingerprint()
  assert plain.train_fingerprint() == dataclasses.replace(plain, prompt_labels=False)\
      .train_fingerprint()
  t = load_model(target_dir, dtype="float32")
  data = load_eagle_features(build_eagle_features(job, t, LAYERS, show_progress=False), t,
                             LAYERS)
  t2d = np.arange(t.config.vocab_size, dtype=np.int32)
  train_idx = list(range(20))
  a = make_packed_batch(data, train_idx, np.random.RandomState(0), plain, t2d)
  b = make_packed_batch(data, train_idx, np.random.RandomState(0), job, t2d)
  for key in ("tokens", "feats", "dlabel", "segment", "position"):
    np.testing.assert_array_equal(a[key], b[key])
  np.testing.assert_array_equal(b["weight"], (b["segment"] >= 0).astype(np.float32))
  assert np.all(a["weight"] <= b["weight"]) and a["weight"].sum() < 0.8 * b["weight"].sum()
  one = make_batch(data, [0], None, job, t2d, window_start=0, prompt=True)
  L = len(data.seqs[0][1])
  assert one["weight"][0, :L].all() and not one["weight"][0, L:].any()

  hc = head_config(t.config, LAYERS, t.config.vocab_size)
  params = init_eagle(jax.random.key(3), hc, scale=0.2)
  params["lm_head"] = lm_head_weight(t.params, t.config)
  frozen = {"embed": t.params["embed"], "d2t": params.pop("d2t")}
  assert evaluate_heldout(params, frozen, data, [20, 21], job, t2d, hc, {}) == \
      evaluate_heldout(params, frozen, data, [20, 21], plain, t2d, hc, {})

  kw = dict(steps=20, eval_every=20, checkpoint_every=20)
  summary = train(dataclasses.replace(job, **kw), show_progress=False)
  # the plain job's start figures and label count: a few steps (its learning is not checked)
  base = train(dataclasses.replace(plain, steps=4, eval_every=4, checkpoint_every=4),
               show_progress=False)
  assert summary["final"]["heldout_loss"] < 0.8 * summary["start"]["heldout_loss"]
  assert _figures(summary["start"]) == _figures(base["start"])  # the same held-out figures
  assert summary["train_label_positions"] == sum(len(data.seqs[i][1]) for i in range(
      len(data.seqs)) if data.seqs[i][0] not in _heldout(data, job))
  assert base["train_label_positions"] < summary["train_label_positions"]


def _figures(row):
  return {k: v for k, v in row.items() if k != "time"}


def _heldout(data, job):
  from vocabjax.train.features import heldout_records
  return set(heldout_records(data, job.heldout, job.heldout_split, job.seed).tolist())


@pytest.mark.extended
def test_soft_labels_are_the_targets_distribution(target_dir, data_file, tmp_path,
                                                    monkeypatch):
  """soft_labels: the stored final hidden states give the target's distribution, whose argmax
  is the hard label at every slot; sharpened, the soft TTT loss is the hard one step by step
  (so each step's distribution sits at its label's slot); a soft job trains under its own
  fingerprint, from the same held-out figures; without final_hidden it is refused."""
  from vocabjax.train.eagle_data import make_packed_batch
  from vocabjax.train.eagle_step import ttt_loss

  with pytest.raises(TrainError, match="soft_labels: true needs final_hidden: true"):
    _job(target_dir, data_file, tmp_path / "x", soft_labels=True)
  job = _job(target_dir, data_file, tmp_path / "run", soft_labels=True, final_hidden=True,
             draft_vocab_size=None, pack=True, seq_len=64)
  hard = dataclasses.replace(job, soft_labels=False, out=str(tmp_path / "hard"))
  assert job.train_fingerprint() != dataclasses.replace(hard, out=job.out).train_fingerprint()
  t = load_model(target_dir, dtype="float32")
  data = load_eagle_features(build_eagle_features(job, t, LAYERS, show_progress=False), t,
                             LAYERS, hidden=True)
  V = t.config.vocab_size
  t2d = np.arange(V, dtype=np.int32)
  b = make_packed_batch(data, list(range(20)), np.random.RandomState(0), job, t2d)
  W = lm_head_weight(t.params, t.config)
  z = jnp.einsum("BTD,VD->BTV", jnp.asarray(b["hidden"], jnp.float32), W)
  used = b["segment"] >= 0
  top = np.asarray(jnp.argmax(z, -1))
  assert used.sum() > 100  # the labels are the f32 argmax, the hidden states stored in f16
  assert np.mean(top[used] == b["dlabel"][used]) > 0.97

  hc = head_config(t.config, LAYERS, V)
  params = init_eagle(jax.random.key(4), hc, scale=0.2)
  params["lm_head"] = W
  frozen = {"embed": t.params["embed"], "d2t": params.pop("d2t")}
  jb = {k: jnp.asarray(v) for k, v in b.items()}
  kw = dict(config=hc, steps=3, decay=0.8, block=128)
  # the hard loss against the stored hidden states' own argmax (not a near tie's other side)
  _, ce_hard = ttt_loss(params, frozen, {**jb, "dlabel": jnp.asarray(top)}, **kw)
  sharp = {**jb, "hidden": jb["hidden"].astype(jnp.float32) * 1e5}  # one-hot but for ties
  _, ce_sharp = ttt_loss(params, frozen, sharp, teacher=W, **kw)
  np.testing.assert_allclose(np.asarray(ce_sharp), np.asarray(ce_hard), rtol=1e-4)
  _, ce_soft = ttt_loss(params, frozen, jb, teacher=W, **kw)
  assert np.all(np.abs(np.asarray(ce_soft) - np.asarray(ce_hard)) > 1e-3)
  # the teacher's distribution once per batch, in vocabulary blocks (several: V > block; one:
  # V <= block), or, past TEACHER_PROBS_BYTES, per step block by block: the same loss and
  # gradients
  import vocabjax.train.eagle_step as eagle_step
  assert V > kw["block"]

  def loss_and_grad(batch, **over):
    return jax.value_and_grad(lambda p: ttt_loss(p, frozen, batch, teacher=W, **{**kw, **over}),
                              has_aux=True)(params)

  (_, ce_shared), g_shared = loss_and_grad(jb)
  (_, ce_one), g_one = loss_and_grad(jb, block=4 * V)
  monkeypatch.setattr(eagle_step, "TEACHER_PROBS_BYTES", 0)
  (_, ce_per_step), g_per_step = loss_and_grad(jb)
  _, ce_per_step_sharp = ttt_loss(params, frozen, sharp, teacher=W, **kw)
  monkeypatch.undo()
  np.testing.assert_allclose(np.asarray(ce_soft), np.asarray(ce_shared), rtol=1e-6)
  for ce in (ce_one, ce_per_step):
    np.testing.assert_allclose(np.asarray(ce), np.asarray(ce_shared), rtol=1e-5)
  for g in (g_one, g_per_step):
    for a, e in zip(jax.tree.leaves(g), jax.tree.leaves(g_shared)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-4, atol=1e-6)
  assert any(np.any(np.asarray(a)) for a in jax.tree.leaves(g_shared))
  np.testing.assert_allclose(np.asarray(ce_per_step_sharp), np.asarray(ce_hard), rtol=1e-4)
  _, ce_one_sharp = ttt_loss(params, frozen, sharp, teacher=W, **{**kw, "block": 4 * V})
  np.testing.assert_allclose(np.asarray(ce_one_sharp), np.asarray(ce_hard), rtol=1e-4)

  run = dict(steps=20, eval_every=20, checkpoint_every=20)
  summary = train(dataclasses.replace(job, **run), show_progress=False)
  base = train(dataclasses.replace(hard, **run), show_progress=False)
  assert _figures(summary["start"]) == _figures(base["start"])
  # the tiny random target's distributions are flat: its argmax is learned more slowly from
  # them than from hard labels, but it is learned
  assert summary["final"]["heldout_loss"] < summary["start"]["heldout_loss"] - 0.5
  assert summary["final"]["acc_0"] > summary["start"]["acc_0"] + 0.1


@pytest.mark.extended
def test_a_ranker_for_a_full_vocabulary_head(target_dir, data_file, tmp_path):
  """SpecVocab on an EAGLE head (the papers' setting): a head over the target's whole
  vocabulary (draft_vocab_size null, the target's LM head frozen), then a ranker trained on its
  normed depth-0 outputs over the head's own training features. The rows are what the head's
  drafting policy reads; training raises the held-out recall; the ranker drafts losslessly;
  a head with a reduced vocabulary is refused by name."""
  from vocabjax.train.ranker import RankerJob, load_head, train as train_ranker
  from vocabjax.train.features import load_features
  from vocabjax.vocab.ranked import Ranker, SpeculativeVocab

  head_job = _job(target_dir, data_file, tmp_path / "head_run", draft_vocab_size=None,
                  train_lm_head=False, steps=10, eval_every=10)  # as the frozen-head test
  train(head_job, show_progress=False)
  head = tmp_path / "head_run" / "head"
  rjob = RankerJob(drafter=str(target_dir), data=(str(data_file),), out=str(tmp_path / "r"),
                   eagle_head=str(head), eagle_features=head_job.features, rank=8, steps=30,
                   batch_tokens=64, lr=1e-2, warmup_steps=3, eval_every=10,
                   checkpoint_every=10, heldout=0.25, recall_k=(4, 16, 64), vocab_block=100,
                   init="random", select_by="recall@16_target")
  summary = train_ranker(rjob, show_progress=False)
  assert summary["complete"]
  assert summary["final"]["recall@16_target"] > summary["start"]["recall@16_target"]
  assert summary["final"]["recall@16_drafter"] > 0.5  # the head's own greedy tokens are ranked

  t = load_model(target_dir, dtype="float32")
  hc, hp = load_head(rjob, t)
  feats = load_features(rjob.features_dir)
  data = load_eagle_features(head_job.features_dir)
  # record 3's rows, recomputed step by step as the decoder runs the head (with a cache)
  rec, toks, first = data.seqs[3]
  T = len(toks)
  c = hc.layer
  cache = KVCache(k=jnp.zeros((1, 1, T, c.num_kv_heads, c.head_dim)),
                  v=jnp.zeros((1, 1, T, c.num_kv_heads, c.head_dim)),
                  lengths=jnp.zeros((1,), jnp.int32))
  fused = fuse_features(hp, jnp.asarray(data.feats[3][None, :T - 1], jnp.float32))
  x, _ = _eagle_forward(hp, t.params["embed"], jnp.asarray(toks[None, 1:]), fused,
                        jnp.arange(T - 1)[None], cache, config=hc)
  normed = np.asarray(rms_norm(x[0], hp["final_norm"], c.rms_norm_eps))
  mine = feats.record == rec
  rows = np.arange(first - 1, T - 2)
  np.testing.assert_allclose(feats.hidden[mine], normed[rows], rtol=2e-4, atol=2e-4)
  np.testing.assert_array_equal(feats.label[mine], data.labels[3][rows + 1])

  prompts = [list(map(int, s[:f + 1])) for _, s, f in data.seqs[:4]]
  ar = Decoder(t.params, t.config).generate(prompts, max_new_tokens=12)
  ranker = Ranker.load(tmp_path / "r" / "ranker.safetensors")
  for tree in (TreeParams(1, 3, 3), TreeParams(2, 2, 4)):
    res = SpeculativeEngine(
        t.params, t.config,
        EagleProposer(t.params, t.config, hp, hc, tree=tree, lm_head="target",
                      draft_vocab=SpeculativeVocab(ranker,
                                                   k=16))).generate(prompts, max_new_tokens=12)
    assert res.tokens == ar.tokens

  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.train.features import model_identity

  hc_small = head_config(t.config, LAYERS, 200)  # an untrained head with its own 200 tokens
  small = init_eagle(jax.random.key(2), hc_small)
  small["d2t"] = jnp.zeros((200,), jnp.int32)
  save_eagle3(small, hc_small, tmp_path / "small_head", target=model_identity(t))
  bad = dataclasses.replace(rjob, eagle_head=str(tmp_path / "small_head"),
                            out=str(tmp_path / "r2"), features=str(tmp_path / "f2"))
  with pytest.raises(TrainError, match="drafts over 200 tokens, not the target's V="):
    train_ranker(bad, show_progress=False)
  other = dataclasses.replace(rjob, data=(str(tmp_path / "other.jsonl"),),
                              out=str(tmp_path / "r3"), features=str(tmp_path / "f3"))
  with pytest.raises(TrainError, match="are not the files eagle_features"):
    train_ranker(other, show_progress=False)


@pytest.mark.extended
def test_a_router_for_a_full_vocabulary_head(target_dir, data_file, tmp_path):
  """DynaSpec on an EAGLE head (the papers' setting): a router trained on the head's normed
  depth-0 outputs, the rows a SpecVocab ranker for the head reads (one feature directory,
  shared), clustering the head's LM-head rows (the target's); it drafts losslessly through the
  head's `vocab` setting and is refused by a drafter it was not trained for."""
  from vocabjax.methods import METHODS
  from vocabjax.train.ranker import RankerJob, build_head_features
  from vocabjax.train.router import RouterJob, train as train_router
  from vocabjax.vocab.clustered import ClusterRouter, ClusteredVocab, RouterError

  head_job = _job(target_dir, data_file, tmp_path / "head_run", draft_vocab_size=None,
                  train_lm_head=False, steps=4, eval_every=4)
  train(head_job, show_progress=False)
  head = tmp_path / "head_run" / "head"
  shared = tmp_path / "head_rows"
  rjob = RankerJob(drafter=str(target_dir), data=(str(data_file),), out=str(tmp_path / "r"),
                   features=str(shared), eagle_head=str(head),
                   eagle_features=head_job.features, rank=8)
  build_head_features(rjob, show_progress=False)
  made = {f.name: f.stat().st_mtime_ns for f in shared.iterdir()}
  job = RouterJob(drafter=str(target_dir), data=(str(data_file),), out=str(tmp_path / "router"),
                  features=str(shared), eagle_head=str(head), eagle_features=head_job.features,
                  clusters=8, cluster_iters=2, steps=30, batch_tokens=64, lr=3e-2,
                  warmup_steps=3, eval_every=10, checkpoint_every=10, heldout=0.25,
                  recall_top=(1, 2, 4))
  assert job.head_job().head_feature_fingerprint() == rjob.head_feature_fingerprint()
  summary = train_router(job, show_progress=False)
  assert {f.name: f.stat().st_mtime_ns for f in shared.iterdir()} == made  # read, not redone
  assert summary["complete"]
  log = [json.loads(x) for x in (tmp_path / "router" / "log.jsonl").read_text().splitlines()]
  assert log[-1]["heldout_loss"] < log[0]["heldout_loss"]
  r = ClusterRouter.load(tmp_path / "router" / "router.safetensors")
  t = load_model(target_dir, dtype="float32")
  assert r.vocab_size == t.config.vocab_size
  assert r.drafter["source"].startswith("eagle head for ")
  hc, hp, _ = load_eagle3(head, target_config=t.config)
  r.check_drafter({"lm_head": hp["lm_head"]}, dataclasses.replace(t.config,
                                                                  tie_word_embeddings=False))
  other = load_model(save_tiny_variant("qwen2_bias", tmp_path / "other", seed=9,
                                       with_tokenizer=True), dtype="float32")
  with pytest.raises(RouterError, match="another drafter"):
    r.check_drafter(other.params, other.config)

  data = load_eagle_features(head_job.features_dir)
  prompts = [list(map(int, s[:f + 1])) for _, s, f in data.seqs[:4]]
  ar = Decoder(t.params, t.config).generate(prompts, max_new_tokens=12)
  for tree in (TreeParams(1, 3, 3), TreeParams(2, 2, 4)):
    res = SpeculativeEngine(
        t.params, t.config,
        EagleProposer(t.params, t.config, hp, hc, tree=tree, lm_head="target",
                      draft_vocab=ClusteredVocab(r, top=2))).generate(prompts,
                                                                      max_new_tokens=12)
    assert res.tokens == ar.tokens
  dec = METHODS["eagle"].make(t, None, {
      "head": str(head), "lm_head": "target", "top_k": 1, "depth": 3, "total_tokens": 3,
      "vocab": f"dynaspec:router={tmp_path / 'router' / 'router.safetensors'},top=2"})
  assert type(dec.proposer.draft_vocab).__name__ == "ClusteredVocab"
  assert dec.generate(prompts, max_new_tokens=12).tokens == ar.tokens


def test_default_layers_of_a_trained_head_are_distinct_and_in_order():
  """A head trained without feature_layers reads the authors' (1, L/2 - 1, L - 4) where those
  are three distinct increasing layers; a shallow target's low / middle / last instead of the
  authors' repeats ((1, 1, 0) on 4 layers), which a loaded head without ids still reads."""
  assert default_feature_layers(4) == (1, 1, 0)  # the authors' formula, kept for loading
  assert training_feature_layers(4) == (1, 2, 3)
  assert training_feature_layers(28) == default_feature_layers(28) == (1, 13, 24)
  for L in range(1, 65):
    layers = training_feature_layers(L)
    assert list(layers) == sorted(set(layers)) and 0 <= layers[0] and layers[-1] < L, (L, layers)
    assert len(layers) == min(3, L), (L, layers)
