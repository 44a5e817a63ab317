"""Hybrid distillation of a cross-vocabulary drafter (reverse KL on direct-mapped tokens +
lambda NLL on n-gram tokens), LoRA shapes and merge, the acceptance head (joint / interleaved),
export / load, bad input. Tiny models with two different trained BPE tokenizers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.checkpoints.loader import Model
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.crossvocab import CrossVocabProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.testing.tiny import tiny_tokenizer
from vocabjax.checkpoints.distilled import DistilledError, load_distilled
from vocabjax.train.distill import DistillJob, align, online, train
from vocabjax.models.lora import init_lora, merge, num_params
from vocabjax.train.loop import TrainError
from vocabjax.vocab.translate import Translator

DRAFT_CORPUS = ["The lazy dog sleeps while the quick fox runs.", "def mul(a, b):\n    return a * b\n",
                "Bonjour le monde, comment allez-vous ?", "print('hello world')"] * 20


def cfg(V, D=32):
  return LlamaLikeConfig(arch="llama", vocab_size=V, hidden_size=D, intermediate_size=48,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                         max_position_embeddings=1024)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """(target Model, drafter Model, completions jsonl of the target's greedy outputs)."""
  ttok, dtok = tiny_tokenizer(400), tiny_tokenizer(340, corpus=DRAFT_CORPUS)
  tc, dc = cfg(len(ttok)), cfg(len(dtok), D=48)
  target = Model(tc, init_params(jax.random.key(0), tc, scale=0.3), ttok, (2,), "tiny-target",
                 jnp.float32)
  draft = Model(dc, init_params(jax.random.key(1), dc, scale=0.3), dtok, (2,), "tiny-draft",
                jnp.float32)
  rs = np.random.RandomState(0)
  words = ["def", "return", "fox", "print", "Hello", "quick", "brown", "lazy", "world"]
  texts = [" ".join(rs.choice(words, rs.randint(2, 6))) for _ in range(10)]
  ids = [ttok(x, add_special_tokens=False)["input_ids"] for x in texts]
  res = Decoder(target.params, tc).generate(ids, max_new_tokens=24)
  path = tmp_path_factory.mktemp("distill") / "completions.jsonl"
  path.write_text("".join(json.dumps({"prompt": x, "completion_ids": c}) + "\n"
                          for x, c in zip(texts, res.tokens)))
  return target, draft, path


def job(tmp_path, data, **kw):
  base = dict(target="tiny-target", drafter="tiny-draft", data=(str(data),),
              out=str(tmp_path / "out"), steps=30, lr=3e-3, warmup_steps=2, eval_every=10,
              checkpoint_every=10, heldout=0.0)  # figures on training records: the fit
  return DistillJob(**{**base, **kw})


def test_align_marks_direct_and_ngram_tokens(pair):
  target, draft, _ = pair
  tr = Translator(target.tokenizer, draft.tokenizer)
  comp = target.tokenizer(" quick brown fox", add_special_tokens=False)["input_ids"]
  prompt = target.tokenizer("Hello", add_special_tokens=False)["input_ids"]
  a = align(tr, prompt, comp, max_tokens=512)
  toks = a["tokens"].tolist()
  # the drafter text is the prompt + completion, spelled token by token
  assert draft.tokenizer.decode(toks) == "Hello quick brown fox"
  spelled = [tr.to_drafter([t]) for t in comp]
  assert len(a["dm_pos"]) == sum(len(s) == 1 for s in spelled)
  assert len(a["ng_pos"]) == sum(len(s) for s in spelled if len(s) > 1) > 0
  # a direct position predicts its token's drafter id; n-gram labels are the sub-tokens
  for pos, row in zip(a["dm_pos"], a["dm_row"]):
    assert toks[pos + 1] == tr.t2d[comp[row]]
  for pos, lab in zip(a["ng_pos"], a["ng_label"]):
    assert toks[pos + 1] == lab


def test_lora_shapes_and_merge():
  c = cfg(64)
  params = init_params(jax.random.key(0), c)
  lora = init_lora(jax.random.key(1), params, rank=4)
  ad = lora["layers"][0]
  assert ad["wq"]["a"].shape == (4, c.hidden_size) and ad["wq"]["b"].shape == (c.q_dim, 4)
  assert ad["w_down"]["a"].shape == (4, c.intermediate_size)
  assert num_params(lora) == c.num_layers * sum(
      4 * (o + i) for o, i in [(c.q_dim, 32), (c.kv_dim, 32), (c.kv_dim, 32), (32, c.q_dim),
                               (48, 32), (48, 32), (32, 48)])
  same = merge(params, lora, alpha=8.0)  # B = 0 at init: the base model
  assert all(jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(same),
                                                   jax.tree.leaves(params)))
  lora["layers"][1]["wv"]["b"] = jnp.ones_like(lora["layers"][1]["wv"]["b"])
  got = merge(params, lora, alpha=8.0)["layers"][1]["wv"]
  want = params["layers"][1]["wv"] + 2.0 * jnp.ones((c.kv_dim, 4)) @ lora["layers"][1]["wv"]["a"]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  with pytest.raises(ValueError, match="rank=64 exceeds"):
    init_lora(jax.random.key(1), params, rank=64)


