"""EAGLE drafting gated by the head's root confidence (`min_confidence`): greedy identity, a
row drafts exactly when its head is confident, the step without a confident row verifies the
roots alone, the lookup hybrid without its head is prompt lookup, lossless sampling, bad input."""

import dataclasses

import jax
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.eagle import EagleProposer, _head_root, root_confidence
from vocabjax.decoding.hybrid import HostTreeHybrid, LookupTrie
from vocabjax.decoding.speculative import SpecStats, SpeculativeEngine
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.tree import TreeParams
from vocabjax.models import init_params
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs

from tests.helpers.models import CFG, PROMPT, SMALL, random_prompts
from tests.helpers.heads import random_head


def _row_steps(stats):
  return sum(a for row in stats.active for a in row)


@pytest.mark.parametrize("Vd,lm_head", [(40, "own"), (None, "own"), (None, "target")])
def test_gated_drafting_keeps_greedy_output(target, Vd, lm_head):
  """Thresholds that gate some rows' steps and not others: output identical to plain greedy
  decoding; a threshold below any probability drafts every step as the ungated decoder does
  (same accepted counts); one above every confidence never drafts (tau 1)."""
  hc, head = random_head(target, CFG, Vd)
  prompts = random_prompts()
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  tp = TreeParams(2, 3, 6)
  ungated = SpeculativeEngine(target, CFG,
                              EagleProposer(target, CFG, head, hc, tree=tp,
                                            lm_head=lm_head)).generate(prompts, max_new_tokens=24)
  assert ungated.tokens == ar.tokens
  mixed = 0
  for thr in (1e-6, 0.2, 0.3, 0.999):
    res = SpeculativeEngine(
        target, CFG,
        EagleProposer(target, CFG, head, hc, tree=tp, lm_head=lm_head,
                      min_confidence=thr)).generate(prompts, max_new_tokens=24)
    assert res.tokens == ar.tokens, thr
    st = res.stats
    assert isinstance(st, SpecStats) and res.steps == len(st.drafted)
    rec = st.record()
    assert rec["verifications"] == res.steps
    # tau counts every verification, those without the head's nodes too
    assert st.tau == pytest.approx((sum(map(sum, st.accepted)) + _row_steps(st)) / _row_steps(st))
    # a row that did not draft accepts nothing
    assert all(a == 0 for dr, ar_ in zip(st.drafted, st.accepted) for d, a in zip(dr, ar_)
               if not d)
    if thr == 1e-6:
      assert rec["head_steps"] == _row_steps(st)
      assert st.accepted == ungated.stats.accepted
    elif thr == 0.999:
      assert rec["head_steps"] == 0 and st.tau == 1.0
    else:
      mixed += 0 < rec["head_steps"] < _row_steps(st)
  assert mixed >= 1  # the middle thresholds gate some steps and keep others


