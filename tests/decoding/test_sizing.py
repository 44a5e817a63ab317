"""Speculation that sizes itself (`vocabjax.decoding.sizing`): the rule on hand-set costs and
acceptance, the host block cut to the chosen length, and the engine with it on (greedy output
unchanged, the rule and its choices in the record)."""

import jax
import numpy as np
import pytest

from tests.helpers.models import CFG
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.sizing import RULE, DraftSizer, limit_block
from vocabjax.decoding.suffix import SuffixProposer
from vocabjax.models import init_params
from vocabjax.testing.proposers import greedy_identity


def _sizer(acceptance: float, costs: dict) -> DraftSizer:
  s = DraftSizer(lengths=sorted(costs), prior=0.5)
  for n, c in costs.items():
    s.update(n, c, [], [])
  k = int(acceptance * 100)  # 100 one-draft rows, k of them accepted
  s.update(0, None, [1] * 100, [1] * k + [0] * (100 - k))
  return s


def test_the_rule_drafts_as_far_as_acceptance_pays_and_steps_aside_when_it_does_not():
  flat = {0: 1.0, 1: 1.01, 2: 1.02, 4: 1.04, 8: 1.08}  # memory bound: drafts nearly free
  assert _sizer(0.9, flat).choose() == 8  # drafts accepted: the longest
  assert _sizer(0.0, flat).choose() == 0  # nothing accepted: a plain step
  steep = {0: 1.0, 1: 1.4, 2: 1.8, 4: 2.6, 8: 4.2}  # compute bound: each draft costs
  s = _sizer(0.5, steep)
  # E(n) = 1, 1.5, 1.75, 1.94, 2.0 over c(n): rates 1.0, 1.07, 0.97, 0.75, 0.48: one draft
  assert s.choose() == 1
  rates = {n: s.expected_tokens(n) / c for n, c in steep.items()}
  assert s.choices[-1] == max(rates, key=rates.get)
  rec = s.record()
  assert rec["rule"] == RULE and rec["lengths"] == [0, 1, 2, 4, 8]
  assert 0.4 < rec["acceptance"] < 0.6 and rec["choices"]


def test_lengths_are_tried_from_the_shortest_and_priced_by_the_line_below_them():
  """Nothing measured: the plain step, then the shortest draft; with two lengths timed, a longer
  one costs the line through them: where one draft already costs too much (a compute-bound
  batch) the longer drafts are never tried, where it is cheap the longest is tried next."""
  s = DraftSizer(lengths=[0, 2, 4, 8], prior=0.6)
  assert s.choose() == 0  # nothing measured: the plain step
  s.update(0, None, [], [])  # a step that compiled: not timed, tried again
  assert s.choose() == 0
  s.update(0, 1.0, [], [])
  assert s.cost(8) == 1.0 and s.untried(2) and not s.untried(0)
  assert s.best(explore=False) == 0  # a table learned now: the one length priced
  assert s.choose() == 2  # one length timed below the others: the shortest is tried
  s.update(2, 1.8, [], [])
  s.update(2, None, [1] * 10, [1] * 6 + [0] * 4)  # a = 0.6
  assert not s.untried(4) and s.cost(4) == pytest.approx(2.6) and s.cost(8) == pytest.approx(4.2)
  # a = 0.6: E = 1, 1.96, 2.31, 2.47 over c = 1, 1.8, 2.6, 4.2: rates 1, 1.09, 0.89, 0.59
  assert s.choose() == 2 and 4 not in s.choices and 8 not in s.choices
  cheap = DraftSizer(lengths=[0, 2, 4, 8], prior=0.9)
  cheap.update(0, 1.0, [], [])
  cheap.update(2, 1.05, [], [])  # memory bound: drafts nearly free
  assert cheap.cost(8) == pytest.approx(1.2) and cheap.choose() == 8
  cheap.update(8, 1.1, [], [])
  assert cheap.cost(4) == pytest.approx(1.1)  # the line from the two longest below 4: 0, 2
  noisy = DraftSizer(lengths=[0, 1, 2])
  noisy.update(0, 1.0, [], [])
  noisy.update(1, 0.9, [], [])  # timed below the plain step: no falling line
  assert noisy.cost(2) == pytest.approx(0.9)
  with pytest.raises(ValueError, match=r"prior acceptance must lie in \(0, 1\), got 1.0"):
    DraftSizer(lengths=[0, 1], prior=1.0)


