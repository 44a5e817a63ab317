"""DFlash and DFlash 2 block drafting on the engine: greedy output equal to plain greedy
decoding for block sizes, batches of prompts, the drafter's options (sliding layers, causal
attention, multiplier and soft cap, DFlash 2's convolutions and selector) and the vocabulary
policies on its head (a static subset, a SpecVocab ranker); the target's law kept when
sampling, with and without a subset, DFlash 2's selector law included (chi-square); its
checkpoint written and read back; the method by name, with its files by hub id."""

import dataclasses

import jax
import numpy as np
import pytest

from tests.helpers.models import CFG, PROMPT, SMALL, random_prompts
from vocabjax.checkpoints.dflash import load_dflash, save_dflash
from vocabjax.decoding.dflash import DFlashProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models import init_params
from vocabjax.models.dflash import DFlashConfig, init_dflash
from vocabjax.sampling import SamplingParams
from vocabjax.testing.proposers import greedy_identity, target_law
from vocabjax.models.identity import drafter_identity
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.vocab.clustered import ClusterRouter, ClusteredVocab, fit_clusters
from vocabjax.vocab.incontext import InContextVocab
from vocabjax.vocab.ranked import SpeculativeVocab, svd_ranker
from vocabjax.vocab.subset import VocabSubset

V2 = {"conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 8, "selector_top_k": 4}


def dflash_config(target, block_size=4, layers=(0, 1), **changes) -> DFlashConfig:
  layer = target.replace(arch="qwen3", qk_norm=True, attention_bias=False, num_layers=2)
  return DFlashConfig(layer=layer, target_hidden_size=target.hidden_size,
                      target_layer_ids=layers, block_size=block_size, mask_token_id=5,
                      **changes)


TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]


@pytest.mark.extended(params=["b2", "b4-causal-last-layer", "b4-dynaspec", "b4-microspec",
    "b4-sliding-scaled", "b8-subset", "b6-tree-subset"])
@pytest.mark.parametrize("case", ["b2", "b4", "b8-subset", "b4-ranker", "b4-sliding-scaled",
                                  "b4-causal-last-layer", "b4-dflash2", "b8-dflash2-ranker",
                                  "b6-tree", "b6-tree-subset", "b4-microspec", "b4-dynaspec"])
def test_greedy_identical_to_plain_decoding(target, case):
  """Block sizes 2, 4 and 8 over a batch of prompts of lengths 1-17; a subset of half the
  vocabulary, a ranker's 16 candidates; a drafter with a sliding layer (window 3), an input
  scale, an output multiplier and a soft cap; a causal drafter reading the target's last layer
  (its final normed hidden state); DFlash 2 (its selector over the top 4), alone and over a
  ranker's candidates; a tree of 8 nodes over the positions' top-2 (alone, over a subset);
  MicroSpec's in-context rows and DynaSpec's clusters on the head."""
  block = int(case.split("-")[0][1:])
  changes, vocab, layers = (V2 if "dflash2" in case else {}), None, (0, 1)
  if "sliding" in case:
    changes = {"input_embedding_scale": 1.5, "output_multiplier": 0.7, "final_logit_softcapping": 3.0}
  if "causal" in case:
    changes, layers = {"causal": True}, (1,)
  dc = dflash_config(CFG, block, layers, **changes)
  if "sliding" in case:
    dc = dataclasses.replace(dc, layer=dc.layer.replace(
        layer_types=("sliding_attention", "full_attention"), sliding_window=3))
  if "subset" in case:
    vocab = VocabSubset(ids=np.arange(0, CFG.vocab_size, 2), vocab_size=CFG.vocab_size)
  if "ranker" in case:
    vocab = SpeculativeVocab(svd_ranker(target, CFG, rank=4), k=16)
  if "microspec" in case:  # per-row state under a [B * G, D] block of positions
    vocab = InContextVocab(VocabSubset(ids=np.array([1, 2]), vocab_size=CFG.vocab_size), 6)
  if "dynaspec" in case:
    members = fit_clusters(np.asarray(lm_head_weight(target, CFG)), 8, iters=2)
    vocab = ClusteredVocab(ClusterRouter(
        members, np.random.RandomState(0).randn(8, CFG.hidden_size).astype(np.float32),
        np.zeros(8, np.float32), drafter_identity(target, CFG)), 2)
  dp = init_dflash(jax.random.key(block), dc, scale=0.3)
  tree = TREE if "tree" in case else None
  engine = SpeculativeEngine(target, CFG, DFlashProposer(target, CFG, dp, dc, draft_vocab=vocab,
                                                         tree=tree))
  res = greedy_identity(engine, target, CFG, random_prompts(seed=block), max_new_tokens=30)
  per_step = len(TREE) if tree else block - 1
  assert all(d == per_step for row in res.stats.drafted for d in row if d)


