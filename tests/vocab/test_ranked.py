"""SpecVocab's ranker policy: exact logits on the ranked candidates, greedy identity, statistical
losslessness with per-row candidate sets, ranker files and their checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams
from vocabjax.models import init_params
from vocabjax.models.llamalike import lm_head
from vocabjax.testing.fixtures import successor_pair
from vocabjax.vocab.policy import policy_state
from vocabjax.vocab.ranked import (Ranker, RankerError, SpeculativeVocab,
                                   ranker_scores, svd_ranker)

from tests.helpers.models import CFG, SMALL, check_vocab_sampling_lossless
from tests.helpers.vocab import trimmed_and_full


def _random_ranker(params, config, rank, seed=0):
  """A ranker unrelated to the drafter's logits: its candidates often miss the drafter's and
  the target's choices, and differ from row to row."""
  base = svd_ranker(params, config, rank)
  rs = np.random.RandomState(seed)
  return Ranker(rs.randn(*base.down.shape).astype(np.float32),
                rs.randn(*base.vocab.shape).astype(np.float32), base.drafter)


def test_policy_gives_exact_logits_of_the_top_k_ranked_tokens():
  params = init_params(jax.random.key(3), CFG, scale=0.3)
  sv = SpeculativeVocab(_random_ranker(params, CFG, rank=4), k=10)
  p, policy = sv.attach(params, CFG)
  h = jax.random.normal(jax.random.key(4), (3, 2, CFG.hidden_size))
  ids, z = policy(p, h)
  assert ids.shape == z.shape == (3, 2, 10)
  s = np.asarray(ranker_scores(policy_state(p), h))
  want_ids = np.argsort(-s, axis=-1)[..., :10]
  np.testing.assert_array_equal(np.sort(np.asarray(ids), -1), np.sort(want_ids, -1))
  full = np.asarray(lm_head(params, h, config=CFG))
  np.testing.assert_allclose(np.asarray(z), np.take_along_axis(full, np.asarray(ids), -1),
                             rtol=1e-5, atol=1e-5)
  assert len({tuple(r) for r in np.sort(np.asarray(ids), -1).reshape(6, 10).tolist()}) > 1
  assert sv.head_rows == 10 + -(-(64 * 4 + 4 * 32) // 32)


def test_full_rank_svd_ranker_reproduces_the_drafter_logits():
  params = init_params(jax.random.key(5), CFG, scale=0.3)
  r = svd_ranker(params, CFG, rank=CFG.hidden_size)
  h = jax.random.normal(jax.random.key(6), (5, CFG.hidden_size))
  s = ranker_scores({"down": jnp.asarray(r.down), "vocab": jnp.asarray(r.vocab)}, h)
  np.testing.assert_allclose(np.asarray(s), np.asarray(lm_head(params, h, config=CFG)),
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", [pytest.param("chain", marks=pytest.mark.full_opt), "tree"])
def test_greedy_identical_with_a_ranked_vocabulary(pair, kind):
  target, draft = pair
  rs = np.random.RandomState(0)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  # a ranker that knows nothing: candidates often exclude the target's choice
  dec, _ = trimmed_and_full(kind, target, draft, CFG,
                            SpeculativeVocab(_random_ranker(draft, CFG, 4), 8))
  assert dec.generate(prompts, max_new_tokens=24).tokens == ar.tokens


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_ranker_quality_sets_acceptance_not_output(kind):
  """Drafter = target (t -> t + 1): the full drafter is always right (tau = depth + 1). The
  exact (full-rank) ranker keeps the drafter's argmax among its candidates: same tau. A random
  ranker with 3 of 12 candidates mostly misses it: tau drops. Outputs stay identical."""
  config, target, _ = successor_pair(vocab_size=12, skip=0)
  prompts = [[0], [3, 4], [7]]
  ar = Decoder(target, config).generate(prompts, max_new_tokens=20)
  exact = SpeculativeVocab(svd_ranker(target, config, config.hidden_size), k=3)
  rand = SpeculativeVocab(_random_ranker(target, config, 2, seed=3), k=3)
  d_exact, full = trimmed_and_full(kind, target, target, config, exact)
  d_rand, _ = trimmed_and_full(kind, target, target, config, rand)
  r_full, r_exact, r_rand = (d.generate(prompts, max_new_tokens=20)
                             for d in (full, d_exact, d_rand))
  assert r_full.tokens == r_exact.tokens == r_rand.tokens == ar.tokens
  assert r_full.stats.tau == r_exact.stats.tau == 4.0
  assert 1.0 <= r_rand.stats.tau < 3.0


@pytest.mark.extended(params=["t1-chain", "t0.7-p0.9-tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_ranked_sampling_is_lossless(small_pair, sp, kind):
  """12,000 seeded rows, 3 candidates of V = 8 per step chosen by a random ranker (different
  per row and step): the joint law of the first three tokens matches target-only sampling."""
  sv = SpeculativeVocab(_random_ranker(small_pair[1], SMALL, rank=2, seed=1), k=3)
  check_vocab_sampling_lossless(kind, small_pair, sv, sp, seed=17)


def test_ranker_file_round_trip_and_checks(tmp_path, pair):
  target, draft = pair
  r = svd_ranker(draft, CFG, rank=4, meta={"note": "x"})
  path = r.save(tmp_path / "r.safetensors")
  back = Ranker.load(path)
  np.testing.assert_array_equal(back.down, r.down)
  np.testing.assert_array_equal(back.vocab, r.vocab)
  assert back.drafter == r.drafter and back.meta["note"] == "x" and back.rank == 4
  back.check_drafter(draft, CFG)
  with pytest.raises(RankerError, match="trained for another drafter"):
    back.check_drafter(target, CFG)  # same shapes, other weights
  with pytest.raises(RankerError, match="trained for another drafter"):
    SpeculativeEngine(target, CFG,
                      ChainProposer(target, CFG, CFG, draft_vocab=SpeculativeVocab(back, k=4)))
  other = CFG.__class__(**{**CFG.__dict__, "vocab_size": 80})
  with pytest.raises(RankerError, match="vocab_size=64, this drafter has vocab_size=80"):
    back.check_drafter(init_params(jax.random.key(0), other), other)
  with pytest.raises(RankerError, match=r"k=65 must be in \[1, V=64\]"):
    SpeculativeVocab(back, k=65)
  with pytest.raises(RankerError, match="rank d'=33 must be in"):
    svd_ranker(draft, CFG, rank=33)
  with pytest.raises(RankerError, match="its rank 40 exceeds its width 32"):
    Ranker(np.zeros((40, 32)), np.zeros((64, 40)), r.drafter)
  with pytest.raises(ValueError, match="top_k=9 exceeds.*K=8"):
    SpeculativeEngine(
        target, CFG,
        TreeProposer(draft, CFG, CFG, tree=TreeParams(9, 2, 12),
                     draft_vocab=SpeculativeVocab(back, k=8)))
  bad = tmp_path / "bad.safetensors"
  bad.write_bytes(path.read_bytes()[:200])
  with pytest.raises(RankerError, match="not a readable ranker file"):
    Ranker.load(bad)
  with pytest.raises(RankerError, match="no ranker file"):
    Ranker.load(tmp_path / "missing.safetensors")