def test_a_rule_that_stepped_aside_probes_again_and_returns_when_drafts_pay():
  """Early rejections make a plain step the best choice; plain steps verify nothing, so the
  acceptance would never change: after `probe` plain steps in a row one step drafts, and once
  its drafts are accepted the rule drafts again."""
  s = DraftSizer(lengths=[0, 1, 4], probe=3)
  s.update(0, 1.0, [], [])
  s.update(1, 1.1, [], [])
  s.update(4, 1.2, [4] * 8, [0] * 8)  # every draft rejected
  assert [s.choose() for _ in range(3)] == [0, 0, 0]
  assert s.choose() == 1  # the probe: the cheapest drafting step
  s.update(1, 1.1, [1] * 8, [0] * 8)  # rejected again: the next probe waits twice as long
  assert [s.choose() for _ in range(7)] == [0] * 6 + [1]
  s.update(1, 1.1, [1] * 200, [1] * 200)  # now drafts are accepted
  assert s.choose() == 4 and s.choose() == 4
  assert s._probe_wait == 3  # the rule drafted of itself: probes start over
  with pytest.raises(ValueError, match="probe=0 must be >= 1"):
    DraftSizer(lengths=[0, 1], probe=0)
  with pytest.raises(ValueError, match="probe_max=8 >= probe"):
    DraftSizer(lengths=[0, 1], probe=16, probe_max=8)
  steep = DraftSizer(lengths=[0, 1, 2], probe=3)  # a compute-bound batch: a draft costs 2.5x
  steep.update(0, 1.0, [], [])
  steep.update(1, 2.5, [1] * 8, [0] * 8)
  assert steep.cost(2) == 4.0 and not steep.can_pay()  # 2 tokens / 2.5, 3 / 4.0: below 1
  assert [steep.choose() for _ in range(40)] == [0] * 40  # no probe: drafts cannot pay
  assert s.can_pay()


def test_a_batch_that_ends_with_its_slowest_row_sizes_for_that_row():
  """Four rows, three accepting 9 of 10 drafts and one 2 of 10: the pooled acceptance (0.73)
  pays for two drafts on a compute-bound step, but the call ends with the slow row, whose two
  drafts give 1.2 tokens for twice the cost: with `slowest` the rule steps aside, and once that
  row is done (inactive) it drafts again. Refilled rows (`slowest=False`) keep the pooled
  figure."""
  costs = {0: 1.0, 1: 1.45, 2: 1.7}

  def sizer(slowest):
    s = DraftSizer(lengths=[0, 1, 2], prior=0.5)
    s.begin(4, slowest=slowest)
    for n, c in costs.items():
      s.update(n, c, [], [])
    for _ in range(10):  # rows 0-2 accept 9 of 10 one-draft steps, row 3 two of 10
      s.update(1, None, [1] * 4, [1, 1, 1, 1] if _ < 2 else [1, 1, 1, 0] if _ < 9 else
               [0, 0, 0, 0])
    return s

  pooled = sizer(False)
  assert 0.7 < pooled.acceptance < 0.8 and pooled.choose() == 2
  slow = sizer(True)
  assert slow.row_acceptance(3) < 0.5 < 0.8 < slow.row_acceptance(0)
  # pooled: E = 1, 1.73, 2.25 over c = 1, 1.45, 1.7: two drafts; row 3: a = (2 + 8 * 0.725)
  # / (10 + 8) = 0.43, E = 1, 1.43, 1.62: rates 1, 0.99, 0.95: a plain step
  assert slow.call_tokens(2) == pytest.approx(slow.expected_tokens(2, slow.row_acceptance(3)))
  assert slow.choose([True] * 4) == 0
  assert slow.choose([True, True, True, False]) == 2  # the slow row has finished
  rec = slow.record()
  assert rec["slowest_row"] is True and len(rec["row_acceptance"]) == 4
  slow.begin(4, slowest=True)  # a new call: its rows' own counts start over
  assert slow.row_acceptance(3) == pytest.approx(slow.acceptance) and slow.choose() == 2
  with pytest.raises(ValueError, match="row_prior=0 > 0"):
    DraftSizer(lengths=[0, 1], row_prior=0)


