"""EAGLE head tree decoding: greedy identity with every vocabulary choice, the feature hand-over
invariant (the head's cache equals a fresh recomputation), lossless sampling, bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams
from vocabjax.models import KVCache, init_params
from vocabjax.models.eagle import eagle_forward, fuse_features, init_eagle
from vocabjax.models.llamalike import forward_features
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs
from vocabjax.vocab.ranked import SpeculativeVocab, svd_ranker
from vocabjax.vocab.subset import VocabSubset

from tests.helpers.models import CFG, PROMPT, SMALL, random_prompts
from tests.helpers.heads import LOOKUP, random_head


@pytest.mark.extended(params=["own-reduced", "target-subset"])
@pytest.mark.parametrize("vocab", ["own", "own-reduced", "target", "target-subset"])
def test_greedy_identity_with_a_head_that_is_often_right(lookup, vocab):
  target, hc, head = lookup
  kw = {"lm_head": "target" if vocab.startswith("target") else "own"}
  if vocab == "own-reduced":
    ids = np.arange(0, 16, 2)  # half the tokens: the other half can never be drafted
    hc = dataclasses.replace(hc, draft_vocab_size=8)
    head = {**head, "lm_head": head["lm_head"][ids], "d2t": jnp.asarray(ids - np.arange(8))}
  elif vocab == "target-subset":
    kw["draft_vocab"] = VocabSubset(ids=np.arange(0, 16, 2), vocab_size=16)
  prompts = [[1], [4, 9, 2], [7, 7, 7, 7, 7, 3]]
  ar = Decoder(target, LOOKUP).generate(prompts, max_new_tokens=20)
  res = SpeculativeEngine(target, LOOKUP, EagleProposer(
      target, LOOKUP, head, hc, tree=TreeParams(2, 3, 6), **kw)).generate(prompts,
                                                                        max_new_tokens=20)
  assert res.tokens == ar.tokens
  acc = [a for arow, drow in zip(res.stats.accepted, res.stats.drafted)
         for a, d in zip(arow, drow) if d]
  # its top child is always right with a full vocabulary; half the vocabulary misses some
  assert (min(acc) >= 1) == (vocab in ("own", "target")), acc
  assert np.mean(acc) >= 0.4, acc


_TREES = [TreeParams(1, 3, 3), TreeParams(2, 3, 6), TreeParams(4, 4, 16)]
_VOCABS = ["own-reduced", "own-full", "target", "target-subset", "target-ranker",
           "eagle1-last-layer"]


# Two pairs (the head's own reduced vocabulary with a chain-shaped tree, the target's head with
# the widest tree) also compile at users' XLA settings (tests/conftest.py).
@pytest.mark.parametrize("vocab,tp", [
    pytest.param(v, _TREES[i % 3], marks=[pytest.mark.full_opt] if v in (
        "own-reduced", "target") else []) for i, v in enumerate(_VOCABS)],
                         ids=lambda x: x if isinstance(x, str)
                         else f"k{x.top_k}d{x.depth}n{x.total_tokens}")
def test_greedy_identical_to_autoregressive_random_models(target, tp, vocab):
  """Every head vocabulary (own reduced / full, the target's, a subset, a ranker, EAGLE-1's
  input) and every tree shape (a chain, 2 x 3, 4 x 4 with 16 nodes), each shape with the own
  LM head (own reduced, own full, EAGLE-1) and the target's (target, its subset, its ranker):
  6 pairs cover what the 18 of the full product did (the vocabulary and the tree shape enter
  different parts of the step)."""
  Vd = 40 if vocab == "own-reduced" else None
  # EAGLE-1's input: the last layer's output alone (F*Dt = D, so no fc layer)
  layers = (1,) if vocab == "eagle1-last-layer" else (0, 1)
  hc, head = random_head(target, CFG, Vd, layers=layers)
  assert hc.has_fc == (len(layers) > 1)
  kw = {"lm_head": "target" if vocab.startswith("target") else "own"}
  if vocab == "target-subset":
    kw["draft_vocab"] = VocabSubset(ids=tuple(range(0, 64, 2)), vocab_size=64)
  elif vocab == "target-ranker":
    kw["draft_vocab"] = SpeculativeVocab(svd_ranker(target, CFG, 8), k=12)
  prompts = random_prompts()
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  res = SpeculativeEngine(target, CFG, EagleProposer(target, CFG, head, hc, tree=tp,
                                                     **kw)).generate(prompts, max_new_tokens=24)
  assert res.tokens == ar.tokens


def test_head_cache_equals_a_fresh_recomputation(lookup):
  """After several steps the head's cache holds, for every committed position p, exactly the
  entry (x_{p+1}, f_p) that a fresh pass over the committed text gives, and the pending
  features are the target's features of the newest positions: the hand-over loses nothing."""
  target, hc, head = lookup
  head = {**head, "layer": init_eagle(jax.random.key(9), hc, scale=0.3)["layer"]}  # busy layer
  dec = SpeculativeEngine(target, LOOKUP,
                          EagleProposer(target, LOOKUP, head, hc, tree=TreeParams(2, 3, 6)),
                          layout="out_in")
  prompt = [5, 9, 13, 2, 7]
  B, S, T = 1, 64, 16
  start, step, _ = dec.programs(SamplingParams(), B, T, S, jnp.float32)
  toks = np.zeros((B, T), np.int32)
  toks[0, :len(prompt)] = prompt
  first, state = start(jnp.asarray(toks), jnp.asarray([len(prompt)], jnp.int32),
                       jax.random.key(0))
  committed = prompt + [int(first[0])]
  accepted = []
  for i in range(6):
    state, emitted, n = step(dec.target_params, dec.proposer_params, state, jax.random.key(i))
    committed += [int(t) for t in np.asarray(emitted)[0] if t >= 0]
    accepted.append(int(n[0]))
  assert max(accepted) >= 1  # steps that handed over more than one feature
  Nt = int(state.target_cache.lengths[0])
  assert Nt == len(committed) - 1  # every committed token but `last`
  head_state = state.draft
  L0, pc = int(head_state.head_cache.lengths[0]), int(head_state.pend_count[0])
  assert L0 + pc == Nt

  seq = jnp.asarray([committed])
  L = len(committed)
  pos = jnp.arange(L)[None]
  _, _, feats = forward_features(target, seq, pos, KVCache.init(LOOKUP, 1, L), config=LOOKUP,
                                 layers=hc.feature_layers)
  shifted = seq[:, 1:]
  _, fresh = eagle_forward(head, target["embed"], shifted, fuse_features(head, feats[:, :-1]),
                           pos[:, :-1], KVCache.init(hc.layer, 1, L), config=hc)
  np.testing.assert_allclose(np.asarray(head_state.head_cache.k[0, 0, :L0]),
                             np.asarray(fresh.k[0, 0, :L0]), rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(np.asarray(head_state.head_cache.v[0, 0, :L0]),
                             np.asarray(fresh.v[0, 0, :L0]), rtol=2e-4, atol=2e-5)
  # pending entries L0 .. Nt - 1: tokens x_{p+1}, features f_p
  np.testing.assert_array_equal(np.asarray(head_state.pend_tokens[0, :pc]),
                                committed[L0 + 1:Nt + 1])
  np.testing.assert_allclose(np.asarray(head_state.pend_feats[0, :pc]),
                             np.asarray(feats[0, L0:Nt]), rtol=2e-4, atol=2e-5)


@pytest.mark.extended(params=["t1"])
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0),
                                      SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_sampling_is_lossless(sampling):
  """Joint law of the first three tokens (V = 8) equals target-only sampling (chi-square)."""
  small = dataclasses.replace(SMALL, num_layers=2)  # two layers to fuse
  tgt2 = init_params(jax.random.key(10), small, scale=0.8)
  hc, head = random_head(tgt2, small, 6, seed=4)
  dec = SpeculativeEngine(tgt2, small, EagleProposer(tgt2, small, head, hc,
                                                     tree=TreeParams(2, 2, 4)))
  res = dec.generate([PROMPT] * 12_000, max_new_tokens=3, sampling=sampling, seed=7)
  V = small.vocab_size
  t = np.asarray([r[:3] for r in res.tokens])
  samples = t[:, 0] * V * V + t[:, 1] * V + t[:, 2]
  acc = [a for arow, drow in zip(res.stats.accepted, res.stats.drafted)
         for a, d in zip(arow, drow) if d]
  assert 0.05 < np.mean(np.asarray(acc) > 0) < 0.95  # informative: some paths accepted
  exact = exact_sequence_probs(tgt2, small, PROMPT, sampling)
  assert chi2_pvalue(samples, exact) > 1e-3


