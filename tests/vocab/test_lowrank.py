"""The low-rank draft head (SlimSpec): its logits, lossless decoding, and its factors' checks."""

import jax
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.models import init_params
from vocabjax.models.llamalike import lm_head
from vocabjax.testing.fixtures import successor_pair
from vocabjax.vocab.lowrank import LowRankHead
from vocabjax.vocab.ranked import Ranker, RankerError, svd_ranker

from tests.helpers.models import CFG, SMALL, check_vocab_sampling_lossless
from tests.helpers.vocab import trimmed_and_full


def test_logits_are_the_factors_product_over_every_token(pair):
  _, draft = pair
  f = svd_ranker(draft, CFG, rank=4)
  params, policy = LowRankHead(f).attach(draft, CFG)
  h = np.random.RandomState(0).randn(3, 2, CFG.hidden_size).astype(np.float32)
  ids, z = policy(params, h)
  assert ids is None and z.shape == (3, 2, CFG.vocab_size)
  np.testing.assert_allclose(np.asarray(z), h @ f.down.T @ f.vocab.T, rtol=1e-4, atol=1e-4)
  full = svd_ranker(draft, CFG, rank=CFG.hidden_size)  # full rank: the head itself
  params, policy = LowRankHead(full).attach(draft, CFG)
  np.testing.assert_allclose(np.asarray(policy(params, h)[1]),
                             np.asarray(lm_head(draft, h, config=CFG)), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", [pytest.param("chain", marks=pytest.mark.full_opt), "tree"])
def test_greedy_identical_with_a_low_rank_head(pair, kind):
  target, draft = pair
  rs = np.random.RandomState(0)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  dec, _ = trimmed_and_full(kind, target, draft, CFG, LowRankHead(svd_ranker(draft, CFG, 2)))
  assert dec.generate(prompts, max_new_tokens=24).tokens == ar.tokens


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_rank_sets_acceptance_not_output(kind):
  """Drafter = target (t -> t + 1): the full-rank factors are the head (tau = the full
  drafter's); rank 1 cannot tell 12 successors apart (tau drops). Outputs stay identical."""
  config, target, _ = successor_pair(vocab_size=12, skip=0)
  prompts = [[0], [3, 4], [7]]
  ar = Decoder(target, config).generate(prompts, max_new_tokens=20)
  exact, full = trimmed_and_full(kind, target, target, config,
                                 LowRankHead(svd_ranker(target, config, config.hidden_size)))
  low, _ = trimmed_and_full(kind, target, target, config,
                            LowRankHead(svd_ranker(target, config, 1)))
  r_full, r_exact, r_low = (d.generate(prompts, max_new_tokens=20) for d in (full, exact, low))
  assert r_full.tokens == r_exact.tokens == r_low.tokens == ar.tokens
  assert r_exact.stats.tau == r_full.stats.tau == 4.0
  assert r_low.stats.tau < 3.0


@pytest.mark.extended(params=["t1-chain", "t0.7-p0.9-tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_low_rank_sampling_is_lossless(small_pair, sp, kind):
  """12,000 seeded rows over V = 8 drafting from a rank-2 head (a law unlike the drafter's):
  the joint law of the first three tokens is the target's."""
  check_vocab_sampling_lossless(kind, small_pair, LowRankHead(svd_ranker(small_pair[1], SMALL, 2)),
                                sp, seed=23)


def test_factors_for_another_drafter_are_refused(pair):
  target, draft = pair
  f = svd_ranker(draft, CFG, rank=4)
  with pytest.raises(RankerError, match="trained for another drafter"):
    LowRankHead(f).attach(target, CFG)
  other = CFG.__class__(**{**CFG.__dict__, "hidden_size": 48, "head_dim": 12})
  with pytest.raises(RankerError, match="hidden_size=32, this drafter has hidden_size=48"):
    LowRankHead(f).attach(init_params(jax.random.key(0), other), other)
  with pytest.raises(RankerError, match="its rank 40 exceeds its width 32"):
    Ranker(np.zeros((40, 32)), np.zeros((64, 40)), f.drafter)
