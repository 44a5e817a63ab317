"""Medusa decoding: greedy identity for several trees and heads, every step accepting when the
tree holds every token, chi-square losslessness, bad input."""

import jax
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.medusa import MedusaProposer, medusa_choices_for
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models import init_params
from vocabjax.models.medusa import MedusaError
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs
from vocabjax.vocab.subset import VocabSubset

from tests.helpers.models import CFG, PROMPT, SMALL, prompt_samples
from tests.helpers.heads import SPARSE, heads_for


@pytest.mark.parametrize("choices,num_layers,shared", [
    (SPARSE, 1, False),
    pytest.param(medusa_choices_for(2, 3), 2, False, marks=pytest.mark.full_opt),
    (SPARSE, 1, True)],
    ids=["sparse", "full_k3_d2_two_blocks", "shared_head"])
def test_greedy_identical_to_autoregressive(choices, num_layers, shared):
  target = init_params(jax.random.key(0), CFG, scale=0.3)
  heads, mc = heads_for(target, CFG, num_layers=num_layers, shared=shared)
  prompts = [[5, 9, 2, 7, 5, 9], [1, 2, 3], [8, 8, 8, 8, 4]]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=20)
  dec = SpeculativeEngine(target, CFG, MedusaProposer(target, CFG, heads, mc, choices=choices))
  res = dec.generate(prompts, max_new_tokens=20)
  assert res.tokens == ar.tokens
  assert dec.generate([prompts[1]], max_new_tokens=20).tokens == [ar.tokens[1]]


@pytest.mark.parametrize("shared", [False, True], ids=["own_heads", "shared_head"])
def test_subsets_on_the_heads(shared):
  """FR-Spec / VocabTrim on Medusa: greedy identity with subsets of several K (a small one
  that often misses the target's token included); the subset of every token drafts exactly
  what the full heads draft; fewer rows counted per step."""
  target = init_params(jax.random.key(0), CFG, scale=0.3)
  heads, mc = heads_for(target, CFG, shared=shared)
  prompts = [[5, 9, 2, 7, 5, 9], [1, 2, 3], [8, 8, 8, 8, 4]]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=20)
  full = SpeculativeEngine(target, CFG,
                           MedusaProposer(target, CFG, heads, mc,
                                          choices=SPARSE)).generate(prompts, max_new_tokens=20)
  for k in (3, 20, 48):
    ids = np.sort(np.random.RandomState(k).choice(CFG.vocab_size, k, replace=False))
    dec = SpeculativeEngine(
        target, CFG,
        MedusaProposer(target, CFG, heads, mc, choices=SPARSE,
                       draft_vocab=VocabSubset(ids, CFG.vocab_size)))
    assert dec.generate(prompts, max_new_tokens=20).tokens == ar.tokens
    assert dec.draft_head_rows == 3 * k
  every = SpeculativeEngine(
      target, CFG,
      MedusaProposer(target, CFG, heads, mc, choices=SPARSE,
                     draft_vocab=VocabSubset(np.arange(CFG.vocab_size), CFG.vocab_size)))
  res = every.generate(prompts, max_new_tokens=20)
  assert res.tokens == ar.tokens and res.stats.accepted == full.stats.accepted


def test_a_tree_holding_every_token_accepts_every_step():
  """Depth-1 nodes for all V ranks: the target's next token is always a candidate, so every
  step accepts one draft (greedy), whatever the heads predict."""
  target = init_params(jax.random.key(4), SMALL, scale=0.8)
  heads, mc = heads_for(target, SMALL, num_heads=1)
  choices = [[r] for r in range(SMALL.vocab_size)]
  ar = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=13)
  res = SpeculativeEngine(target, SMALL,
                          MedusaProposer(target, SMALL, heads, mc,
                                         choices=choices)).generate([[3, 1]], max_new_tokens=13)
  assert res.tokens == ar.tokens
  assert all(a == [1] for a in res.stats.accepted)  # one draft accepted at every step
  assert res.steps == 6  # 1 from the prefill + 6 steps of 2


@pytest.mark.extended(params=["full_heads-sp1", "subset_on_heads-sp0"])
@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0),
                                SamplingParams(temperature=0.7, top_p=0.9)])
@pytest.mark.parametrize("subset", [False, True], ids=["full_heads", "subset_on_heads"])
def test_sampling_is_lossless(sp, subset):
  """The joint law of the first three tokens equals target-only sampling (chi-square over
  12,000 rows) with a two-level tree of three branches per node at the root; also with the
  heads restricted to a subset holding only some of the target's likely tokens (q = 0 outside
  it: the residual gives a missed token its full probability)."""
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  heads, mc = heads_for(target, SMALL, num_heads=2)
  vocab = (VocabSubset(np.arange(0, SMALL.vocab_size, 2), SMALL.vocab_size) if subset
           else None)
  samples, st = prompt_samples(
      SpeculativeEngine(
          target, SMALL,
          MedusaProposer(target, SMALL, heads, mc, choices=[[0], [1], [2], [0, 0], [1, 0]],
                         draft_vocab=vocab)), sp)
  assert 0.05 < st.acceptance_rate < 0.95  # accepts and rejections both happen
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) > 1e-3


def test_bad_input():
  target = init_params(jax.random.key(0), CFG)
  heads, mc = heads_for(target, CFG, num_heads=2)
  with pytest.raises(MedusaError, match=r"\[0, 0, 0\] is 3 deep but there are 2 heads"):
    SpeculativeEngine(target, CFG, MedusaProposer(target, CFG, heads, mc, choices=SPARSE))
  other, omc = heads_for(init_params(jax.random.key(1), SMALL), SMALL, num_heads=2)
  with pytest.raises(MedusaError, match="D=16, V=8 do not fit a target with D=32, V=64"):
    SpeculativeEngine(target, CFG, MedusaProposer(target, CFG, other, omc, choices=[[0]]))
  with pytest.raises(ValueError, match="rank 64, beyond the vocabulary of V=64"):
    SpeculativeEngine(target, CFG, MedusaProposer(target, CFG, heads, mc, choices=[[0], [64]]))
  with pytest.raises(ValueError, match=r"rank 2, beyond the subset's K=2 tokens"):
    SpeculativeEngine(
        target, CFG,
        MedusaProposer(target, CFG, heads, mc, choices=[[0], [1], [2]],
                       draft_vocab=VocabSubset(np.asarray([1, 5]), CFG.vocab_size)))
  with pytest.raises(ValueError, match="over a vocabulary of 100 tokens, the target has V=64"):
    SpeculativeEngine(
        target, CFG,
        MedusaProposer(target, CFG, heads, mc, choices=[[0]],
                       draft_vocab=VocabSubset(np.asarray([1, 5]), 100)))
  with pytest.raises(ValueError, match="static subset .* not str"):
    SpeculativeEngine(
        target, CFG,
        MedusaProposer(target, CFG, heads, mc, choices=[[0]], draft_vocab="ranker.safetensors"))