def test_limit_block_cuts_chains_and_trees():
  block = np.array([[5, 6, 7, 0], [1, 2, 0, 0]], np.int32)
  (b, nv), counts = limit_block((block, np.array([3, 2], np.int32)), [3, 2], 2)
  assert b.tolist() == [[5, 6], [1, 2]] and nv.tolist() == [2, 2] and counts.tolist() == [2, 2]
  (b, nv), _ = limit_block((block[:, :1], np.array([1, 0], np.int32)), [1, 0], 3)
  assert b.shape == (2, 3) and nv.tolist() == [1, 0]  # padded: a program per length
  tok = np.array([[4, 5, 6]], np.int32)
  parent = np.array([[0, 1, 1]], np.int32)  # nodes 2 and 3 under node 1
  depth = np.array([[1, 2, 2]], np.int32)
  (t, p, d), _ = limit_block((tok, parent, depth), [3], 2)
  assert t.tolist() == [[4, 5]] and p.tolist() == [[0, 1]] and d.tolist() == [[1, 2]]
  (t, p, d), _ = limit_block((tok, parent, depth), [3], 4)
  assert p[0, 3] == 4 and d[0, 3] == 1  # padding: its own parent


@pytest.mark.parametrize("make", ["pld", "suffix"])
def test_self_sizing_keeps_plain_greedy_tokens_and_records_its_choices(make):
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  if make == "pld":
    dec = SpeculativeEngine(params, CFG, LookupProposer(gamma=4), self_sizing=True)
  else:
    dec = SpeculativeEngine(params, CFG, SuffixProposer(max_spec_tokens=4), self_sizing=True)
  prompts = [[5, 9, 2, 7, 5, 9, 3, 5, 9, 2, 7, 5, 9], [1, 2, 3]]
  res = greedy_identity(dec, params, CFG, prompts, max_new_tokens=24)
  sizing = res.stats.record()["sizing"]
  assert sizing["rule"] == RULE and sum(sizing["choices"].values()) == res.steps
  assert set(sizing["choices"]) <= set(sizing["lengths"])
  with pytest.raises(ValueError, match="self_sizing applies to proposers that draft on the host "
                                       r"\(pld, ngram, suffix\) or size their drafts \(chain, "
                                       r"tree\); eagle compiles its draft length"):
    from tests.helpers.heads import random_head
    from vocabjax.decoding.eagle import EagleProposer

    hc, head = random_head(params, CFG, 40)
    SpeculativeEngine(params, CFG, EagleProposer(params, CFG, head, hc), self_sizing=True)


@pytest.mark.extended(params=["7"])
@pytest.mark.parametrize("draft_seed", [0, 7])  # the target itself (all accepted), another model
def test_a_sized_chain_keeps_plain_greedy_tokens_drafting_1_to_gamma(draft_seed):
  """A chain drafter sized per step (one step program per length 1..gamma, the same loop
  state): greedy output is plain decoding's; every step drafts the length the rule chose."""
  from vocabjax.decoding.drafter import ChainProposer

  params = init_params(jax.random.key(0), CFG, scale=0.3)
  draft = params if draft_seed == 0 else init_params(jax.random.key(draft_seed), CFG, scale=0.3)
  dec = SpeculativeEngine(params, CFG, ChainProposer(draft, CFG, CFG, gamma=4), self_sizing=True)
  prompts = [[5, 9, 2, 7, 5, 9, 3], [1, 2, 3]]
  res = greedy_identity(dec, params, CFG, prompts, max_new_tokens=24)
  sizing = res.stats.record()["sizing"]
  assert sizing["lengths"] == [0, 1, 2, 3, 4]  # 0: a plain step (the drafter catches up)
  assert sum(sizing["choices"].values()) == res.steps
  sizer = next(iter(dec.sizing_rules().values()))
  for n, drafted in zip(sizer.choices, res.stats.drafted):
    assert max(drafted) == n  # the step drafted the chosen length on every active row
  if draft_seed == 0:
    assert sizing["acceptance"] > 0.9  # the target drafting for itself
  again = dec.generate(prompts, max_new_tokens=24)  # the sizer keeps learning: same tokens
  assert again.tokens == res.tokens