def test_bad_input(target):
  hc, head = random_head(target, CFG, 40)
  other = dataclasses.replace(CFG, hidden_size=48, num_heads=6)
  with pytest.raises(ValueError, match="width 32, the target.s hidden size is 48"):
    other_target = init_params(jax.random.key(1), other)
    SpeculativeEngine(other_target, other, EagleProposer(other_target, other, head, hc))
  with pytest.raises(ValueError, match="V=65"):
    bigger = dataclasses.replace(CFG, vocab_size=65)
    bigger_target = init_params(jax.random.key(1), bigger)
    SpeculativeEngine(bigger_target, bigger, EagleProposer(bigger_target, bigger, head, hc))
  hc3, head3 = random_head(target, CFG, 40, layers=(0, 1, 2))
  with pytest.raises(ValueError, match="has 2 layers"):
    SpeculativeEngine(target, CFG, EagleProposer(target, CFG, head3, hc3))
  with pytest.raises(ValueError, match="own reduced vocabulary of Vd=40"):
    SpeculativeEngine(target, CFG, EagleProposer(
        target, CFG, head, hc, draft_vocab=VocabSubset(ids=(1, 2, 3, 4, 5), vocab_size=64)))
  with pytest.raises(ValueError, match="top_k=8 exceeds the head's 5 candidate"):
    SpeculativeEngine(target, CFG, EagleProposer(
        target, CFG, head, hc, lm_head="target", tree=TreeParams(8, 2, 8),
        draft_vocab=VocabSubset(ids=(1, 2, 3, 4, 5), vocab_size=64)))
  with pytest.raises(ValueError, match="lm_head='mine'"):
    SpeculativeEngine(target, CFG, EagleProposer(target, CFG, head, hc, lm_head="mine"))


