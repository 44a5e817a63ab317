"""Statistical checks for losslessness tests: exact target laws and a chi-square fit."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.stats import chi2

from vocabjax.sampling import SamplingParams, log_probs
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import forward, lm_head


def exact_sequence_probs(params, config: LlamaLikeConfig, prompt: list[int],
                         sampling: SamplingParams, n_tokens: int = 3) -> np.ndarray:
  """P(x_1 .. x_n | prompt) under target-only sampling, [V] * n, by enumerating all prefixes.

  Only for tiny vocabularies: it runs V^(n-1) sequences.
  """
  V = config.vocab_size
  next_dist = lambda prefixes: _next_probs(params, config, prompt, prefixes, sampling)  # noqa: E731

  joint = next_dist([()])[0]
  for depth in range(1, n_tokens):
    cond = next_dist(list(itertools.product(range(V), repeat=depth)))  # [V^depth, V]
    joint = joint.reshape(-1, 1) * cond
  return joint.reshape((V,) * n_tokens)


def chi2_pvalue(samples: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
  """Chi-square goodness of fit of integer `samples` (flat cell ids) to `probs`.

  Cells expecting fewer than `min_expected` draws are pooled into one cell. Raises
  AssertionError if a cell of probability 0 was sampled (an impossible token).
  """
  n = len(samples)
  probs = np.asarray(probs, np.float64).ravel()
  counts = np.bincount(samples, minlength=probs.size).astype(np.float64)
  assert counts[probs == 0].sum() == 0, "a sequence with target probability 0 was emitted"
  big = probs * n >= min_expected
  obs, exp = counts[big], probs[big] * n
  if (~big).any() and probs[~big].sum() > 0:
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, probs[~big].sum() * n)
  stat = ((obs - exp) ** 2 / exp).sum()
  return float(chi2.sf(stat, len(obs) - 1))


def exact_support_probs(params, config: LlamaLikeConfig, prompt: list[int],
                        sampling: SamplingParams, n_tokens: int = 3) -> dict[tuple, float]:
  """P(x_1 .. x_n | prompt) under target-only sampling, for every sequence of positive
  probability. For large vocabularies with a small top_k (the enumeration follows the support
  only, so it runs 1 + k + ... + k^(n-1) sequences)."""
  law = {(): 1.0}
  for _ in range(n_tokens):
    prefixes = list(law)
    p = _next_probs(params, config, prompt, prefixes, sampling)
    law = {pre + (int(x),): law[pre] * p[i, x] for i, pre in enumerate(prefixes)
           for x in np.flatnonzero(p[i] > 0)}
  return law


def _next_probs(params, config, prompt, prefixes, sampling) -> np.ndarray:
  """[len(prefixes), V] float64: the target's processed next-token law after prompt + prefix."""
  seqs = jnp.asarray([prompt + list(p) for p in prefixes], jnp.int32)
  return np.exp(np.asarray(_next_log_probs(params, seqs, config=config, sampling=sampling),
                           np.float64))


@functools.partial(jax.jit, static_argnames=("config", "sampling"))
def _next_log_probs(params, seqs, *, config, sampling):
  # one compiled program per shape (run op by op, a [B, T] forward compiled ~80 small
  # programs, a tenth of a chi-square test's time)
  B, T = seqs.shape
  h, _ = forward(params, seqs, jnp.broadcast_to(jnp.arange(T), (B, T)),
                 KVCache.init(config, B, T), config=config)
  return log_probs(lm_head(params, h[:, -1], config=config), sampling)
