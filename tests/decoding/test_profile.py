"""The step time split: the right drafter calls are timed, and a run's remainder is reported."""

import math

import pytest

from tests.helpers.models import CFG
from vocabjax.decoding.profile import StepSplit, run_split, skipped_drafting, step_split
from vocabjax.decoding.drafter import fold_catch_up
from vocabjax.decoding.speculative import SpecStats, SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams


def test_chain_split_covers_gamma_drafter_calls(pair):
  target, draft = pair
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3))
  split = step_split(dec, batch_size=2, max_len=64, repeats=2)
  # [prev, last] then one token per draft (or, on XLA's dot, 3 drafts + a catch-up call)
  want = ((2, 1), (1, 1), (1, 1)) if fold_catch_up() else ((1, 1), (1, 1), (1, 1), (1, 0))
  assert split.drafter_calls == want
  assert split.verify_tokens == 4
  for part in (split.drafter_s, split.drafter_head_s, split.verification_s, split.target_step_s):
    assert part > 0
  assert split.step_s == pytest.approx(split.drafter_s + split.drafter_head_s
                                       + split.verification_s)
  assert 0 < split.drafter_head_share < 1
  d = split.as_dict()
  assert d["drafter_calls"] == [list(c) for c in want] and d["step_s"] == split.step_s


def test_tree_split_times_frontier_calls(pair):
  target, draft = pair
  dec = SpeculativeEngine(
      target, CFG, TreeProposer(draft, CFG, CFG, tree=TreeParams(top_k=2, depth=3, total_tokens=5)))
  split = step_split(dec, max_len=64, repeats=1)
  assert split.drafter_calls == ((4, 1), (2, 2), (2, 2))  # pending block, then 2 frontier calls
  assert split.verify_tokens == 6


def test_run_split_reports_the_remainder(pair):
  target, draft = pair
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=2))
  res = dec.generate([[1, 2, 3]], max_new_tokens=10)
  split = step_split(dec, max_len=64, repeats=1)
  run = run_split(split, res.stats.target_forwards, res.decode_s)
  assert run["decode_s"] == res.decode_s
  parts = run["drafter_s"] + run["drafter_head_s"] + run["verification_s"]
  assert math.isclose(parts + run["other_s"] - run["parts_excess_s"], res.decode_s)
  assert run["other_s"] >= 0 and run["parts_excess_s"] >= 0
  assert run["drafter_s"] == pytest.approx(split.drafter_s * res.stats.target_forwards)


def test_run_split_counts_steps_that_skipped_drafting():
  """Prompt lookup without a match and a gated EAGLE step verify one token without drafting:
  the run's split charges them a one-token target step, not the drafted step's parts (which
  turned the remainder negative for gated runs)."""
  split = StepSplit(drafter_s=0.02, drafter_head_s=0.01, verification_s=0.3, target_step_s=0.25,
                    drafter_calls=((5, 1),), verify_tokens=5)
  # 4 batched steps of 2 rows: drafts in steps 0 and 2 (a row each), none in 1 and 3
  st = SpecStats(drafted=[[4, 0], [0, 0], [0, 4], [0, 0]], accepted=[[1, 0]] * 4,
                  active=[[True, True]] * 4)
  kw = skipped_drafting(st)
  assert kw == {"verified_steps": 2, "drafter_steps": 2}
  run = run_split(split, 4, 2.0, **kw)
  assert run["drafter_s"] == pytest.approx(0.04) and run["drafter_head_s"] == pytest.approx(0.02)
  assert run["verification_s"] == pytest.approx(2 * 0.3 + 2 * 0.25)
  assert run["other_s"] == pytest.approx(2.0 - 0.04 - 0.02 - 1.1)
  assert run["parts_excess_s"] == 0
  # parts timed apart that exceed the run (the step fuses them): no negative remainder
  short = run_split(split, 4, 1.0, **kw)
  assert short["other_s"] == 0 and short["parts_excess_s"] == pytest.approx(1.16 - 1.0)
  # prompt lookup: the same from its matched steps
  pld = SpecStats(drafted=[[3], [0], [0]], accepted=[[2], [0], [0]], active=[[True]] * 3)
  assert skipped_drafting(pld) == {"verified_steps": 1, "drafter_steps": 1}
  # eagle_pld: the head's steps drive the drafter parts, lookup-only steps verify their trie
  el = SpecStats(drafted=[[6], [2], [0]], accepted=[[0]] * 3, active=[[True]] * 3,
                 counts={"lookup_nodes": [[2], [2], [0]], "from_lookup": [[0]] * 3,
                         "head": [[True], [False], [False]]})
  assert skipped_drafting(el) == {"verified_steps": 2, "drafter_steps": 1}
  # a method that drafts every step keeps the old split
  assert skipped_drafting(SpecStats(drafted=[[3]], accepted=[[1]])) == {}
  assert run_split(split, 4, 2.0)["verification_s"] == pytest.approx(1.2)
  with pytest.raises(ValueError, match="verified_steps=5"):
    run_split(split, 4, 2.0, verified_steps=5)


def test_split_rejects_a_context_that_does_not_fit(pair):
  target, draft = pair
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=4))
  with pytest.raises(ValueError, match="context=60"):
    step_split(dec, max_len=64, context=60)


def test_split_on_a_mesh_times_the_placed_parts(pair, monkeypatch):
  """A decoder on a (2, 4) mesh has its parts timed there: its placed params, caches rows over
  "data", XLA's partitioned dot (the one-device CPU kernel off, as in its steps)."""
  import jax

  from vocabjax import sharding
  from vocabjax.decoding import profile
  from vocabjax.lowering import lowering_of

  target, draft = pair
  mesh = sharding.make_mesh(data=2, model=4)
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=2), mesh=mesh)
  seen = []
  real = profile.median_s

  def spy(fn, *args, repeats):
    seen.append((args, lowering_of(args[0])))  # args[0]: the params the part runs with
    return real(fn, *args, repeats=repeats)

  monkeypatch.setattr(profile, "median_s", spy)
  split = step_split(dec, batch_size=2, max_len=64, repeats=1)
  assert min(split.drafter_s, split.drafter_head_s, split.verification_s) > 0
  assert seen and all(lw == dec.lowering for _, lw in seen)  # as the decoder's steps
  assert not dec.lowering.cpu_kernel and dec.lowering.split_top_k and dec.lowering.row_writes
  caches = [args[2] for args, _ in seen if len(args) == 3]  # bodies: (params, tokens, cache)
  assert len(caches) >= 2
  for cache in caches:
    assert isinstance(cache.k.sharding, jax.sharding.NamedSharding)
    assert cache.k.sharding.mesh == mesh and cache.k.sharding.spec[1] == "data"