def _forced(monkeypatch, lengths):
  """DraftSizer.choose cycling through `lengths` (every variant, plain steps included, runs
  between drafting steps of other lengths)."""
  import itertools

  cycle = itertools.cycle(lengths)

  def choose(self, active=None):
    self.choices.append(next(cycle))
    return self.choices[-1]

  monkeypatch.setattr(DraftSizer, "choose", choose)


@pytest.mark.extended(params=["tree-7", "tree-0"])
@pytest.mark.parametrize("kind,draft_seed", [("chain", 0), ("tree", 0), ("tree", 7)])
def test_sized_drafters_with_plain_steps_between_keep_plain_greedy_tokens(monkeypatch, kind,
                                                                         draft_seed):
  """A sized chain (0..gamma) or tree (0, 1, 2, 4, 8 nodes) forced through every length, plain
  steps (n = 0) among them, twice in a row too: the drafter's cache stays caught up (with the
  target drafting for itself every draft after a plain step is accepted) and the output is
  plain decoding's. (A sized chain drafted by another model: the test above.)"""
  from vocabjax.decoding.drafter import ChainProposer, TreeProposer
  from vocabjax.decoding.tree import TreeParams

  params = init_params(jax.random.key(0), CFG, scale=0.3)
  draft = params if draft_seed == 0 else init_params(jax.random.key(draft_seed), CFG, scale=0.3)
  if kind == "chain":
    dec = SpeculativeEngine(params, CFG,
                            ChainProposer(draft, CFG, CFG, gamma=3, draft_prefill="exact"),
                            self_sizing=True)  # the drafter's cache exactly the target's
    order = [3, 0, 2, 0, 0, 1, 3]
  else:
    dec = SpeculativeEngine(
        params, CFG, TreeProposer(draft, CFG, CFG, tree=TreeParams(2, 4, 8), draft_prefill="exact"),
        self_sizing=True)
    assert dec.proposer.sized_lengths() == (0, 1, 2, 4, 8)
    order = [8, 0, 4, 0, 0, 1, 2, 8]
  _forced(monkeypatch, order)
  prompts = [[5, 9, 2, 7, 5, 9, 3], [1, 2, 3]]
  res = greedy_identity(dec, params, CFG, prompts, max_new_tokens=32)
  sizer = next(iter(dec.sizing_rules().values()))
  assert set(sizer.choices) == set(order)
  for n, drafted, acc, active in zip(sizer.choices, res.stats.drafted, res.stats.accepted,
                                     res.stats.active):
    assert max(drafted) == n and (n or max(acc) == 0)
    acc = [a for a, on in zip(acc, active) if on]
    if draft_seed == 0 and n:  # the target drafting for itself: a chain passes whole, a
      # tree its greedy path (its top-1 child at least: the best 8 of its candidates may not
      # reach the tree's whole depth)
      assert (min(acc) == n if kind == "chain" else min(acc) >= 1), (n, acc)
  if kind == "tree":
    assert res.stats.record()["sizing"]["reach"] == {0: 0, 1: 1, 2: 2, 4: 4, 8: 4}


