"""The tiny model configs the decoding tests share (`CFG`: V = 64; `SMALL`: V = 8, whose
exact laws are computable), the test dtype (`VOCABJAX_TEST_DTYPE`), the usual decoders of a
pair (`greedy_decoders`), and the sampling checks (`prompt_samples`,
`check_vocab_sampling_lossless`)."""

import os

import numpy as np

from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams
from vocabjax.models import LlamaLikeConfig
from vocabjax.models.llamalike import cast_weights
from vocabjax.testing.proposers import sampled_cells
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs

CFG = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True)

SMALL = LlamaLikeConfig(arch="llama", vocab_size=8, hidden_size=16, intermediate_size=16,
                        num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)

PROMPT = [3, 1]

DTYPE = os.environ.get("VOCABJAX_TEST_DTYPE", "float32")
if DTYPE not in ("float32", "bfloat16"):
  raise ValueError(f"VOCABJAX_TEST_DTYPE={DTYPE!r}: choose float32 or bfloat16")


def random_prompts(n_max: int = 17, seed: int = 0, config=CFG) -> list[list[int]]:
  """Four seeded prompts of lengths 1, 9, 4 and n_max over `config`'s vocabulary."""
  rs = np.random.RandomState(seed)
  return [rs.randint(0, config.vocab_size, n).tolist() for n in (1, 9, 4, n_max)]


def as_test_dtype(params):
  if DTYPE == "float32":
    return params
  return cast_weights(params, DTYPE)


def greedy_decoders(target, draft, config=CFG) -> dict:
  """Plain decoding and the three methods every weight format and lowering is checked with:
  a chain (gamma 3), a tree (2 x 3, 6 nodes) and prompt lookup (gamma 3), by name."""
  return {
      "ar": Decoder(target, config),
      "chain": SpeculativeEngine(target, config, ChainProposer(draft, config, config, gamma=3)),
      "tree": SpeculativeEngine(target, config, TreeProposer(draft, config, config,
                                                              tree=TreeParams(2, 3, 6))),
      "pld": SpeculativeEngine(target, config, LookupProposer(gamma=3)),
  }


def prompt_samples(decoder, sampling, n: int = 12_000, seed: int = 5, prompt=PROMPT):
  """n seeded rows of `prompt`, 3 new tokens each: (flat cell ids x1*V^2 + x2*V + x3, stats)
  (`vocabjax.testing.proposers.sampled_cells` over SMALL's vocabulary)."""
  return sampled_cells(decoder, prompt, sampling, SMALL.vocab_size, n, seed)


def check_vocab_sampling_lossless(kind, small_pair, draft_vocab, sampling, seed):
  """Sample PROMPT with a chain (gamma 2) or tree (2, 2, 4) decoder of `small_pair` drafting
  over `draft_vocab`; assert the acceptance rate is informative (0.05-0.95) and the joint law
  of the first three tokens matches target-only sampling (chi-square p > 1e-3).
  Returns (flat samples, the exact law)."""
  target, draft = small_pair
  if kind == "chain":
    dec = SpeculativeEngine(target, SMALL,
                            ChainProposer(draft, SMALL, SMALL, gamma=2, draft_vocab=draft_vocab))
  else:
    dec = SpeculativeEngine(
        target, SMALL,
        TreeProposer(draft, SMALL, SMALL, tree=TreeParams(2, 2, 4), draft_vocab=draft_vocab))
  samples, stats = prompt_samples(dec, sampling, seed=seed)
  assert 0.05 < stats.acceptance_rate < 0.95
  exact = exact_sequence_probs(target, SMALL, PROMPT, sampling)
  assert chi2_pvalue(samples, exact) > 1e-3
  return samples, exact