@pytest.mark.extended
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_distillation_lowers_loss_and_exports(pair, tmp_path, lora_rank):
  target, draft, data = pair
  j = job(tmp_path, data, lora_rank=lora_rank, lora_alpha=8.0, lr=2e-2 if lora_rank else 3e-3)
  s = train(j, show_progress=False, models=(target, draft))
  first, last = s["first"], s["last"]
  assert s["complete"] and last["held_l_dm"] < 0.8 * first["held_l_dm"]
  assert last["held_l_ngram"] < first["held_l_ngram"]
  assert last["held_agree"] >= first["held_agree"]
  params, head = load_distilled(tmp_path / "out" / "drafter", draft.params, draft.config)
  assert head is None
  changed = [not jnp.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                        jax.tree.leaves(draft.params))]
  assert any(changed)
  if lora_rank:  # LoRA never touches the embedding / LM head, only the projections
    assert jnp.array_equal(params["embed"], draft.params["embed"])
    meta = json.loads((tmp_path / "out" / "drafter" / "distill.json").read_text())
    assert meta["mode"] == "lora" and meta["lora_rank"] == 4
  # the distilled drafter decodes losslessly with the target
  ids = [target.tokenizer("quick fox", add_special_tokens=False)["input_ids"]]
  ref = Decoder(target.params, target.config).generate(ids, max_new_tokens=16)
  dec = SpeculativeEngine(
      target.params, target.config,
      CrossVocabProposer(params, draft.config, target.config, target_tokenizer=target.tokenizer,
                         draft_tokenizer=draft.tokenizer))
  assert dec.generate(ids, max_new_tokens=16).tokens == ref.tokens
  # another base drafter is refused
  other = init_params(jax.random.key(7), draft.config, scale=0.3)
  with pytest.raises(DistilledError, match="was distilled for another drafter"):
    load_distilled(tmp_path / "out" / "drafter", other, draft.config)


@pytest.mark.extended
@pytest.mark.parametrize("mode", ["joint", "interleaved"])
def test_acceptance_head_trains(pair, tmp_path, mode):
  target, draft, data = pair
  j = job(tmp_path, data, acceptance=mode, acceptance_label="greedy", steps=40, lora_rank=4,
          lora_alpha=8.0)
  s = train(j, show_progress=False, models=(target, draft))
  first, last = s["first"], s["last"]
  assert last["held_l_acc"] < first["held_l_acc"]
  assert 0 <= last["held_label_mean"] <= 1
  _, head = load_distilled(tmp_path / "out" / "drafter", draft.params, draft.config)
  assert head is not None and head["w1"].shape == (2 * draft.config.hidden_size, 256)


