"""Checks shared by the sliding-window tests (Gemma 3's mixed layers, Mistral's all-sliding
ones): exact speculative decoding past the window, on one device and on a mesh."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers.models import prompt_samples
from vocabjax import sharding
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams
from vocabjax.models import KVCache, init_params
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs


def _prompts(config, seed: int) -> list[list[int]]:
  """Four prompts of 1, 9, 3 and 17 random tokens: shorter and longer than a window of 4."""
  rs = np.random.RandomState(seed)
  return [rs.randint(0, config.vocab_size, n).tolist() for n in (1, 9, 3, 17)]


def _decoder(kind: str, pair, config, mesh=None):
  target, draft = pair
  if kind == "chain":
    return SpeculativeEngine(target, config, ChainProposer(draft, config, config, gamma=3),
                             mesh=mesh)
  return SpeculativeEngine(target, config,
                           TreeProposer(draft, config, config, tree=TreeParams(2, 3, 6)), mesh=mesh)


def speculative_past_the_window(pair, config, kind: str, *, seed: int, alone: bool) -> None:
  """Chain (gamma 3) or tree (2, 3, 6) drafting gives the plain greedy ids of 24 new tokens
  after `_prompts`, batched (and the 17-token prompt alone with `alone`: a row that wraps its
  ring at its own pace), meeting accepted and rejected drafts, on a model that does not repeat
  itself."""
  prompts = _prompts(config, seed)
  ar = Decoder(pair[0], config).generate(prompts, max_new_tokens=24)
  dec = _decoder(kind, pair, config)
  batched = dec.generate(prompts, max_new_tokens=24)
  assert batched.tokens == ar.tokens
  if alone:
    assert dec.generate([prompts[3]], max_new_tokens=24).tokens[0] == ar.tokens[3]
  assert 0.1 < batched.stats.acceptance_rate < 0.9  # accepted and rejected drafts both met
  assert len(set(ar.tokens[3])) > 8  # a model that does not repeat itself


def rings_on_a_mesh(pair, config, kinds, *, seed: int) -> KVCache:
  """On a (4, 2) mesh (rows over "data", KV heads over "model"): plain decoding and each of
  `kinds` give the one-device greedy ids past the window, speculative ones with drafts
  accepted and a step that only all-reduces and all-gathers (a ring written by one scatter
  over the batch gathered every row's slots and entries and permuted them between devices).
  Returns the sharded cache the decoders start from (its ring of W + 9 slots, the caller's
  RING_SLACK)."""
  prompts = _prompts(config, seed)
  ref = Decoder(pair[0], config).generate(prompts, max_new_tokens=24).tokens
  mesh = sharding.make_mesh(data=4, model=2)
  cache = sharding.shard_cache(KVCache.init(config, 4, 64), config, mesh)
  assert cache.ring == 13
  assert Decoder(pair[0], config, mesh=mesh).generate(prompts, max_new_tokens=24).tokens == ref
  for kind in kinds:
    dec = _decoder(kind, pair, config, mesh)
    res = dec.generate(prompts, max_new_tokens=24)
    assert res.tokens == ref and res.stats.tau > 1, kind
    _, step, compile_s = dec.programs(SamplingParams(), 4, 32, dec.cache_len(17, 24),
                                      jnp.float32)
    assert compile_s == 0.0  # the step generate ran
    assert set(sharding.collectives(step.as_text())) <= {"all-reduce", "all-gather"}, kind
  return cache


def sampling_keeps_the_targets_law(config, seed: int) -> None:
  """Chain drafting (gamma 2) between two unrelated models of `config` (V = 8, a window of 2,
  so the 3 tokens sampled after a 2-token prompt pass it): the joint law of the first three
  tokens is the target's (chi-square over 12,000 seeded rows, p > 1e-3)."""
  target = init_params(jax.random.key(seed), config, scale=0.8)
  draft = init_params(jax.random.key(seed + 1), config, scale=0.8)
  sp = SamplingParams(1.0)
  dec = SpeculativeEngine(target, config, ChainProposer(draft, config, config, gamma=2))
  samples, stats = prompt_samples(dec, sp, prompt=[3, 1])
  assert 0.05 < stats.acceptance_rate < 0.95
  assert chi2_pvalue(samples, exact_sequence_probs(target, config, [3, 1], sp)) > 1e-3