@pytest.mark.extended
def test_a_sized_tree_samples_the_target_law(monkeypatch):
  """Sampling with the tree's size changing from step to step (4, 0, 2 nodes forced: the first
  three tokens take two or three steps) keeps the target's law (each size's step is the tree
  verifier over its nodes)."""
  from tests.helpers.models import SMALL
  from vocabjax.decoding import SamplingParams
  from vocabjax.decoding.drafter import TreeProposer
  from vocabjax.decoding.tree import TreeParams
  from vocabjax.testing.proposers import target_law

  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  draft = init_params(jax.random.key(11), SMALL, scale=0.8)
  dec = SpeculativeEngine(target, SMALL, TreeProposer(draft, SMALL, SMALL,
                                                      tree=TreeParams(2, 2, 4)), self_sizing=True)
  _forced(monkeypatch, [4, 0, 2])
  pvalue, stats = target_law(dec, target, SMALL, [3, 1], SamplingParams(temperature=1.0),
                             seed=7)
  assert {0, 4} <= set(next(iter(dec.sizing_rules().values())).choices)  # a plain step among them
  assert dec._plain is not None  # run by the plain decoder's program
  assert 0.05 < stats.acceptance_rate < 0.95
  assert pvalue > 1e-3


def test_a_sized_chain_samples_the_target_law(monkeypatch):
  """Sampling with the chain's length changing from step to step (forced: 0, 2, 1, 3) keeps
  the target's law: each length's step is the chain verifier over that many drafts, a plain
  step the plain decoder's own step (its sampler over the target's logits), after which the
  drafter resumes."""
  import itertools

  from tests.helpers.models import SMALL
  from vocabjax.decoding import SamplingParams
  from vocabjax.decoding.drafter import ChainProposer
  from vocabjax.testing.proposers import target_law

  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  draft = init_params(jax.random.key(11), SMALL, scale=0.8)
  dec = SpeculativeEngine(target, SMALL, ChainProposer(draft, SMALL, SMALL, gamma=3),
                          self_sizing=True)
  lengths = itertools.cycle([0, 2, 1, 3])  # a plain step, then a resume and two drafts

  def choose(self, active=None):
    self.choices.append(next(lengths))
    return self.choices[-1]

  monkeypatch.setattr(DraftSizer, "choose", choose)
  pvalue, stats = target_law(dec, target, SMALL, [3, 1], SamplingParams(temperature=1.0),
                             seed=7)
  assert len(set(next(iter(dec.sizing_rules().values())).choices)) >= 2  # more than one length ran
  assert dec._plain is not None  # its plain steps ran the plain decoder's program
  assert 0.05 < stats.acceptance_rate < 0.95  # accepts and rejections both happen
  assert pvalue > 1e-3


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_plain_steps_run_the_plain_decoders_program_and_the_drafter_resumes(monkeypatch, kind):
  """A sized drafter's plain steps (n = 0) run the plain decoder's own step program, the
  drafter idle; the next drafting step first reads what it missed (one call, a block of a
  power-of-two width). Runs of 5 and 9 plain steps: the output is plain decoding's, and with
  the target drafting for itself every draft after a resume is accepted (a chain's all, a
  tree's greedy path), so the resumed cache is the target's."""
  from vocabjax.decoding.drafter import ChainProposer, TreeProposer
  from vocabjax.decoding.tree import TreeParams
  from vocabjax.sampling import SamplingParams

  params = init_params(jax.random.key(0), CFG, scale=0.3)
  if kind == "chain":
    P = ChainProposer(params, CFG, CFG, gamma=3, draft_prefill="exact")
    order = [3] + [0] * 5 + [2] + [0] * 9 + [3, 0, 1, 3]
  else:
    P = TreeProposer(params, CFG, CFG, tree=TreeParams(2, 4, 8), draft_prefill="exact")
    order = [8] + [0] * 5 + [4] + [0] * 9 + [8, 0, 2, 8]
  dec = SpeculativeEngine(params, CFG, P, self_sizing=True)
  _forced(monkeypatch, order)
  import vocabjax.decoding.speculative as spec

  plain_steps, widths = [], []
  step, width = SpeculativeEngine._plain_step, spec.resume_width
  monkeypatch.setattr(SpeculativeEngine, "_plain_step",
                      lambda self, *a: plain_steps.append(1) or step(self, *a))
  monkeypatch.setattr(spec, "resume_width", lambda *a: widths.append(width(*a)) or widths[-1])
  prompts = [[5, 9, 2, 7, 5, 9, 3, 4], [1, 2, 3, 4, 6, 8, 1, 2, 9]]
  res = greedy_identity(dec, params, CFG, prompts, max_new_tokens=40)
  sizer = next(iter(dec.sizing_rules().values()))
  zeros = sizer.choices.count(0)
  assert zeros >= 15 and len(plain_steps) == zeros  # every plain step: the plain program
  (B, S), = dec.sizing_rules()
  assert dec.plain_decoder().step_program(SamplingParams(), B, S, "float32")[1] == 0  # compiled
  assert set(widths) >= {8, 16} if kind == "chain" else set(widths) >= {16}
  before = [0] + sizer.choices[:-1]
  for n, prev, acc, active in zip(sizer.choices, before, res.stats.accepted, res.stats.active):
    acc = [a for a, on in zip(acc, active) if on]
    if n and prev == 0 and acc:  # a drafting step right after a resume
      assert min(acc) == n if kind == "chain" else min(acc) >= 1, (n, acc)