def test_resume_and_bad_input(pair, tmp_path):
  target, draft, data = pair
  j = job(tmp_path, data, steps=12)
  s = train(j, show_progress=False, stop_after=5, models=(target, draft))
  assert not s["complete"] and s["step"] == 5
  s = train(j, show_progress=False, models=(target, draft))
  assert s["complete"] and s["step"] == 12
  # the target side of another job is refused
  other = job(tmp_path, data, steps=12, max_tokens=300, features=str(tmp_path / "out" /
                                                                     "features"),
              out=str(tmp_path / "other"))
  with pytest.raises(TrainError, match="target features of another job"):
    train(other, show_progress=False, models=(target, draft))
  empty = tmp_path / "empty.jsonl"
  empty.write_text("")
  with pytest.raises(TrainError, match="no completion records"):
    train(job(tmp_path, empty, out=str(tmp_path / "e")), show_progress=False,
          models=(target, draft))
  with pytest.raises(TrainError, match="acceptance='sometimes'"):
    job(tmp_path, data, acceptance="sometimes")
  with pytest.raises(TrainError, match="online_every=0"):
    job(tmp_path, data, online_every=0)
  # a negative loss weight trained (it turns the rejection loss into a reward for rejecting)
  for field, value in (("rejection_weight", -3.0), ("lam", float("nan")), ("lr", 0.0),
                       ("acceptance_mu", "1")):
    with pytest.raises(TrainError, match=f"{field}="):
      job(tmp_path, data, **{field: value})


@pytest.fixture(scope="module")
def online_pair(pair, tmp_path_factory):
  """One online run (4 qa prompts, an update of 3 steps every 2 sequences) and its frozen
  control on the same stream (online_steps=0): shared by the tests of the online mode, the
  control and the report (each run compiles and trains; one pair serves them all)."""
  target, draft, _ = pair
  root = tmp_path_factory.mktemp("online")
  kw = dict(online=({"kind": "spec_bench", "categories": ["qa"], "limit": 4},),
            online_every=2, max_new_tokens=12, lr=1e-2)
  out = {}
  for d, steps in (("l", 3), ("c", 0)):
    out[d] = online(job(root / d, "unused", online_steps=steps, **kw), show_progress=False,
                    models=(target, draft))
  return root, out["l"], out["c"]


@pytest.mark.extended
def test_online_mode_updates_the_drafter_while_staying_lossless(online_pair):
  root, s, _ = online_pair
  rows = [json.loads(x) for x in (root / "l" / "out" / "online.jsonl").read_text().splitlines()]
  assert s["sequences"] == len(rows) == 4 and s["updates"] == 2
  assert s["identical"] == 4 and all(r["identical"] for r in rows)
  assert [r["updates"] for r in rows] == [0, 0, 1, 1]
  assert "train_loss" in rows[1] and "train_loss" in rows[3]
  assert (root / "l" / "out" / "online.png").stat().st_size > 0


@pytest.mark.extended
def test_online_mode_resumes_after_its_last_update(pair, tmp_path):
  """Stopped after 3 prompts (one update made, the third prompt's row dropped), then rerun:
  the same rows and the same final drafter as one uninterrupted stream."""
  target, draft, _ = pair
  spec = ({"kind": "spec_bench", "categories": ["qa"], "limit": 6},)
  kw = dict(online=spec, online_every=2, online_steps=3, max_new_tokens=12, lr=1e-2, steps=1)
  whole = job(tmp_path / "a", "unused", **kw)
  s_whole = online(whole, show_progress=False, models=(target, draft))
  # the schedule spans the stream, whatever `steps` says
  assert s_whole["job"]["steps"] == 9 and s_whole["updates"] == 3 and s_whole["complete"]
  parted = job(tmp_path / "b", "unused", **kw)
  s1 = online(parted, show_progress=False, models=(target, draft), stop_after=3)
  assert s1["updates"] == 1 and s1["sequences"] == 3 and not s1["complete"]
  s2 = online(parted, show_progress=False, models=(target, draft))
  assert s2["updates"] == 3 and s2["complete"]

  def rows(d):
    return [{k: r[k] for k in ("seq", "updates", "acceptance_rate", "tau", "identical",
                               "train_loss", "ngram_entries") if k in r}
            for r in map(json.loads, (d / "out" / "online.jsonl").read_text().splitlines())]
  assert rows(tmp_path / "b") == rows(tmp_path / "a")
  assert [r["seq"] for r in rows(tmp_path / "b")] == list(range(6))
  assert all(r["identical"] for r in rows(tmp_path / "b"))
  # the n-gram cache came back too (it had entries to lose at the interruption)
  assert rows(tmp_path / "b")[2]["ngram_entries"] > 0


