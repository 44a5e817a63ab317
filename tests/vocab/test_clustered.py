"""DynaSpec's cluster shortlists: balanced clusters, exact logits, lossless decoding, the
router file's checks."""

import jax
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.models import init_params
from vocabjax.models.identity import drafter_identity
from vocabjax.models.llamalike import lm_head, lm_head_weight
from vocabjax.testing.fixtures import successor_pair
from vocabjax.vocab.clustered import ClusterRouter, ClusteredVocab, RouterError, fit_clusters

from tests.helpers.models import CFG, SMALL, check_vocab_sampling_lossless
from tests.helpers.vocab import trimmed_and_full


def _router(params, config, C, seed=0):
  """Clusters of the drafter's head and a random router (it picks unrelated clusters)."""
  members = fit_clusters(np.asarray(lm_head_weight(params, config)), C, iters=3, seed=seed)
  rs = np.random.RandomState(seed)
  return ClusterRouter(members, rs.randn(C, config.hidden_size).astype(np.float32),
                       rs.randn(C).astype(np.float32), drafter_identity(params, config))


def test_clusters_are_a_balanced_partition_of_alike_rows():
  rs = np.random.RandomState(0)
  centers = rs.randn(4, 16)
  group = rs.permutation(np.repeat(np.arange(4), [50, 50, 50, 47]))
  U = centers[group] + 0.05 * rs.randn(197, 16)
  members = fit_clusters(U, 4, iters=5)
  assert members.shape == (4, 50)  # M = ceil(197 / 4)
  held = members[members >= 0]
  assert sorted(held.tolist()) == list(range(197))
  # each group of alike rows is one cluster
  assert sorted(tuple(sorted(set(group[m[m >= 0]].tolist()))) for m in members) == [
      (0,), (1,), (2,), (3,)]
  # a group larger than a cluster's room spills, the clusters stay at most M
  big = fit_clusters(np.concatenate([U, U[group == 0][:10]]), 4, iters=3)
  assert (big >= 0).sum(1).max() <= 52
  with pytest.raises(RouterError, match="num_clusters=0 must be in"):
    fit_clusters(U, 0)


def test_policy_gives_exact_logits_of_the_chosen_clusters(pair):
  _, draft = pair
  r = _router(draft, CFG, C=8)
  params, policy = ClusteredVocab(r, top=2).attach(draft, CFG)
  h = np.random.RandomState(1).randn(5, CFG.hidden_size).astype(np.float32)
  ids, z = (np.asarray(x) for x in policy(params, h))
  assert ids.shape == z.shape == (5, 2 * r.cluster_size)
  scores = h @ r.weight.T + r.bias
  full = np.asarray(lm_head(draft, h, config=CFG))
  for n in range(5):
    want = np.argsort(-scores[n])[:2]
    toks = r.members[want][r.members[want] >= 0]
    finite = np.isfinite(z[n])
    assert sorted(ids[n][finite].tolist()) == sorted(toks.tolist())
    np.testing.assert_allclose(z[n][finite], full[n][ids[n][finite]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [pytest.param("chain", marks=pytest.mark.full_opt), "tree"])
def test_greedy_identical_with_cluster_shortlists(pair, kind):
  target, draft = pair
  rs = np.random.RandomState(0)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  dec, _ = trimmed_and_full(kind, target, draft, CFG, ClusteredVocab(_router(draft, CFG, 8), 2))
  assert dec.generate(prompts, max_new_tokens=24).tokens == ar.tokens


@pytest.mark.extended(params=["tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_the_router_sets_acceptance_not_output(kind):
  """Drafter = target (t -> t + 1), 12 tokens in 4 clusters. A router that always picks every
  cluster keeps the full drafter's tau; one that picks a cluster unrelated to the context drops
  it. Outputs stay identical."""
  config, target, _ = successor_pair(vocab_size=12, skip=0)
  base = _router(target, config, C=4)
  every = ClusteredVocab(base, top=4)
  one = ClusteredVocab(ClusterRouter(base.members, np.zeros_like(base.weight),
                                     np.arange(4, dtype=np.float32), base.drafter), top=1)
  prompts = [[0], [3, 4], [7]]
  ar = Decoder(target, config).generate(prompts, max_new_tokens=20)
  d_every, full = trimmed_and_full(kind, target, target, config, every)
  d_one, _ = trimmed_and_full(kind, target, target, config, one)
  r_full, r_every, r_one = (d.generate(prompts, max_new_tokens=20)
                            for d in (full, d_every, d_one))
  assert r_full.tokens == r_every.tokens == r_one.tokens == ar.tokens
  assert r_every.stats.tau == r_full.stats.tau == 4.0
  assert r_one.stats.tau < 2.5


@pytest.mark.extended(params=["t1-chain", "t0.7-p0.9-tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_cluster_sampling_is_lossless(small_pair, sp, kind):
  """12,000 seeded rows over V = 8 in 4 clusters of 2, two chosen per row and step by a random
  router: the joint law of the first three tokens is the target's."""
  check_vocab_sampling_lossless(kind, small_pair, ClusteredVocab(_router(small_pair[1], SMALL, 4),
                                                                 top=2), sp, seed=29)


def test_router_file_round_trip_and_checks(tmp_path, pair):
  target, draft = pair
  r = _router(draft, CFG, C=8)
  path = r.save(tmp_path / "router.safetensors")
  back = ClusterRouter.load(path)
  np.testing.assert_array_equal(back.members, r.members)
  np.testing.assert_array_equal(back.weight, r.weight)
  back.check_drafter(draft, CFG)
  with pytest.raises(RouterError, match="fitted for another drafter"):
    ClusteredVocab(back, 2).attach(target, CFG)
  other = CFG.__class__(**{**CFG.__dict__, "vocab_size": 80})
  with pytest.raises(RouterError, match="vocab_size=64, this drafter has vocab_size=80"):
    back.check_drafter(init_params(jax.random.key(0), other), other)
  wide = CFG.__class__(**{**CFG.__dict__, "hidden_size": 48, "head_dim": 12})
  with pytest.raises(RouterError, match="hidden_size=32, this drafter has hidden_size=48"):
    back.check_drafter(init_params(jax.random.key(0), wide), wide)
  with pytest.raises(RouterError, match=r"top=9 clusters must be in \[1, C=8\]"):
    ClusteredVocab(back, top=9)
  with pytest.raises(RouterError, match="a cluster count of zero"):
    ClusterRouter(np.zeros((0, 4), np.int32), np.zeros((0, 32)), np.zeros(0), r.drafter)
  with pytest.raises(RouterError, match="do not partition the vocabulary of V=64"):
    ClusterRouter(np.zeros_like(r.members), r.weight, r.bias, r.drafter)
  bad = tmp_path / "bad.safetensors"
  bad.write_bytes(path.read_bytes()[:100])
  with pytest.raises(RouterError, match="not a readable router file"):
    ClusterRouter.load(bad)
  with pytest.raises(RouterError, match="no router file"):
    ClusterRouter.load(tmp_path / "missing.safetensors")
