"""SuffixDecoding (`vocabjax.decoding.suffix`): its suffix trees against Arctic Inference's C++
tree (the reference, built by `python -m vocabjax.testing install`), and the proposer on the
engine: greedy identity, the target's law, what the global tree buys a repeated request."""

import random

import jax
import pytest

from tests.helpers.models import CFG, SMALL
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.drafter import TreeProposer
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.hybrid import HostTreeHybrid, SuffixTrees
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.suffix import SuffixCache, SuffixProposer, SuffixTree
from vocabjax.models import init_params
from vocabjax.testing.proposers import greedy_identity, target_law
from vocabjax.testing.references import suffix_reference


def _trees(rng, remove):
  """Our tree and Arctic's over the same random sequences (appended in chunks, as decoding
  appends accepted blocks), the first one removed again when `remove`."""
  D, V = rng.choice([4, 8, 64]), rng.choice([3, 5, 20])
  ours, ref = SuffixTree(D), suffix_reference().SuffixTree(D)
  for sid in range(rng.randint(1, 4)):
    seq = [rng.randrange(V) for _ in range(rng.randint(5, 200))]
    i = 0
    while i < len(seq):
      k = rng.randint(1, 6)
      ours.extend(sid, seq[i:i + k])
      ref.extend(sid, seq[i:i + k])
      i += k
  if remove and len(ours.seqs) > 1:
    ours.remove(0)
    ref.remove(0)
  return ours, ref, V


@pytest.mark.parametrize("use_tree", [False, True], ids=["chain", "tree"])
def test_proposals_equal_arctic_inference(use_tree):
  """1,800 random (trees, context, settings): chain proposals equal Arctic's token for token,
  parents, float32 probabilities and scores bit for bit, the same match length; tree proposals
  the same size, match length and score (to float32 rounding: ties and compressed edges,
  module doc), after removals too. Every third context is the tail of a held sequence and
  names it (`seq_id`: the matches are the sequence's own suffix nodes, as a request's tree
  takes them, not walks from the root)."""
  rng = random.Random(0)
  for case in range(60):
    ours, ref, V = _trees(rng, remove=case % 2 == 1)
    for i in range(30):
      ctx = [rng.randrange(V) for _ in range(rng.randint(1, 12))]
      seq_id = rng.choice(sorted(ours.seqs)) if i % 3 == 0 else None
      if seq_id is not None:
        ctx = ours.seqs[seq_id][-rng.randint(1, ours.max_depth + 2):]
      kw = dict(max_spec_tokens=rng.choice([1, 4, 8, 16]),
                max_spec_factor=rng.choice([0.5, 1.0, 2.0]),
                max_spec_offset=rng.choice([0.0, 1.0]),
                min_token_prob=rng.choice([0.0, 0.1, 0.3]))
      a = ours.speculate(ctx, use_tree=use_tree, seq_id=seq_id, **kw)
      b = ref.speculate(ctx, kw["max_spec_tokens"], kw["max_spec_factor"],
                        kw["max_spec_offset"], kw["min_token_prob"], use_tree)
      where = (case, ctx, kw)
      assert a.match_len == b.match_len and len(a.tokens) == len(b.token_ids), where
      if use_tree:
        assert abs(float(a.score) - b.score) <= 1e-5 * max(1.0, b.score), where
      else:
        assert (a.tokens, a.parents) == (list(b.token_ids), list(b.parents)), where
        assert [float(p) for p in a.probs] == list(b.probs) and float(a.score) == b.score, where


def test_counts_and_the_global_tree_by_hand():
  t = SuffixTree(4)
  t.extend(0, [1, 2, 3, 1, 2, 4, 1, 2])
  assert t.match([1, 2]).count == 3 and t.match([1, 2, 3]).count == 1
  p = t.speculate([5, 1, 2], max_spec_tokens=4, max_spec_factor=2.0)
  # (1, 2) continues with 3 and 4 once each (its third occurrence ends the sequence): 1/3 each,
  # the earlier child first; then (1, 2, 3) -> 1 always, and 4-grams are the tree's depth
  assert p.match_len == 2 and p.tokens == [3, 1] and p.parents == [-1, 0]
  assert [float(x) for x in p.probs] == [pytest.approx(1 / 3)] * 2
  cache = SuffixCache(max_tree_depth=8, max_cached_requests=2)
  cache.start("a", [9, 9])
  cache.extend("a", [4, 5, 6, 7])
  cache.stop("a")
  cache.start("b", [1])  # a's output is in the global tree, its prompt is not
  got = cache.speculate("b", [3, 4, 5], max_spec_tokens=4, max_spec_factor=2.0)
  assert got.tokens == [6, 7]
  cache.start("c", [1])  # two cached requests (b, c): a's output evicted, the oldest
  assert cache.speculate("c", [3, 4, 5], max_spec_tokens=4).tokens == []