@pytest.mark.extended
def test_online_control_keeps_the_drafter_frozen(online_pair):
  tmp_path, learned, s = online_pair
  assert s["updates"] == 0 and s["identical"] == 4 and learned["updates"] == 2
  rc, rl = ([json.loads(x) for x in (tmp_path / d / "out" / "online.jsonl").read_text()
             .splitlines()] for d in ("c", "l"))
  assert all("train_loss" not in r and r["updates"] == 0 for r in rc)
  assert all("train_loss" in r for r in rl[1::2])
  # nothing was trained or saved for a resume
  assert not (tmp_path / "c" / "out" / "checkpoints").exists()
  assert not (tmp_path / "c" / "out" / "online_side").exists()
  assert len(list((tmp_path / "l" / "out" / "online_side").iterdir())) == 4
  # the same stream in the same order, the first two prompts by the same (base) drafter
  assert [r["qid"] for r in rc] == [r["qid"] for r in rl]
  assert [r["ngram_entries"] for r in rc[:2]] == [r["ngram_entries"] for r in rl[:2]]


def test_online_mode_refuses_a_stream_shorter_than_one_update(pair, tmp_path):
  target, draft, _ = pair
  j = job(tmp_path, "unused", online=({"kind": "spec_bench", "categories": ["qa"],
                                       "limit": 2},), online_every=3)
  with pytest.raises(TrainError, match="2 prompts, fewer than online_every=3"):
    online(j, show_progress=False, models=(target, draft))


@pytest.mark.parametrize("n", [5, 16])
def test_target_side_matches_a_plain_forward_at_bucket_edges(pair, n):
  """A one-token prompt with a 16-token completion once overflowed the padded buffer (17
  tokens in 16); the target side must equal a forward over the unpadded sequence."""
  from vocabjax.models.llamalike import lm_head_weight
  from vocabjax.train.features import sequence_hidden
  from vocabjax.train.distill import target_side_record, target_side_runner

  target, _, _ = pair
  prompt = target.tokenizer("def", add_special_tokens=False)["input_ids"]
  assert len(prompt) == 1
  comp = list(range(10, 10 + n))
  z = target_side_record(target_side_runner(target), target,
                         {"prompt": "def", "completion_ids": comp}, where="edge")
  h = sequence_hidden(target.params, jnp.asarray([prompt + comp]), config=target.config)[0]
  logits = h @ lm_head_weight(target.params, target.config).T
  assert z["hidden"].shape == (n, target.config.hidden_size)
  np.testing.assert_allclose(z["hidden"], h[:n], atol=2e-3, rtol=2e-3)
  np.testing.assert_allclose(z["lse"], jax.nn.logsumexp(logits[:n], -1), atol=1e-4, rtol=1e-4)
  np.testing.assert_array_equal(z["argmax"], np.argmax(logits[:n], -1))


