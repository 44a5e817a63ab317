"""Prompt lookup decoding: the lookup by hand, greedy identity, losslessness when sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.models import CFG, SMALL, prompt_samples
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.engine import block_request
from vocabjax.decoding.pld import (LookupProposer, continuation_trie, lookup_continuations,
                                   lookup_drafts)
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.sampling import SamplingParams
from vocabjax.models import init_params
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs


def test_lookup_by_hand():
  seq = np.array([5, 6, 7, 8, 9, 1, 2, 5, 6])
  assert lookup_drafts(seq, 3).tolist() == [7, 8, 9]  # suffix (5, 6) seen at 0
  assert lookup_drafts(seq, 10).tolist() == [7, 8, 9, 1, 2, 5, 6]  # runs to the end
  # the longest n-gram wins: (2, 5, 6) at 2 beats (5, 6) at 0
  seq = np.array([5, 6, 0, 2, 5, 6, 4, 4, 2, 5, 6])
  assert lookup_drafts(seq, 2).tolist() == [4, 4]
  assert lookup_drafts(seq, 2, max_ngram=2).tolist() == [0, 2]  # earliest (5, 6)
  assert lookup_drafts(np.array([1, 2, 3, 4]), 3).size == 0  # nothing repeats
  assert lookup_drafts(np.array([9]), 3).size == 0
  # (1, 2) at 0 continues into the suffix itself: not a match; (2,) at 1 is
  assert lookup_drafts(np.array([1, 2, 1, 2]), 3).tolist() == [1, 2]
  assert lookup_drafts(np.array([1, 2, 1, 2]), 3, min_ngram=2).size == 0


@pytest.mark.parametrize("gamma", [1, pytest.param(4, marks=pytest.mark.full_opt)])
def test_greedy_identical_to_autoregressive(gamma):
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  prompts = [[5, 9, 2, 7, 5, 9, 2, 7, 5, 9], [1, 2, 3], [8, 8, 8, 8, 4, 8, 8]]
  ar = Decoder(params, CFG).generate(prompts, max_new_tokens=24)
  dec = SpeculativeEngine(params, CFG, LookupProposer(gamma=gamma))
  res = dec.generate(prompts, max_new_tokens=24)
  assert res.tokens == ar.tokens
  st = res.stats
  assert sum(map(sum, st.accepted)) > 0 and st.tau > 1  # drafts were found and accepted
  assert res.steps < ar.steps
  for row in prompts:  # batch 1 as well
    assert dec.generate([row], max_new_tokens=24).tokens == Decoder(params, CFG).generate(
        [row], max_new_tokens=24).tokens


def test_no_match_is_a_plain_step():
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  res = SpeculativeEngine(params, CFG, LookupProposer(gamma=3)).generate([[1, 2, 3]],
                                                                         max_new_tokens=1)
  assert res.steps == 0 and len(res.tokens[0]) == 1  # the prefill's token only
  res = SpeculativeEngine(params, CFG, LookupProposer(gamma=3)).generate([[1, 2, 3]],
                                                                         max_new_tokens=2)
  assert res.stats.drafted == [[0]] and res.stats.tau == 1.0


@pytest.mark.extended(params=["sp1"])
@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0),
                                SamplingParams(temperature=0.7, top_p=0.9)])
def test_sampling_is_lossless(sp):
  """The joint law of the first three tokens equals target-only sampling (chi-square over
  12,000 rows). The prompt repeats [3, 1] after the target's own greedy continuation of it,
  so lookups draft tokens the target often (not always) samples."""
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  prompt = [3, 1, *greedy, 3, 1]
  samples, st = prompt_samples(SpeculativeEngine(target, SMALL, LookupProposer(gamma=2)), sp,
                               seed=7, prompt=prompt)
  assert 0.05 < st.acceptance_rate < 0.95  # accepts and rejections both happen
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, prompt, sp)) > 1e-3


def test_bad_settings():
  params = init_params(jax.random.key(0), CFG)
  with pytest.raises(ValueError, match="gamma must be >= 1, got gamma=0"):
    SpeculativeEngine(params, CFG, LookupProposer(gamma=0))
  with pytest.raises(ValueError, match="min_ngram=3 max_ngram=2"):
    SpeculativeEngine(params, CFG, LookupProposer(max_ngram=2, min_ngram=3))
  with pytest.raises(ValueError, match="exceeds the cache length max_len=16"):
    SpeculativeEngine(params, CFG, LookupProposer(gamma=4)).generate([[1] * 8], max_new_tokens=6,
                                                                     max_len=16)


# --- trees of several matches' continuations (candidates > 1) ------------------------------

def test_continuations_and_their_trie_by_hand():
  # suffix (5, 6) occurs at 0, 5 and 10 before itself; (3, 5, 6) nowhere earlier
  seq = np.array([5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 3, 5, 6])
  conts = lookup_continuations(seq, 3, candidates=4)
  # the chain's pick (earliest) first, then the most recent occurrences; the shorter n-gram
  # (6,) only repeats what is taken already
  assert [c.tolist() for c in conts] == [[7, 8, 1], [3, 5, 6], [7, 9, 2]]
  assert conts[0].tolist() == lookup_drafts(seq, 3).tolist()
  assert [c.tolist() for c in lookup_continuations(seq, 3, candidates=2)] == [[7, 8, 1],
                                                                              [3, 5, 6]]
  tok, par, dep = continuation_trie(conts)
  # 7 -> 8 -> 1, 3 -> 5 -> 6, and 9 -> 2 under the shared 7 (node 1)
  assert tok.tolist() == [7, 8, 1, 3, 5, 6, 9, 2]
  assert par.tolist() == [0, 1, 2, 0, 4, 5, 1, 7]
  assert dep.tolist() == [1, 2, 3, 1, 2, 3, 2, 3]
  # a continuation that is a prefix of one taken adds nothing; nothing repeats: no tree
  assert [c.tolist() for c in lookup_continuations(np.array([1, 2, 3, 1, 2, 3, 1]), 2,
                                                   candidates=3)] == [[2, 3]]
  assert continuation_trie(lookup_continuations(np.array([1, 2, 3]), 3, candidates=3)
                           )[0].size == 0


def test_tree_accepts_a_later_branch_and_pads_short_rows():
  """Hand-made tries verified against the target's own greedy continuation: the first
  branch is wrong at its first token, the second right for two tokens; a second row with no
  trie (all padding nodes) takes a plain one-token step."""
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  prompts = [[5, 9, 2, 7, 1], [4, 4, 6]]
  ar = Decoder(params, CFG).generate(prompts, max_new_tokens=4).tokens
  g, h = ar
  V = CFG.vocab_size
  dec = SpeculativeEngine(params, CFG, LookupProposer(gamma=3, candidates=2))
  sp = SamplingParams()
  prompts, lengths, S, T, tokens = block_request(prompts, 8, sp, CFG, None, dec.extra_slots,
                                                 "pld")
  dtype = jnp.float32
  start, steps, _ = dec.programs(sp, 2, T, S, dtype)
  last, state = start(jnp.asarray(tokens), jnp.asarray(lengths), jax.random.key(1))
  assert np.asarray(last).tolist() == [g[0], h[0]]
  tok, par, dep = continuation_trie([np.array([(g[1] + 1) % V, g[2], g[3]]),
                                     np.array([g[1], g[2], (g[3] + 1) % V])])
  n = len(tok)
  block = np.zeros((2, n), np.int32)
  block[0] = tok
  parent = np.stack([par, np.arange(1, n + 1)]).astype(np.int32)  # row 1: padding only
  depth = np.stack([dep, np.ones(n)]).astype(np.int32)
  prog, _ = steps(((2, n),) * 3)
  state, emitted, acc = prog(dec.target_params, dec.proposer_params, state, jax.random.key(2),
                             jnp.asarray(block), jnp.asarray(parent), jnp.asarray(depth))
  assert np.asarray(acc).tolist() == [2, 0]
  assert np.asarray(emitted)[0, :3].tolist() == g[1:4] and np.asarray(state.last).tolist() == [
      g[3], h[1]]
  assert np.asarray(emitted)[1, 0] == h[1] and (np.asarray(emitted)[1, 1:] == -1).all()
  cache = state.target_cache
  assert np.asarray(cache.lengths).tolist() == [lengths[0] + 3, lengths[1] + 1]


@pytest.mark.extended(params=["2"])
@pytest.mark.parametrize("candidates", [2, 3])
def test_tree_greedy_identical_to_autoregressive(candidates):
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  prompts = [[5, 9, 2, 7, 5, 9, 3, 5, 9, 2, 7, 5, 9], [1, 2, 3], [8, 8, 8, 8, 4, 8, 8]]
  ar = Decoder(params, CFG).generate(prompts, max_new_tokens=24)
  dec = SpeculativeEngine(params, CFG, LookupProposer(gamma=3, candidates=candidates))
  res = dec.generate(prompts, max_new_tokens=24)
  assert res.tokens == ar.tokens
  assert max(map(max, res.stats.drafted)) > 3  # more than one branch was verified at once
  assert res.stats.tau > 1 and res.steps < ar.steps
  for row in prompts:
    assert dec.generate([row], max_new_tokens=24).tokens == Decoder(params, CFG).generate(
        [row], max_new_tokens=24).tokens


def test_tree_sampling_is_lossless():
  """As `test_sampling_is_lossless`, with the prompt repeating [3, 1] three times followed by
  different continuations (the target's greedy one, and two others): every step verifies a
  tree of up to three branches."""
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  V = SMALL.vocab_size
  other = [(t + 1) % V for t in greedy]
  prompt = [3, 1, *other, 3, 1, *greedy, 3, 1, *other[::-1], 3, 1]
  sp = SamplingParams(temperature=1.0)
  samples, st = prompt_samples(
      SpeculativeEngine(target, SMALL, LookupProposer(gamma=2, candidates=3)), sp, seed=7,
      prompt=prompt)
  assert max(map(max, st.drafted)) > 2  # trees, not chains
  assert 0.05 < st.acceptance_rate < 0.95
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, prompt, sp)) > 1e-3


def test_tree_bad_settings():
  params = init_params(jax.random.key(0), CFG)
  with pytest.raises(ValueError, match="candidates must be >= 1"):
    SpeculativeEngine(params, CFG, LookupProposer(candidates=0))