@pytest.mark.parametrize("use_tree", [False, True], ids=["chain", "tree"])
def test_greedy_identical_and_a_repeated_request_reuses_its_output(use_tree):
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  dec = SpeculativeEngine(params, CFG, SuffixProposer(max_spec_tokens=6, use_tree=use_tree))
  prompts = [[5, 9, 2, 7, 5, 9], [1, 2, 3]]
  first = greedy_identity(dec, params, CFG, prompts, max_new_tokens=24)
  # the same requests again: the global tree holds their outputs, so most steps draft them
  again = greedy_identity(dec, params, CFG, prompts, max_new_tokens=24)
  assert again.stats.tau > max(first.stats.tau, 2.0), (first.stats.tau, again.stats.tau)
  rec = again.stats.record()
  assert rec["matched_steps"] > 0 and rec["mean_match_len"] >= 1
  assert rec["host_s"] > 0  # the trees' host time, reported (it precedes every step)


@pytest.mark.extended(params=["tree"])
@pytest.mark.parametrize("use_tree", [False, True], ids=["chain", "tree"])
def test_sampling_follows_the_target_law(use_tree):
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  dec = SpeculativeEngine(target, SMALL, SuffixProposer(max_spec_tokens=2, use_tree=use_tree,
                                                        min_token_prob=0.0))
  prompt = [3, 1, *greedy, 3, 1]
  # 6,000 rows (each a request with its own suffix tree on the host): cells expecting < 5 draws
  # are pooled by the test
  pvalue, stats = target_law(dec, target, SMALL, prompt, SamplingParams(temperature=1.0),
                             n=6000, seed=7)
  assert 0.05 < stats.acceptance_rate < 0.95
  assert pvalue > 1e-3


@pytest.mark.parametrize("kw,match", [
    (dict(max_spec_factor=-1.0), "max_spec_factor must be > 0"),
    (dict(min_token_prob=1.5), r"min_token_prob must lie in \[0, 1\], got 1.5"),
    (dict(max_cached_requests=0), "max_cached_requests=0"),
    (dict(max_tree_depth=1), "max_tree_depth must be >= 2, got 1"),
    (dict(max_spec_tokens=0), r"max_spec_tokens must be in \[1, 4096\], got 0"),
    (dict(max_spec_offset=-2.0), "max_spec_offset must be >= 0 and at most 4096, got -2.0"),
    (dict(max_spec_offset=float("nan")), "max_spec_offset must be >= 0 .*got nan"),
    (dict(max_spec_offset=float("inf")), "max_spec_offset must be >= 0 .*got inf"),
    (dict(max_spec_factor=1e300), r"max_spec_factor must be > 0 and at most 4096 .*got 1e\+300"),
    (dict(max_spec_factor=float("nan")), "max_spec_factor must be > 0 .*got nan"),
    (dict(min_token_prob=float("nan")), r"min_token_prob must lie in \[0, 1\], got nan"),
])
def test_nonsense_settings_are_refused_in_one_line(kw, match):
  with pytest.raises(ValueError, match=match):
    SuffixProposer(**kw)


# --- the hybrid with an EAGLE head -----------------------------------------------------------

def _hybrid(target, threshold=None, **kw):
  from tests.helpers.heads import random_head
  from vocabjax.decoding.tree import TreeParams

  hc, head = random_head(target, CFG, 40)
  return SpeculativeEngine(target, CFG, HostTreeHybrid(
      EagleProposer(target, CFG, head, hc, tree=TreeParams(2, 3, 6), **kw),
      SuffixTrees(SuffixProposer(max_spec_tokens=6), score_threshold=threshold)))


@pytest.mark.extended  # the drafter tree's hybrid (merged) stays in the core
@pytest.mark.parametrize("threshold", [None, 1.0], ids=["merged", "thresholded"])
def test_hybrid_with_eagle_is_greedy_identical_and_takes_suffix_tokens(threshold):
  """The head's tree and the suffix proposal merged (or, thresholded, the suffix proposal alone
  where it scores >= 1): plain greedy tokens; on the repeated requests, accepted tokens come
  from the suffix nodes, and thresholded, rows skip the head."""
  target = init_params(jax.random.key(0), CFG, scale=0.3)
  dec = _hybrid(target, threshold)
  prompts = [[5, 9, 2, 7, 5, 9], [1, 2, 3]]
  greedy_identity(dec, target, CFG, prompts, max_new_tokens=24)
  again = greedy_identity(dec, target, CFG, prompts, max_new_tokens=24)
  rec = again.stats.record()
  assert rec["accepted_from_suffix"] > 0 and rec["suffix_steps"] > 0, rec
  if threshold is not None:
    assert rec["head_steps"] < sum(map(sum, again.stats.active)), rec


