"""The worked example of docs/extending.md: a fixed n-gram table proposer, checked with the
shared helpers every proposer's tests use (`vocabjax.testing.proposers`)."""

import jax
import pytest

from tests.helpers.models import CFG, SMALL
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.methods.ngram import NgramProposer, NgramTable
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.models import init_params
from vocabjax.testing.proposers import greedy_identity, target_law


def test_the_table_drafts_the_most_frequent_continuation_backing_off():
  table = NgramTable.fit([[1, 2, 3, 1, 2, 4, 1, 2, 3]], n=3)
  assert table.next([7, 1, 2]) == 3  # (1, 2) -> 3 twice, 4 once
  assert table.next([9, 4]) == 1  # (9, 4) unseen: backs off to (4,) -> 1
  assert table.next([9]) is None
  assert table.draft([5, 1, 2], 4) == [3, 1, 2, 3]
  assert table.draft([8], 4) == []


def test_greedy_identical_to_plain_decoding_and_drafts_are_accepted():
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  seen = [[5, 9, 2], [1, 2, 3, 4]]
  # a table fit on the target's own greedy text: most of its drafts are accepted
  corpus = [p + t for p, t in zip(seen, Decoder(params, CFG).generate(
      seen, max_new_tokens=24).tokens)]
  dec = SpeculativeEngine(params, CFG, NgramProposer(NgramTable.fit(corpus, n=3), gamma=3))
  res = greedy_identity(dec, params, CFG, seen + [[7, 7, 1]], max_new_tokens=24)
  assert res.stats.tau > 1.5 and res.stats.record()["matched_steps"] > 0


def test_sampling_follows_the_target_law():
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  dec = SpeculativeEngine(target, SMALL,
                          NgramProposer(NgramTable.fit([[3, 1, *greedy]], n=2), gamma=2))
  pvalue, stats = target_law(dec, target, SMALL, [3, 1], SamplingParams(temperature=1.0), seed=7)
  assert 0.05 < stats.acceptance_rate < 0.95  # accepts and rejections both happen
  assert pvalue > 1e-3


def test_bad_settings_are_refused_naming_the_value():
  with pytest.raises(ValueError, match="n >= 2.*got n=1"):
    NgramTable(1)
  with pytest.raises(ValueError, match="the corpus is empty"):
    NgramTable.fit([[4]])
  with pytest.raises(ValueError, match="gamma must be >= 1, got gamma=0"):
    NgramProposer(NgramTable.fit([[1, 2]]), gamma=0)