def test_a_sizing_table_fixes_lengths_per_batch_size_and_zero_is_plain_decoding():
  """`sizing_table`: one row takes its entry's length every step (no rule); two rows fall on
  the entry 0, a call of the plain decoder's programs whose tokens and steps are plain
  decoding's, recorded as undrafted steps; bad tables are refused by entry, and a rule's
  measured figures give a table back (`learned_table`)."""
  from vocabjax.decoding.autoregressive import Decoder
  from vocabjax.decoding.drafter import ChainProposer

  params = init_params(jax.random.key(0), CFG, scale=0.3)
  draft = init_params(jax.random.key(7), CFG, scale=0.3)
  dec = SpeculativeEngine(params, CFG, ChainProposer(draft, CFG, CFG, gamma=3),
                          sizing_table="1:2, 2:0")
  assert dec.self_sizing and dec.sizing_table == {1: 2, 2: 0}
  one = greedy_identity(dec, params, CFG, [[5, 9, 2, 7]], max_new_tokens=16)
  assert all(max(d) == 2 for d in one.stats.drafted)
  assert one.stats.record()["sizing"]["rule"] == "a sizing table's n = 2"
  prompts = [[5, 9, 2, 7], [1, 2, 3]]
  two = dec.generate(prompts, max_new_tokens=16)
  plain = Decoder(params, CFG).generate(prompts, max_new_tokens=16)
  assert two.tokens == plain.tokens and two.steps == plain.steps
  assert not any(map(any, two.stats.drafted)) and two.stats.tau == 1.0
  assert two.stats.record()["sizing"]["choices"] == {0: plain.steps}
  for bad, why in [("8", "BATCH:LENGTH"), ("a:1", "BATCH:LENGTH"), ("0:1", ">= 1"),
                   ("", "at least one")]:
    with pytest.raises(ValueError, match=why):
      SpeculativeEngine(params, CFG, ChainProposer(draft, CFG, CFG, gamma=3), sizing_table=bad)
  wrong = SpeculativeEngine(params, CFG, ChainProposer(draft, CFG, CFG, gamma=3),
                            sizing_table={1: 5})
  with pytest.raises(ValueError, match="sizing table's length 5 .* one of \\(0, 1, 2, 3\\)"):
    wrong.generate([[5, 9, 2, 7]], max_new_tokens=4)
  sized = SpeculativeEngine(params, CFG, ChainProposer(draft, CFG, CFG, gamma=3),
                            self_sizing=True)
  sized.generate(prompts, max_new_tokens=16)
  learned = sized.learned_table()
  assert list(learned) == [2] and learned[2] in (0, 1, 2, 3)