@pytest.mark.extended
@pytest.mark.parametrize("device", ["eagle", "tree"])
def test_hybrid_sampling_follows_the_target_law(device):
  """The suffix proposal merged into an EAGLE head's tree or a drafter model's tree: sampled
  output follows the target's law (chi-square), with suffix nodes among the accepted."""
  import dataclasses

  from tests.helpers.heads import random_head
  from vocabjax.decoding.tree import TreeParams

  small = dataclasses.replace(SMALL, num_layers=2)  # two layers to fuse
  target = init_params(jax.random.key(10), small, scale=0.8)
  greedy = Decoder(target, small).generate([[3, 1]], max_new_tokens=6).tokens[0]
  suffix = SuffixProposer(max_spec_tokens=2, min_token_prob=0.0)
  if device == "eagle":
    hc, head = random_head(target, small, 6, seed=4)
    dec = SpeculativeEngine(
        target, small,
        HostTreeHybrid(EagleProposer(target, small, head, hc, tree=TreeParams(2, 2, 4)),
                       SuffixTrees(suffix)))
  else:
    draft = init_params(jax.random.key(11), small, scale=0.8)
    dec = SpeculativeEngine(
        target, small,
        HostTreeHybrid(TreeProposer(draft, small, small, tree=TreeParams(2, 2, 4)),
                       SuffixTrees(suffix)))
  pvalue, stats = target_law(dec, target, small, [3, 1, *greedy, 3, 1],
                             SamplingParams(temperature=1.0), n=6000, seed=7)
  acc = [a > 0 for arow, drow in zip(stats.accepted, stats.drafted)
         for a, d in zip(arow, drow) if d]
  assert 0.05 < sum(acc) / len(acc) < 0.95  # informative: some paths accepted, some not
  assert sum(map(sum, stats.counts["from_lookup"])) > 0  # suffix nodes among them
  assert pvalue > 1e-3


# --- the hybrid with a drafter model's tree ---------------------------------------------------

@pytest.mark.extended(params=["thresholded", "self-sized"])
@pytest.mark.parametrize("threshold,sized", [(None, False), (1.0, False), (None, True)],
                         ids=["merged", "thresholded", "self-sized"])
def test_hybrid_with_a_drafter_tree_is_greedy_identical_and_takes_suffix_tokens(threshold,
                                                                                 sized):
  """A drafter model's EAGLE-2 tree and the suffix proposal merged (the merged tree deeper than
  the drafter's: its pending block grows with it), thresholded, or self-sized (the suffix
  part's length chosen from measured step times: what it accepts depends on them, so only the
  tokens and the choices are asserted): plain greedy tokens; on the
  repeated requests accepted tokens come from suffix nodes, and thresholded, rows skip the
  drafter's tree (whose cache still reads every committed token)."""
  from vocabjax.decoding.tree import TreeParams

  target = init_params(jax.random.key(0), CFG, scale=0.3)
  draft = init_params(jax.random.key(3), CFG, scale=0.3)
  dec = SpeculativeEngine(
      target, CFG,
      HostTreeHybrid(TreeProposer(draft, CFG, CFG, tree=TreeParams(2, 2, 4)),
                     SuffixTrees(SuffixProposer(max_spec_tokens=6), score_threshold=threshold)),
      self_sizing=sized)
  assert dec.proposer.device.pend_width == 7  # the suffix proposal reaches depth 6
  prompts = [[5, 9, 2, 7, 5, 9], [1, 2, 3]]
  greedy_identity(dec, target, CFG, prompts, max_new_tokens=24)
  again = greedy_identity(dec, target, CFG, prompts, max_new_tokens=24)
  rec = again.stats.record()
  if sized:  # the suffix part's length chosen per step (its host block cut to a bucket)
    assert set(rec["sizing"]["choices"]) <= set(dec.proposer.host.buckets), rec["sizing"]
    return
  assert rec["accepted_from_suffix"] > 0 and rec["suffix_steps"] > 0, rec
  assert max(max(row) for row in again.stats.accepted) > 2  # deeper than the drafter's tree
  if threshold is not None:
    assert rec["head_steps"] < sum(map(sum, again.stats.active)), rec