@pytest.mark.extended(params=["True-tree", "False-tree", "True-dflash2", "False-dflash"])
@pytest.mark.parametrize("kind", ["dflash", "dflash2", "tree"])
@pytest.mark.parametrize("subset", [False, True])
def test_sampling_keeps_the_targets_law(kind, subset):
  """Each position's law returned as q: the first three tokens' joint law equals the target's
  (chi-square over V = 8), with the drafter's whole head and over 6 of its 8 tokens; DFlash 2's
  selector law over each position's top 4 (conditional on the draft before it) likewise; a
  tree over the positions' top-2 (deterministic nodes, the tree's multi-draft rule) too."""
  t = init_params(jax.random.key(10), SMALL, scale=0.8)
  dc = dflash_config(SMALL, 3, (0,), **(V2 if kind == "dflash2" else {}))
  dp = init_dflash(jax.random.key(3), dc, scale=0.8)
  vocab = VocabSubset(ids=np.arange(6), vocab_size=8) if subset else None
  tree = [[0], [1], [0, 0], [1, 0]] if kind == "tree" else None
  engine = SpeculativeEngine(t, SMALL, DFlashProposer(t, SMALL, dp, dc, draft_vocab=vocab,
                                                      tree=tree))
  p, stats = target_law(engine, t, SMALL, PROMPT, SamplingParams(temperature=1.0))
  assert 0.05 < stats.acceptance_rate < 0.95
  assert p > 1e-3


def test_checkpoint_round_trip_and_the_method_by_hub_id(target, tmp_path, monkeypatch):
  """save_dflash -> load_dflash gives the same config and weights (a sliding layer, the
  options); the `dflash` method with the directory by path and by hub id (a hub served on
  127.0.0.1) decodes as plain decoding does; a drafter for another target is refused."""
  from vocabjax.checkpoints.loader import Model
  from vocabjax.errors import ConfigError
  from vocabjax.methods import METHODS
  from vocabjax.testing.local_hub import LocalHub

  dc = dflash_config(CFG, 4, output_multiplier=0.5, final_logit_softcapping=30.0)
  dc = dataclasses.replace(dc, layer=dc.layer.replace(
      layer_types=("sliding_attention", "full_attention"), sliding_window=3))
  dp = init_dflash(jax.random.key(4), dc, scale=0.3)
  d = save_dflash(dp, dc, tmp_path / "drafter", num_target_layers=CFG.num_layers)
  got, params = load_dflash(d, target_config=CFG)
  assert got == dc
  np.testing.assert_array_equal(np.asarray(params["layers"][1]["wq"]),
                                np.asarray(dp["layers"][1]["wq"]))
  dc2 = dataclasses.replace(dc, **V2)
  dp2 = init_dflash(jax.random.key(5), dc2, scale=0.3)
  got2, params2 = load_dflash(save_dflash(dp2, dc2, tmp_path / "v2", num_target_layers=2))
  assert got2 == dc2
  jax.tree.map(np.testing.assert_array_equal, params2, dp2)
  model = Model(config=CFG, params=target, tokenizer=None, eos_token_ids=(), source="random",
                dtype=np.float32)
  want = greedy_identity(METHODS["dflash"].make(model, None, {"head": str(d)}), target, CFG,
                         random_prompts(seed=2))
  with LocalHub() as hub:
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.add("z-lab/tiny-dflash", {f.name: f.read_bytes() for f in d.iterdir()})
    p = METHODS["dflash"].parse({"head": "z-lab/tiny-dflash"}, "test")
  res = METHODS["dflash"].make(model, None, p).generate(random_prompts(seed=2), max_new_tokens=24)
  assert res.tokens == want.tokens
  other = dataclasses.replace(CFG, num_layers=1)
  with pytest.raises(ValueError, match=r"target_layer_ids=\[0, 1\] name layers \[1\] outside "
                                       r"the target's 1"):
    load_dflash(d, target_config=other)
  with pytest.raises(ConfigError, match="dflash.head"):
    METHODS["dflash"].parse({"head": str(tmp_path / "missing")}, "test")


def test_a_tree_is_refused_where_it_cannot_apply(target):
  """DFlash 2's selector with a tree; ranks beyond the policy's candidates; a path deeper than
  the block's drafts."""
  dc2 = dflash_config(CFG, 4, **V2)
  dp2 = init_dflash(jax.random.key(1), dc2)
  with pytest.raises(ValueError, match="needs selector=False"):
    DFlashProposer(target, CFG, dp2, dc2, tree=[[0]])
  dc = dflash_config(CFG, 4)
  dp = init_dflash(jax.random.key(1), dc)
  with pytest.raises(ValueError, match="rank 4, beyond the 4 candidates"):
    DFlashProposer(target, CFG, dp, dc, tree=[[4]],
                   draft_vocab=VocabSubset(ids=np.arange(4), vocab_size=CFG.vocab_size))
  with pytest.raises(ValueError, match="4 deep but there are 3 heads"):
    DFlashProposer(target, CFG, dp, dc, tree=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