@pytest.mark.extended
def test_online_report_pairs_the_run_with_its_control(pair, online_pair, tmp_path):
  import importlib.util
  from pathlib import Path

  spec = importlib.util.spec_from_file_location(
      "online_report", Path(__file__).parents[2] / "train" / "online_report.py")
  rep = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(rep)
  target, draft, _ = pair
  kw = dict(online_every=2, max_new_tokens=12, lr=1e-2)
  root = online_pair[0]
  run, ctl = root / "l" / "out", root / "c" / "out"
  md, data = rep.report(run, ctl)
  rl, rc = (rep.read_rows(x) for x in (run, ctl))
  acc = data["quarters"]["acceptance_rate"]
  np.testing.assert_allclose(acc["online"], [r["acceptance_rate"] for r in rl])  # 4 quarters of 1
  np.testing.assert_allclose(acc["difference"], np.subtract(acc["online"], acc["control"]))
  assert data["acceptance_difference_second_half"]["n"] == 2
  assert "| acceptance_rate | online - frozen |" in md
  assert (run / "online_report.png").stat().st_size > 0
  other = tmp_path / "o" / "out"
  online(job(tmp_path / "o", "unused", online=({"kind": "spec_bench", "categories": ["translation"],
                                                "limit": 4},), online_steps=0, **kw),
         show_progress=False, models=(target, draft))
  with pytest.raises(SystemExit, match="did not decode the same prompt stream"):
    rep.report(run, other)


def test_a_missing_or_corrupt_drafter_is_a_train_error(pair, tmp_path, tiny_chat_dir):
  """The drafter path does not exist, or its weights file is truncated: one TrainError
  naming the model (the CLI prints it as `error:` and exits 2), not a raw traceback."""
  import shutil

  _, _, data = pair
  with pytest.raises(TrainError, match="cannot load the drafter '.*nowhere'"):
    train(job(tmp_path, data, target=str(tiny_chat_dir), drafter=str(tmp_path / "nowhere")),
          show_progress=False)
  broken = tmp_path / "broken"
  shutil.copytree(tiny_chat_dir, broken)
  weights = next(p for p in broken.iterdir() if p.suffix == ".safetensors")
  weights.write_bytes(weights.read_bytes()[:100])
  with pytest.raises(TrainError, match="cannot load the drafter '.*broken'"):
    train(job(tmp_path, data, target=str(tiny_chat_dir), drafter=str(broken),
              out=str(tmp_path / "o2")), show_progress=False)


def test_a_distilled_lora_drafter_on_a_base_of_gguf_blocks(tmp_path):
  """A LoRA-distilled drafter whose base is loaded as a GGUF file's blocks (the default for a
  .gguf drafter) merges into the blocks' values: the same drafter, in f32, as on the base's f32
  twin."""
  from tests.helpers.blocks import to_blocks
  from vocabjax.checkpoints.distilled import save_distilled
  from vocabjax.kernels.blocks import is_blocks
  from vocabjax.models.identity import drafter_identity
  from vocabjax.models.lora import init_lora

  c = LlamaLikeConfig(arch="llama", vocab_size=64, hidden_size=256, intermediate_size=256,
                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=128)
  blocks, dense = to_blocks(init_params(jax.random.key(0), c, scale=0.3), "Q8_0")
  lora = init_lora(jax.random.key(1), dense, rank=4)
  lora = jax.tree.map(lambda a: a + 0.01, lora)  # b != 0: the adapters change the weights
  save_distilled(tmp_path / "d", lora, None, {"mode": "lora", "lora_rank": 4, "lora_alpha": 8.0,
                                             "base": drafter_identity(dense, c)})
  got, _ = load_distilled(tmp_path / "d", blocks, c)
  want, _ = load_distilled(tmp_path / "d", dense, c)
  leaves = jax.tree.leaves(got, is_leaf=is_blocks)
  assert not any(is_blocks(x) for x in leaves)
  for a, b in zip(leaves, jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.array_equal(np.asarray(want["layers"][0]["wq"]),
                            np.asarray(dense["layers"][0]["wq"]))


def test_distillation_loads_its_models_in_float32(monkeypatch):
  """The trainer's models load in float32 whatever the file: a .gguf drafter's default (its
  blocks) has no float weights for the adapters to merge into (an AttributeError at the first
  step)."""
  from vocabjax.train.distill import job as distill_job

  asked = []
  monkeypatch.setattr(distill_job, "load_model",
                      lambda source, **kw: asked.append((source, kw.get("dtype"))) or "M")
  assert distill_job.load_model_for("d.gguf", "drafter", progress=False) == "M"
  assert asked == [("d.gguf", "float32")]
