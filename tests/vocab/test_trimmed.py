"""Trimmed drafter head: exact logits on the subset, greedy identity, statistical losslessness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams
from vocabjax.models.llamalike import lm_head
from vocabjax.testing.fixtures import successor_pair
from vocabjax.vocab import SubsetError, VocabSubset
from vocabjax.vocab.policy import scatter_full, to_target
from vocabjax.vocab.subset import attach_subset, static_policy, subset_rows

from tests.helpers.models import CFG, SMALL, check_vocab_sampling_lossless
from tests.helpers.vocab import trimmed_and_full


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_trimmed_head_is_the_full_head_on_the_subset(dtype):
  from vocabjax.models import init_params
  from vocabjax.models.llamalike import cast_weights

  params = init_params(jax.random.key(3), CFG, scale=0.3)
  if dtype == "int8":  # int8 rows keep their per-row scales in the trimmed head
    params = cast_weights(params, "int8")
  ids = np.array([0, 5, 6, 17, 40, 63])
  p = attach_subset(params, CFG, VocabSubset(ids=ids, vocab_size=CFG.vocab_size))
  assert subset_rows(p) == 6 and subset_rows(params) is None
  h = jax.random.normal(jax.random.key(4), (3, 2, CFG.hidden_size))
  full = np.asarray(lm_head(params, h, config=CFG))
  got_ids, got = static_policy(p, h)
  assert got.shape == (3, 2, 6) and np.all(np.asarray(got_ids) == ids)
  np.testing.assert_allclose(np.asarray(got), full[..., ids], rtol=1e-5, atol=1e-5)
  # q over the candidates scattered into V: zeros outside, the candidate values at their ids
  q = np.asarray(scatter_full(got_ids, jnp.exp(got), CFG.vocab_size))
  outside = np.setdiff1d(np.arange(CFG.vocab_size), ids)
  assert np.all(q[..., outside] == 0)
  np.testing.assert_allclose(q[..., ids], np.exp(np.asarray(got)), rtol=1e-6)
  # a candidate index maps back to its target id
  j = jnp.asarray([[0, 5], [3, 1], [2, 4]])
  np.testing.assert_array_equal(np.asarray(to_target(got_ids, j)), ids[np.asarray(j)])


def _subset(V, ids):
  return VocabSubset(ids=np.asarray(ids), vocab_size=V)


@pytest.mark.parametrize("kind,draft_dtype", [
    ("chain", "float32"), pytest.param("tree", "float32", marks=pytest.mark.full_opt),
    ("chain", "int8")])
def test_greedy_identical_with_a_trimmed_drafter(pair, kind, draft_dtype):
  """The target's greedy choices often lie outside the subset (half the vocabulary): those
  drafts are impossible, yet the output equals plain greedy decoding token for token (also
  with an int8 drafter, `--draft-dtype int8`)."""
  from vocabjax.models.llamalike import cast_weights

  target, draft = pair
  draft = cast_weights(draft, draft_dtype)
  rs = np.random.RandomState(0)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  dec, _ = trimmed_and_full(kind, target, draft, CFG, _subset(64, np.arange(0, 64, 2)))
  assert dec.generate(prompts, max_new_tokens=24).tokens == ar.tokens
  emitted = np.concatenate([np.asarray(t) for t in ar.tokens])
  assert np.any(emitted % 2 == 1)  # tokens outside the subset really were emitted
  assert dec.draft_head_rows == 32


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_trimmed_drafter_cannot_propose_outside_tokens(kind):
  """Drafter = target (t -> t + 1): the full drafter is always right; with only the even ids
  it cannot propose an odd successor, so acceptance drops, and the output stays identical."""
  config, target, _ = successor_pair(vocab_size=12, skip=0)
  prompts = [[0], [3, 4], [7]]
  ar = Decoder(target, config).generate(prompts, max_new_tokens=20)
  trimmed, full = trimmed_and_full(kind, target, target, config, _subset(12, range(0, 12, 2)))
  r_full, r_trim = (d.generate(prompts, max_new_tokens=20) for d in (full, trimmed))
  assert r_full.tokens == r_trim.tokens == ar.tokens
  assert r_full.stats.tau == 4.0  # every step accepts its whole chain / tree depth (3)
  assert 1.0 < r_trim.stats.tau < 3.0
  assert full.draft_head_rows == 12 and trimmed.draft_head_rows == 6


# --- statistical losslessness: V = 8, tokens 0 and 2 (likely under the target) left out ----

OUT = (0, 2)
SUB = _subset(SMALL.vocab_size, [i for i in range(SMALL.vocab_size) if i not in OUT])


@pytest.mark.extended(params=["t1-chain", "t0.7-p0.9-tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_trimmed_sampling_is_lossless(small_pair, sp, kind):
  """12,000 seeded rows, first three tokens (2 and 3 come from speculation): the joint law
  matches target-only sampling (chi-square p > 1e-3), and the tokens outside the subset come
  out at the target's rate at the drafted positions (within 4 standard errors)."""
  samples, exact = check_vocab_sampling_lossless(kind, small_pair, SUB, sp, seed=13)
  V, n = SMALL.vocab_size, len(samples)
  toks = np.stack([samples // (V * V), samples // V % V, samples % V], axis=1)
  for pos, marginal in ((1, exact.sum(axis=(0, 2))), (2, exact.sum(axis=(0, 1)))):
    for t in OUT:
      rate, p = np.mean(toks[:, pos] == t), marginal[t]
      assert p > 0.05  # the check has teeth: the left-out tokens are not rare under the target
      assert abs(rate - p) < 4 * np.sqrt(p * (1 - p) / n), (pos, t, rate, p)


def test_bad_subsets(pair):
  target, draft = pair
  with pytest.raises(SubsetError, match="vocabulary of 65 tokens.*V=64"):
    SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, draft_vocab=_subset(65, [1, 2])))
  with pytest.raises(ValueError, match="top_k=4 exceeds.*K=3"):
    SpeculativeEngine(
        target, CFG,
        TreeProposer(draft, CFG, CFG, tree=TreeParams(4, 2, 8), draft_vocab=_subset(64, [1, 2, 3])))
