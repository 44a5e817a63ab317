"""Logit processing against a numpy reference, and sampling tested as a distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.stats import chi2

from vocabjax.sampling import SamplingParams, log_probs, sample


def _reference_probs(logits: np.ndarray, t: float, k: int, p: float) -> np.ndarray:
  z = logits.astype(np.float64) / t
  if k:
    z = np.where(z >= np.sort(z)[::-1][k - 1], z, -np.inf)
  probs = np.exp(z - z.max())
  probs /= probs.sum()
  if p < 1:
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]
    keep = np.zeros_like(probs, bool)
    keep[order[before < p]] = True
    probs = np.where(keep, probs, 0)
    probs /= probs.sum()
  return probs


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 5, 1.0), (0.5, 8, 0.8),
                                   (1.0, 0, 0.05)])
def test_log_probs_match_reference(t, k, p):
  logits = np.random.RandomState(0).randn(3, 40).astype(np.float32) * 2
  ours = np.exp(np.asarray(log_probs(jnp.asarray(logits), SamplingParams(t, k, p))))
  for row in range(3):
    np.testing.assert_allclose(ours[row], _reference_probs(logits[row], t, k, p), atol=1e-5)


def test_greedy_is_point_mass_on_argmax():
  logits = jnp.asarray([[0.1, 3.0, 3.0, -1.0]])
  lp = np.asarray(log_probs(logits, SamplingParams()))
  assert lp[0, 1] == 0 and np.all(np.isneginf(lp[0, [0, 2, 3]]))
  assert int(sample(jax.random.key(0), logits, SamplingParams())[0]) == 1


@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9),
                                SamplingParams(1.0, 6, 1.0)])
def test_samples_follow_the_processed_distribution(sp):
  """Chi-square goodness of fit over 40,000 draws; fails if sampling were biased."""
  logits = np.random.RandomState(1).randn(1, 12).astype(np.float32)
  n = 40_000
  draws = sample(jax.random.key(3), jnp.broadcast_to(jnp.asarray(logits), (n, 12)), sp)
  counts = np.bincount(np.asarray(draws), minlength=12)
  probs = np.exp(np.asarray(log_probs(jnp.asarray(logits), sp)))[0]
  support = probs > 0
  assert counts[~support].sum() == 0  # nothing outside top-k / top-p
  expected = probs[support] * n
  stat = float(((counts[support] - expected) ** 2 / expected).sum())
  p_value = float(chi2.sf(stat, support.sum() - 1))
  assert p_value > 1e-3, (stat, p_value)


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.1), "temperature must be >= 0"),
    (dict(top_p=0.0), "top_p must be in"),
    (dict(top_p=1.5), "top_p must be in"),
    (dict(top_k=-1), "top_k must be >= 0"),
    (dict(temperature="hot"), "temperature must be a number, got 'hot'"),
    (dict(temperature=True), "temperature must be a number, got True"),
    (dict(temperature=float("nan")), "temperature must be >= 0"),
    (dict(top_k=2.5), "top_k must be an integer, got 2.5"),
    (dict(top_p=float("nan")), "top_p must be in"),
])
def test_bad_sampling_params(kwargs, match):
  with pytest.raises(ValueError, match=match):
    SamplingParams(**kwargs)


def test_top_k_larger_than_vocab():
  with pytest.raises(ValueError, match="top_k=500 exceeds the vocabulary size V=128"):
    SamplingParams(1.0, 500).validate_for_vocab(128)


@pytest.mark.parametrize("V,k,block", [(1000, 4, 64), (1000, 10, 100), (4097, 16, 1024),
                                       (300, 3, 128)])
def test_blocked_top_k_gives_lax_top_k_values_and_indices(V, k, block):
  """The two-stage top-k TPU steps use (`Lowering.block_top_k`): the same values and indices as
  one top-k, ties (many equal values, -inf masks) resolved to the lower index alike."""
  import jax
  import jax.numpy as jnp

  from vocabjax.sampling import blocked_top_k, top_k

  rs = np.random.RandomState(V + k)
  for x in (rs.randn(3, 2, V), np.round(rs.randn(3, 2, V)),  # rounding: many exact ties
            np.where(rs.rand(3, 2, V) < 0.9, -np.inf, rs.randn(3, 2, V))):
    x = jnp.asarray(x, jnp.float32)
    want = jax.lax.top_k(x, k)
    for got in (blocked_top_k(x, k, block), top_k(x, k, block=block)):
      np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
      np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
