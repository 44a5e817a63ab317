"""`python -m vocabjax.train.router` on a tiny drafter/target pair: the router learns the
target's clusters, resumes exactly, and its shortlists draft losslessly."""

import json

import numpy as np
import pytest

from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder
from vocabjax.decoding.drafter import ChainProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.testing.tiny import save_tiny_variant
from vocabjax.train.loop import TrainError
from vocabjax.train.router import RouterJob, job_from_dict, main, train
from vocabjax.vocab.clustered import ClusterRouter, ClusteredVocab, RouterError

from tests.helpers.train import write_completions


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("router_pair")
  draft = save_tiny_variant("qwen2_bias", root / "draft", seed=3, with_tokenizer=True)
  target = save_tiny_variant("qwen2_bias", root / "target", seed=4, with_tokenizer=True)
  return draft, target


@pytest.fixture(scope="module")
def data_file(pair_dirs, tmp_path_factory):
  _, target = pair_dirs
  return write_completions(target, tmp_path_factory.mktemp("data") / "generated.jsonl",
                           n=16, max_new_tokens=12)


def _job(pair_dirs, data_file, out, **kw):
  draft, target = pair_dirs
  base = dict(drafter=str(draft), target=str(target), data=(str(data_file),), out=str(out),
              features=str(out.parent / "features"), clusters=8, cluster_iters=2, steps=30,
              batch_tokens=64, lr=3e-2, warmup_steps=3, eval_every=10, checkpoint_every=10,
              heldout=0.25, recall_top=(1, 2, 4))
  base.update(kw)
  return RouterJob(**base)


@pytest.mark.extended
def test_training_lowers_the_loss_and_the_shortlists_draft_losslessly(pair_dirs, data_file,
                                                                       tmp_path):
  summary = train(_job(pair_dirs, data_file, tmp_path / "run"), show_progress=False)
  log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
  assert [r["step"] for r in log] == [0, 10, 20, 30]
  assert log[-1]["train_loss"] < log[1]["train_loss"]
  assert log[-1]["heldout_loss"] < log[0]["heldout_loss"]
  assert log[-1]["recall@4"] >= log[-1]["recall@2"] >= log[-1]["recall@1"]
  assert summary["complete"] and (tmp_path / "run" / "curves.png").stat().st_size > 0
  r = ClusterRouter.load(tmp_path / "run" / "router.safetensors")
  assert r.num_clusters == 8
  draft, target = (load_model(p, dtype="float32") for p in pair_dirs)
  r.check_drafter(draft.params, draft.config)
  with pytest.raises(RouterError, match="another drafter"):
    r.check_drafter(target.params, target.config)
  prompts = [[5, 9, 30], [7]]
  ar = Decoder(target.params, target.config).generate(prompts, max_new_tokens=16)
  spec = SpeculativeEngine(
      target.params, target.config,
      ChainProposer(draft.params, draft.config, target.config, gamma=3,
                    draft_vocab=ClusteredVocab(r, top=2)))
  assert spec.generate(prompts, max_new_tokens=16).tokens == ar.tokens


@pytest.mark.extended
def test_resume_is_exact(pair_dirs, data_file, tmp_path):
  straight = train(_job(pair_dirs, data_file, tmp_path / "a", steps=20), show_progress=False)
  job_b = _job(pair_dirs, data_file, tmp_path / "b", steps=20)
  part = train(job_b, show_progress=False, stop_after=10)
  assert not part["complete"] and not (tmp_path / "b" / "router.safetensors").exists()
  assert train(job_b, show_progress=False)["complete"]
  a = ClusterRouter.load(tmp_path / "a" / "router.safetensors")
  b = ClusterRouter.load(tmp_path / "b" / "router.safetensors")
  np.testing.assert_array_equal(a.members, b.members)
  np.testing.assert_array_equal(a.weight, b.weight)
  assert straight["final"]["heldout_loss"] == json.loads(
      (tmp_path / "b" / "summary.json").read_text())["final"]["heldout_loss"]


def test_a_drafters_job_keeps_its_fingerprint(pair_dirs, data_file, tmp_path):
  """The head fields (eagle_head, eagle_features) added later leave a drafter's router job's
  fingerprint as it was (its checkpoints resume), and a head job differs from it."""
  import dataclasses
  import hashlib

  from vocabjax.train.loop import RUN_ONLY_FIELDS

  job = _job(pair_dirs, data_file, tmp_path / "x")
  before = dataclasses.asdict(job)
  for k in (*RUN_ONLY_FIELDS, "eagle_head", "eagle_features"):
    before.pop(k, None)
  before["data"] = job.feature_spec.fingerprint()
  assert job.train_fingerprint() == hashlib.sha256(
      json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]


def test_bad_input(pair_dirs, data_file, tmp_path, capsys):
  with pytest.raises(TrainError, match="clusters=0: a router needs at least one cluster"):
    _job(pair_dirs, data_file, tmp_path / "x", clusters=0)
  with pytest.raises(TrainError, match="recall_top=.* must lie in"):
    _job(pair_dirs, data_file, tmp_path / "x", recall_top=(16,))
  with pytest.raises(TrainError):
    job_from_dict({"drafter": "d", "data": [], "out": "o"})
  with pytest.raises(TrainError, match="eagle_head and eagle_features go together"):
    _job(pair_dirs, data_file, tmp_path / "x", eagle_head="h", target=None)
  with pytest.raises(TrainError, match="on the target's tokens stored in its features"):
    _job(pair_dirs, data_file, tmp_path / "x", eagle_head="h", eagle_features="f")
  cfg = tmp_path / "job.yaml"
  cfg.write_text(f"drafter: {pair_dirs[0]}\ndata: [{data_file}]\nout: {tmp_path / 'y'}\n"
                 f"clusters: 100000\nrecall_top: [1]\nfeatures: {tmp_path / 'features'}\n")
  assert main(["--config", str(cfg), "--quiet"]) == 2
  assert "clusters=100000 exceeds the vocabulary" in capsys.readouterr().err
