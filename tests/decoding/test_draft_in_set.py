"""Drafting within the request's sampling set (`SamplingParams.draft_in_set`): lossless either
way, and drafts outside the set are the ones the target rejects."""

import jax
import numpy as np
import pytest

from vocabjax.decoding import SamplingParams
from vocabjax.decoding.drafter import ChainProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.vocab.policy import candidate_sampling, draft_choice, full_policy

from tests.helpers.models import PROMPT, SMALL, exact_sequence_probs, prompt_samples
from vocabjax.testing.stats import chi2_pvalue


def test_the_draft_law_is_the_request_set_or_the_temperature_alone():
  sp = SamplingParams(0.7, 3, 0.9)
  assert sp.draft_law is sp
  raw = SamplingParams(0.7, 3, 0.9, draft_in_set=False)
  assert raw.draft_law == SamplingParams(0.7)
  assert candidate_sampling(raw, 8) == SamplingParams(0.7)
  with pytest.raises(ValueError, match="draft_in_set must be true or false"):
    SamplingParams(0.7, draft_in_set="no")


def test_drafts_fall_outside_the_top_k_only_when_asked(small_pair):
  """With top_k=2 a drafted token is always one of the drafter's two best; drawn from the
  temperature-only law, some of 2,000 draws are not."""
  _, draft = small_pair
  h = jax.random.normal(jax.random.key(0), (2000, SMALL.hidden_size))
  policy = full_policy(SMALL)
  best2 = np.argsort(-np.asarray(policy(draft, h)[1]), axis=-1)[:, :2]
  for in_set, outside in ((True, 0), (False, None)):
    d, q = draft_choice(policy, draft, h, jax.random.key(1),
                        SamplingParams(1.0, 2, 1.0, draft_in_set=in_set), SMALL.vocab_size)
    miss = int((~(np.asarray(d)[:, None] == best2).any(1)).sum())
    if outside == 0:
      assert miss == 0 and (np.asarray(q) > 0).sum(-1).max() == 2
    else:
      assert miss > 100


@pytest.mark.parametrize("in_set", [True, False])
def test_sampling_is_lossless_within_or_outside_the_set(small_pair, in_set):
  """12,000 seeded rows at T 0.7 / top-p 0.9: the joint law of the first three tokens is the
  target's whichever law the chain drafts from. (Whether drafting within the drafter's own set
  accepts more depends on how the drafter's set overlaps the target's: measured, not a law;
  eval/results/draft_in_set.)"""
  target, draft = small_pair
  sp = SamplingParams(0.7, 0, 0.9, draft_in_set=in_set)
  dec = SpeculativeEngine(target, SMALL, ChainProposer(draft, SMALL, SMALL, gamma=2))
  samples, stats = prompt_samples(dec, sp, seed=37)
  assert 0.05 < stats.acceptance_rate < 0.95
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) > 1e-3