def test_int8_target_is_refused(target):
  """An EAGLE head reads the target's embedding rows as floats: an int8 target is refused with
  a message naming it, not decoded with raw int8 rows."""
  from vocabjax.models.llamalike import cast_weights

  hc, head = random_head(target, CFG)
  with pytest.raises(ValueError, match="int8 target"):
    int8 = cast_weights(target, "int8")
    SpeculativeEngine(int8, CFG, EagleProposer(int8, CFG, head, hc, tree=TreeParams(2, 3, 6)))


def test_greedy_identity_with_a_bf16_target(target):
  """A bf16 target prefills through the bf16 GEMM (`prefill_in_bf16`) in EAGLE's feature-
  capturing prefill as in plain decoding's, so outputs stay identical (prompts of 40-70)."""
  from vocabjax.models.llamalike import cast_weights

  bf = cast_weights(target, "bfloat16")
  hc, head = random_head(bf, CFG, None, layers=(0, 1))
  prompts = [np.random.RandomState(4).randint(0, CFG.vocab_size, n).tolist() for n in (70, 40)]
  ar = Decoder(bf, CFG).generate(prompts, max_new_tokens=16)
  dec = SpeculativeEngine(bf, CFG, EagleProposer(bf, CFG, head, hc, tree=TreeParams(2, 3, 6)))
  res = dec.generate(prompts, max_new_tokens=16)
  assert res.tokens == ar.tokens
  # the head's steps gather the bf16 target's embedding rows, never widen the whole table
  from vocabjax.testing.hlo import materialized, step_hlo

  steps = step_hlo(dec)
  assert steps
  for text in steps:
    assert not materialized(text, (CFG.vocab_size, CFG.hidden_size), "f32")
