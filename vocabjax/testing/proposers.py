"""The checks every drafting method must pass, for a new proposer's tests (docs/extending.md):

    greedy_identity(decoder, params, config, prompts)      # tokens == plain greedy decoding's
    pvalue, stats = target_law(decoder, params, config, prompt, SamplingParams(temperature=1))
    assert pvalue > 1e-3                                   # sampled law == the target's

`target_law` samples n seeded rows of three new tokens each and compares their joint law with
the target's exact law (`stats.exact_sequence_probs`, a chi-square test): use a model with a
small vocabulary (V = 8: 512 cells) so that n = 12,000 rows fill every cell.
"""

from __future__ import annotations

import numpy as np

from vocabjax.decoding.autoregressive import Decoder
from vocabjax.sampling import SamplingParams
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs


def greedy_identity(decoder, params, config, prompts, max_new_tokens: int = 24, **kw):
  """Assert `decoder`'s greedy tokens equal plain greedy decoding's of the target (`params`,
  `config`) for `prompts`, naming the first row and position that differ; returns the
  decoder's result."""
  want = Decoder(params, config).generate(prompts, max_new_tokens=max_new_tokens, **kw).tokens
  res = decoder.generate(prompts, max_new_tokens=max_new_tokens, **kw)
  for b, (got, ref) in enumerate(zip(res.tokens, want)):
    if got != ref:
      at = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y), min(len(got), len(ref)))
      raise AssertionError(f"{type(decoder).__name__} row {b} differs from plain greedy "
                           f"decoding at new token {at}: {got[at:at + 5]} vs {ref[at:at + 5]}")
  return res


def sampled_cells(decoder, prompt, sampling: SamplingParams, vocab_size: int, n: int = 12_000,
                  seed: int = 5):
  """n seeded rows of `prompt`, three new tokens each: (flat cell ids x1*V^2 + x2*V + x3, the
  run's stats)."""
  res = decoder.generate([list(prompt)] * n, max_new_tokens=3, sampling=sampling, seed=seed)
  toks = np.asarray([r[:3] for r in res.tokens])
  V = vocab_size
  return toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2], res.stats


def target_law(decoder, params, config, prompt, sampling: SamplingParams, n: int = 12_000,
               seed: int = 5):
  """(chi-square p-value of `decoder`'s sampled first three tokens against the target's exact
  law, the run's stats)."""
  cells, stats = sampled_cells(decoder, prompt, sampling, config.vocab_size, n, seed)
  return chi2_pvalue(cells, exact_sequence_probs(params, config, list(prompt), sampling)), stats