def test_a_row_drafts_exactly_when_its_root_confidence_reaches_the_threshold(target):
  """First step of each row: the head drafts iff `root_confidence` at its root >= the threshold
  (read from the same start state), so the gate is per row, not per batch."""
  hc, head = random_head(target, CFG, 40)
  prompts = random_prompts(seed=3)
  dec = SpeculativeEngine(target, CFG, EagleProposer(target, CFG, head, hc,
                                                     tree=TreeParams(2, 3, 6)))
  start, _, _ = dec.programs(SamplingParams(), 4, 32, 64, np.float32)
  tokens = np.zeros((4, 32), np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  _, state = start(tokens, np.array([len(p) for p in prompts], np.int32), jax.random.key(0))
  x_root, _ = _head_root(dec.proposer_params, state.draft, head_config=hc)
  conf = np.asarray(
      root_confidence(dec.proposer_params, x_root, head_config=hc, policy=dec.draft_policy))
  c = np.sort(conf)
  assert c[2] - c[1] > 1e-3, c  # distinct enough to split
  thr = float(c[1] + c[2]) / 2  # two rows below, two above
  res = SpeculativeEngine(
      target, CFG, EagleProposer(target, CFG, head, hc, tree=TreeParams(2, 3, 6),
                                 min_confidence=thr)).generate(prompts, max_new_tokens=8,
                                                               max_len=64)
  assert [bool(d) for d in res.stats.drafted[0]] == list(conf >= thr)


@pytest.mark.extended
def test_gated_lookup_without_the_head_is_prompt_lookup(target):
  """A threshold the random head never reaches: every step verifies the lookup's trie alone,
  so the hybrid accepts exactly what prompt lookup accepts, all of it from lookup nodes.
  Three candidates (a trie with branches); one candidate's chain is the trie's special case
  (the same lookup, verified greedily: its acceptance follows from both being exact; the
  chain case cost ~17 s of a 2-core run)."""
  gamma, candidates = 2, 3
  hc, head = random_head(target, CFG, 40)
  rs = np.random.RandomState(1)
  base = rs.randint(0, CFG.vocab_size, 9).tolist()
  prompts = [base * 3, [5], rs.randint(0, CFG.vocab_size, 4).tolist() * 2, base[:5]]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  pld = SpeculativeEngine(target, CFG, LookupProposer(gamma=gamma, candidates=candidates)).generate(
      prompts, max_new_tokens=24)
  res = SpeculativeEngine(
      target, CFG,
      HostTreeHybrid(EagleProposer(target, CFG, head, hc, tree=TreeParams(2, 3, 6),
                                   min_confidence=0.999),
                     LookupTrie(gamma=gamma, candidates=candidates))).generate(
                         prompts, max_new_tokens=24)
  assert res.tokens == pld.tokens == ar.tokens
  rec = res.stats.record()
  assert rec["head_steps"] == 0 and rec["accepted"] > 0
  assert rec["accepted_from_lookup"] == rec["accepted"]
  assert res.stats.accepted == pld.stats.accepted
  assert res.stats.tau == pytest.approx(pld.stats.tau)
  # a threshold some steps reach: the head's nodes come back on those, output unchanged
  mid = SpeculativeEngine(
      target, CFG,
      HostTreeHybrid(EagleProposer(target, CFG, head, hc, tree=TreeParams(2, 3, 6),
                                   min_confidence=0.2),
                     LookupTrie(gamma=gamma, candidates=candidates))).generate(
                         prompts, max_new_tokens=24)
  assert mid.tokens == ar.tokens
  assert 0 < mid.stats.record()["head_steps"] < _row_steps(mid.stats)


def _gated_rows(stats):
  return sum(1 for dr, act in zip(stats.drafted, stats.active) for d, a in zip(dr, act)
             if a and not d)


@pytest.mark.extended(params=["eagle+lookup"])
@pytest.mark.parametrize("lookup", [False, True], ids=["eagle", "eagle+lookup"])
def test_gated_sampling_is_lossless(lookup):
  """Joint law of the first three tokens (V = 8) equals target-only sampling (chi-square) when
  the gate drafts in some rows' steps and not in others."""
  small = dataclasses.replace(SMALL, num_layers=2)
  tgt2 = init_params(jax.random.key(10), small, scale=0.8)
  hc, head = random_head(tgt2, small, 6, seed=4)
  sampling = SamplingParams(temperature=1.0)
  prompt = PROMPT
  if lookup:
    prompt = PROMPT + Decoder(tgt2, small).generate([PROMPT], max_new_tokens=12).tokens[0]
    dec = SpeculativeEngine(
        tgt2, small,
        HostTreeHybrid(EagleProposer(tgt2, small, head, hc, tree=TreeParams(2, 2, 4),
                                     min_confidence=0.6), LookupTrie(gamma=2, candidates=2)))
  else:
    dec = SpeculativeEngine(
        tgt2, small,
        EagleProposer(tgt2, small, head, hc, tree=TreeParams(2, 2, 4), min_confidence=0.6))
  res = dec.generate([prompt] * 12_000, max_new_tokens=3, sampling=sampling, seed=7)
  st = res.stats
  drafted, gated = st.record()["head_steps"], _gated_rows(st)
  assert drafted > 1000 and gated > 1000, (drafted, gated)  # both branches ran, often
  if lookup:  # accepted tokens came from the lookup's nodes and from the head's
    rec = st.record()
    assert 1000 < rec["accepted_from_lookup"] < rec["accepted"] - 500, rec
  V = small.vocab_size
  t = np.asarray([r[:3] for r in res.tokens])
  samples = t[:, 0] * V * V + t[:, 1] * V + t[:, 2]
  exact = exact_sequence_probs(tgt2, small, prompt, sampling)
  assert chi2_pvalue(samples, exact) > 1e-3


def test_bad_min_confidence_is_refused(target):
  hc, head = random_head(target, CFG, 40)
  for bad in (-0.1, 1.0, 2.0):
    with pytest.raises(ValueError, match=f"min_confidence={bad} must lie in"):
      SpeculativeEngine(target, CFG, EagleProposer(target, CFG, head, hc, min_confidence=bad))
    with pytest.raises(ValueError, match=f"min_confidence={bad} must lie in"):
      SpeculativeEngine(target, CFG, HostTreeHybrid(
          EagleProposer(target, CFG, head, hc, min_confidence=bad), LookupTrie()))
