"""Prompt lookup decoding: the lookup by hand, greedy identity, losslessness when sampling."""

import jax
import numpy as np
import pytest

from tests.decoding.conftest import CFG, SMALL
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.pld import PromptLookupDecoder, lookup_drafts
from vocabjax.decoding.sampling import SamplingParams
from vocabjax.models import init_params
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs


def test_lookup_by_hand():
  seq = np.array([5, 6, 7, 8, 9, 1, 2, 5, 6])
  assert lookup_drafts(seq, 3).tolist() == [7, 8, 9]  # suffix (5, 6) seen at 0
  assert lookup_drafts(seq, 10).tolist() == [7, 8, 9, 1, 2, 5, 6]  # runs to the end
  # the longest n-gram wins: (2, 5, 6) at 2 beats (5, 6) at 0
  seq = np.array([5, 6, 0, 2, 5, 6, 4, 4, 2, 5, 6])
  assert lookup_drafts(seq, 2).tolist() == [4, 4]
  assert lookup_drafts(seq, 2, max_ngram=2).tolist() == [0, 2]  # earliest (5, 6)
  assert lookup_drafts(np.array([1, 2, 3, 4]), 3).size == 0  # nothing repeats
  assert lookup_drafts(np.array([9]), 3).size == 0
  # (1, 2) at 0 continues into the suffix itself: not a match; (2,) at 1 is
  assert lookup_drafts(np.array([1, 2, 1, 2]), 3).tolist() == [1, 2]
  assert lookup_drafts(np.array([1, 2, 1, 2]), 3, min_ngram=2).size == 0


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_identical_to_autoregressive(gamma):
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  prompts = [[5, 9, 2, 7, 5, 9, 2, 7, 5, 9], [1, 2, 3], [8, 8, 8, 8, 4, 8, 8]]
  ar = Decoder(params, CFG).generate(prompts, max_new_tokens=24)
  dec = PromptLookupDecoder(params, CFG, gamma=gamma)
  res = dec.generate(prompts, max_new_tokens=24)
  assert res.tokens == ar.tokens
  st = res.stats
  assert sum(map(sum, st.accepted)) > 0 and st.tau > 1  # drafts were found and accepted
  assert res.steps < ar.steps
  for row in prompts:  # batch 1 as well
    assert dec.generate([row], max_new_tokens=24).tokens == Decoder(params, CFG).generate(
        [row], max_new_tokens=24).tokens


def test_no_match_is_a_plain_step():
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  res = PromptLookupDecoder(params, CFG, gamma=3).generate([[1, 2, 3]], max_new_tokens=1)
  assert res.steps == 0 and len(res.tokens[0]) == 1  # the prefill's token only
  res = PromptLookupDecoder(params, CFG, gamma=3).generate([[1, 2, 3]], max_new_tokens=2)
  assert res.stats.drafted == [[0]] and res.stats.tau == 1.0


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0),
                                SamplingParams(temperature=0.7, top_p=0.9)])
def test_sampling_is_lossless(sp):
  """The joint law of the first three tokens equals target-only sampling (chi-square over
  12,000 rows). The prompt repeats [3, 1] after the target's own greedy continuation of it,
  so lookups draft tokens the target often (not always) samples."""
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  prompt = [3, 1, *greedy, 3, 1]
  res = PromptLookupDecoder(target, SMALL, gamma=2).generate(
      [prompt] * 12_000, max_new_tokens=3, sampling=sp, seed=7)
  st = res.stats
  assert 0.05 < st.acceptance_rate < 0.95  # accepts and rejections both happen
  V = SMALL.vocab_size
  toks = np.asarray([r[:3] for r in res.tokens])
  samples = toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2]
  exact = exact_sequence_probs(target, SMALL, prompt, sp)
  assert chi2_pvalue(samples, exact) > 1e-3


def test_bad_settings():
  params = init_params(jax.random.key(0), CFG)
  with pytest.raises(ValueError, match="gamma must be >= 1, got gamma=0"):
    PromptLookupDecoder(params, CFG, gamma=0)
  with pytest.raises(ValueError, match="min_ngram=3 max_ngram=2"):
    PromptLookupDecoder(params, CFG, max_ngram=2, min_ngram=3)
  with pytest.raises(ValueError, match="exceeds the cache length max_len=16"):
    PromptLookupDecoder(params, CFG, gamma=4).generate([[1] * 8], max_new_tokens=6, max_len=16)
