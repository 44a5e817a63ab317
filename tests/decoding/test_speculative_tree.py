"""EAGLE-2 tree speculative decoding: structure, greedy identity, exact sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vocabjax.decoding.tree as tree_mod
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams, ancestor_mask, compact_path
from vocabjax.decoding.verify import verify_tree_greedy
from vocabjax.models import KVCache, init_params
from vocabjax.testing.fixtures import successor_pair

from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs

from tests.helpers.models import CFG, PROMPT, SMALL, prompt_samples


def test_ancestor_mask_and_greedy_walk_by_hand():
  #        0 (root, token 9)
  #      /   \\
  #   1 (4)  2 (5)
  #    |       \\
  #   3 (6)    4 (7)
  parent = jnp.asarray([[0, 0, 0, 1, 2]])
  anc = np.asarray(ancestor_mask(parent, depth=2))[0]
  expected = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0],
                       [1, 0, 1, 0, 1]], bool)
  np.testing.assert_array_equal(anc, expected)
  tokens = jnp.asarray([[9, 4, 5, 6, 7]])
  V = 10
  # target argmax per node: root -> 5, node 2 -> 7, node 4 -> 3 (bonus)
  want = [5, 0, 7, 0, 3]
  logits = jax.nn.one_hot(jnp.asarray([want]), V)
  n, path, nxt = verify_tree_greedy(tokens, parent, logits, depth=2)
  assert int(n[0]) == 2 and path[0].tolist() == [0, 2, 4] and int(nxt[0]) == 3


@pytest.mark.parametrize("per_row", [False, True], ids=["scatter", "per-row"])
def test_compact_path_moves_accepted_kv(per_row):
  """The indexed scatter (one device) and the per-row form (`Lowering.row_writes`, a mesh)
  move the same entries."""
  k = jnp.arange(1 * 2 * 12 * 1 * 1, dtype=jnp.float32).reshape(1, 2, 12, 1, 1)
  cache = KVCache(k=k, v=-k, lengths=jnp.asarray([10, 10]))
  base = jnp.asarray([3, 5])
  path = jnp.asarray([[0, 2, 4], [0, 1, 0]])
  n = jnp.asarray([2, 1])
  out = compact_path(cache, base, path, n, per_row=per_row)
  assert out.v[0, 0, 3:6, 0, 0].tolist() == [-k[0, 0, 3, 0, 0], -k[0, 0, 5, 0, 0],
                                              -k[0, 0, 7, 0, 0]]
  assert out.lengths.tolist() == [6, 7]
  assert out.k[0, 0, 3:6, 0, 0].tolist() == [k[0, 0, 3, 0, 0], k[0, 0, 5, 0, 0], k[0, 0, 7, 0, 0]]
  assert out.k[0, 1, 5:7, 0, 0].tolist() == [k[0, 1, 5, 0, 0], k[0, 1, 6, 0, 0]]
  assert out.k[0, 0, :3, 0, 0].tolist() == k[0, 0, :3, 0, 0].tolist()  # prefix untouched


@pytest.mark.parametrize("tp", [TreeParams(1, 1, 1), TreeParams(2, 3, 6),
                                pytest.param(TreeParams(4, 4, 16), marks=pytest.mark.full_opt),
                                TreeParams(3, 5, 12)], ids=lambda t: f"k{t.top_k}d{t.depth}n{t.total_tokens}")
def test_greedy_identical_to_autoregressive(pair, tp):
  target, draft = pair
  rs = np.random.RandomState(tp.total_tokens)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4, 17)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=30)
  dec = SpeculativeEngine(target, CFG, TreeProposer(draft, CFG, CFG, tree=tp))
  batched = dec.generate(prompts, max_new_tokens=30)
  assert batched.tokens == ar.tokens
  if tp == TreeParams(4, 4, 16):  # batch 1 too, for one shape: the rows' independence is the
    for p, ref in zip(prompts, ar.tokens):  # loop's, not the tree's (~20 s of compiles saved)
      assert dec.generate([p], max_new_tokens=30).tokens[0] == ref
  assert 1 < batched.stats.tau <= tp.depth + 1


def test_identical_drafter_accepts_full_depth():
  config, target, draft = successor_pair(12, skip=0)
  dec = SpeculativeEngine(target, config,
                          TreeProposer(draft, config, config, tree=TreeParams(2, 3, 6)))
  res = dec.generate([[5], [1, 2, 3]], max_new_tokens=17)
  assert res.tokens == [[(6 + i) % 12 for i in range(17)], [(4 + i) % 12 for i in range(17)]]
  assert res.stats.tau == 4  # depth 3 accepted + bonus, every step
  # EOS inside an accepted path, max-new-tokens mid-path
  res = dec.generate([[2]], max_new_tokens=20, eos_token_ids=[5])
  assert res.tokens[0] == [3, 4, 5] and res.finish_reasons == ["eos"]
  assert dec.generate([[2]], max_new_tokens=6).tokens[0] == [3, 4, 5, 6, 7, 8]


def test_hand_checked_tree_acceptance():
  """Successor fixture, skip 3, a chain-shaped tree (top_k 1, depth 3): the same worked numbers
  as the chain test: one accepted at the first step, then two per step."""
  config, target, draft = successor_pair(12, skip=3)
  res = SpeculativeEngine(target, config,
                          TreeProposer(draft, config, config,
                                       tree=TreeParams(1, 3, 3))).generate([[1]], max_new_tokens=15)
  assert res.tokens[0] == [(2 + i) % 12 for i in range(15)]
  assert [r[0] for r in res.stats.accepted] == [1, 2, 2, 2, 2]


def test_bad_tree_budgets():
  with pytest.raises(ValueError, match="total_tokens=2 is smaller than self.top_k=4"):
    TreeParams(4, 3, 2)
  with pytest.raises(ValueError, match="exceeds the 6 candidates"):
    TreeParams(2, 2, 7)
  with pytest.raises(ValueError, match="total_tokens=3 is smaller than depth=5"):
    TreeParams(2, 5, 3)  # was silently capped at depth 3
  with pytest.raises(ValueError, match="top_k >= 1"):
    TreeParams(0, 2, 2)
  p = init_params(jax.random.key(0), CFG)
  with pytest.raises(ValueError, match="exceeds the cache length max_len=32"):
    SpeculativeEngine(p, CFG,
                      TreeProposer(p, CFG, CFG,
                                   tree=TreeParams(4, 4, 16))).generate([[1] * 4], max_new_tokens=4,
                                                                        max_len=32)


def _tree_samples(target, draft, sp):
  return prompt_samples(
      SpeculativeEngine(target, SMALL, TreeProposer(draft, SMALL, SMALL, tree=TreeParams(2, 2, 4))),
      sp, seed=9)


@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_tree_sampling_is_lossless(small_pair, sp):
  """Same test and threshold as the chain version (chi-square p > 1e-3 over 12,000 rows)."""
  target, draft = small_pair
  samples, stats = _tree_samples(target, draft, sp)
  assert 0.05 < stats.acceptance_rate < 0.95
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) > 1e-3


def test_tree_broken_rule_is_detected(small_pair, monkeypatch):
  """Accepting the first child whenever p(x) > 0 (instead of with probability p(x)) fails."""
  target, draft = small_pair
  real = tree_mod.verify_tree_sampling

  def greedy_accept(key, tokens, parent_full, p, top_k, depth):
    return real(key, tokens, parent_full, jnp.where(p > 0, 1.0, 0.0) + 0 * p, top_k, depth)

  monkeypatch.setattr(tree_mod, "verify_tree_sampling", greedy_accept)
  sp = SamplingParams(1.0)
  samples, _ = _tree_samples(target, draft, sp)
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) < 1e-6


def test_drafter_context_survives_steps(pair):
  """With the drafter = the target (real attention, unlike the successor fixture), every draft
  is right, so a chain-shaped tree accepts its full depth at every step. This failed when the
  drafter's cache update of the step's first call was dropped (tau fell to ~1.3)."""
  target, _ = pair
  res = SpeculativeEngine(target, CFG,
                          TreeProposer(target, CFG, CFG,
                                       tree=TreeParams(1, 4,
                                                       4))).generate([[5, 6, 7, 8, 9], [1, 2]],
                                                                     max_new_tokens=41)
  assert res.stats.tau == 5.0
  assert SpeculativeEngine(target, CFG, ChainProposer(target, CFG, CFG, gamma=4)).generate(
      [[5, 6, 7, 8, 9], [1, 2]], max_new_tokens=41).stats.tau == 5.0


def test_top_k_beyond_the_vocabulary_is_refused(small_pair):
  from vocabjax.decoding.drafter import TreeProposer
  from vocabjax.decoding.tree import TreeParams

  target, draft = small_pair
  with pytest.raises(ValueError, match="top_k=9 exceeds the drafter's vocabulary of V=8"):
    SpeculativeEngine(target, SMALL, TreeProposer(draft, SMALL, SMALL, tree=TreeParams(9, 1, 9)))
