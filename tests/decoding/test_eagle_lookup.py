"""EAGLE head + prompt lookup in one tree (`EagleLookupProposer`): the trie merge by hand, greedy
identity, that the lookup's nodes are what is accepted where the text repeats, lossless
sampling, bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.drafter import ChainProposer
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.hybrid import HostTreeHybrid, LookupTrie
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams, merge_nodes
from vocabjax.models import init_params
from vocabjax.sharding import make_mesh
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs

from tests.helpers.models import CFG, PROMPT, SMALL
from tests.helpers.heads import LOOKUP, random_head


def test_merge_nodes_by_hand():
  # head tree under the root: a(1) b(2) at depth 1, c(3) under a
  tok = jnp.asarray([[10, 20, 30]])
  parent = jnp.asarray([[0, 0, 1]])
  depth = jnp.asarray([[1, 1, 2]])
  # lookup trie: 10 (merges into node 1) -> 30 (merges into node 3) -> 40 (new, under 3);
  # 10 -> 50 (new, under node 1); 60 (new root child); one padding node
  x_tok = jnp.asarray([[10, 30, 40, 50, 60, 0]])
  x_par = jnp.asarray([[0, 1, 2, 1, 0, 6]])
  x_dep = jnp.asarray([[1, 2, 3, 2, 1, 1]])
  t, p, d = merge_nodes(tok, parent, depth, x_tok, x_par, x_dep)
  # nodes 4..9 (1-based): 10 merged (pad), 30 merged (pad), 40 under node 3, 50 under node 1,
  # 60 under the root, padding
  np.testing.assert_array_equal(np.asarray(t), [[10, 20, 30, 10, 30, 40, 50, 60, 0]])
  np.testing.assert_array_equal(np.asarray(p), [[0, 0, 1, 4, 5, 3, 1, 0, 9]])
  np.testing.assert_array_equal(np.asarray(d), [[1, 1, 2, 1, 1, 3, 2, 1, 1]])
  # nothing to merge: unchanged
  same = merge_nodes(tok, parent, depth, x_tok[:, :0], x_par[:, :0], x_dep[:, :0])
  assert all(a is b for a, b in zip(same, (tok, parent, depth)))


def _merge_reference(tok, parent, depth, x_tok, x_parent, x_depth):
  """`merge_nodes` for one row, by its docstring, in plain Python."""
  n, m = len(tok), len(x_tok)
  toks, par, dep = list(tok) + list(x_tok), list(parent) + [0] * m, list(depth) + [1] * m
  live = [True] * n + [False] * m
  where = {0: 0}  # x node (0 root, j + 1) -> merged index (0 root, i + 1)
  for j in range(m):
    own = n + j + 1
    if x_parent[j] == j + 1:  # padding
      par[n + j], where[j + 1] = own, own
      continue
    mp = where[int(x_parent[j])]
    twin = [i for i in range(n + j) if live[i] and par[i] == mp and toks[i] == x_tok[j]]
    if twin:  # merged into the first child with its token
      par[n + j], where[j + 1] = own, twin[0] + 1
    else:
      par[n + j], dep[n + j], live[n + j], where[j + 1] = mp, int(x_depth[j]), True, own
  return toks, par, dep


def test_merge_nodes_equals_its_reference_on_random_tries():
  """Random head trees and lookup tries with shared tokens (merges at every depth), padding
  nodes, several sizes: the compiled merge equals the plain-Python reference row by row."""
  rs = np.random.RandomState(0)
  for n, m in ((3, 1), (6, 4), (6, 8), (16, 12)):
    B = 5
    tok, par, dep = (np.zeros((B, n), np.int32) for _ in range(3))
    xt, xp, xd = (np.zeros((B, m), np.int32) for _ in range(3))
    for b in range(B):
      for i in range(n):  # a random tree: each node under the root or an earlier node
        par[b, i] = rs.randint(0, i + 1)
        dep[b, i] = 1 if par[b, i] == 0 else dep[b, par[b, i] - 1] + 1
        tok[b, i] = rs.randint(0, 4)  # few tokens: many twins to merge with
      for j in range(m):
        if rs.rand() < 0.2:
          xp[b, j] = j + 1  # padding
          continue
        xp[b, j] = rs.choice([0] + [k + 1 for k in range(j) if xp[b, k] != k + 1])
        xd[b, j] = 1 if xp[b, j] == 0 else xd[b, xp[b, j] - 1] + 1
        xt[b, j] = rs.randint(0, 4)
    got = [np.asarray(a) for a in merge_nodes(*map(jnp.asarray, (tok, par, dep, xt, xp, xd)))]
    for b in range(B):
      want = _merge_reference(tok[b], par[b], dep[b], xt[b], xp[b], xd[b])
      for g, w in zip(got, want):
        np.testing.assert_array_equal(g[b], w, err_msg=f"n={n} m={m} row {b}")


def _cycle_prompts():
  # t -> 5t + 3 (mod 16) is a 16-cycle: a prompt that already holds the cycle lets the lookup
  # copy the continuation; the short ones give no match at first
  cyc = [1]
  for _ in range(20):
    cyc.append((5 * cyc[-1] + 3) % 16)
  return [cyc, [4, 9, 2], cyc[3:15]]


@pytest.mark.extended(params=["g3c2", "g4c1"])
@pytest.mark.parametrize("gamma,candidates,tp", [(4, 1, TreeParams(2, 3, 6)),
                                                 (3, 2, TreeParams(2, 2, 4)),
                                                 (6, 1, TreeParams(1, 2, 2))],
                         ids=["g4c1", "g3c2", "g6c1-deeper-than-the-tree"])
def test_lookup_nodes_are_accepted_where_the_text_repeats(lookup, gamma, candidates, tp):  # noqa: F811
  """The head drafts depth 1 right and deeper levels wrong; on text that repeats its context the
  lookup's continuation is right to its end, so the hybrid accepts more per step than the head
  alone, the extra tokens come from lookup nodes, and the output is the target's greedy."""
  target, hc, head = lookup
  prompts = _cycle_prompts()
  ar = Decoder(target, LOOKUP).generate(prompts, max_new_tokens=24)
  alone = SpeculativeEngine(target, LOOKUP,
                            EagleProposer(target, LOOKUP, head, hc,
                                          tree=tp)).generate(prompts, max_new_tokens=24)
  dec = SpeculativeEngine(
      target, LOOKUP,
      HostTreeHybrid(EagleProposer(target, LOOKUP, head, hc, tree=tp),
                     LookupTrie(gamma=gamma, candidates=candidates)))
  res = dec.generate(prompts, max_new_tokens=24)
  assert res.tokens == ar.tokens == alone.tokens
  st = res.stats
  rec = st.record()
  assert rec["accepted_from_lookup"] > 0 and rec["lookup_steps"] > 0
  assert max(max(r) for r in st.accepted) > tp.depth or gamma <= tp.depth
  assert st.tau > alone.stats.tau + 0.5, (st.tau, alone.stats.tau)
  assert res.steps < alone.steps
  # drafted = the head's nodes + the trie's, per active row
  assert all(d == tp.total_tokens + x for dr, lr in zip(st.drafted, st.lookup_nodes)
             for d, x in zip(dr, lr) if d)


@pytest.mark.parametrize("vocab,gamma,cand", [
    ("own-reduced", 4, 1), pytest.param("target", 2, 3, marks=pytest.mark.full_opt)])
def test_greedy_identical_to_autoregressive_random_models(target, vocab, gamma, cand):
  """Random target and head: repeated prompt text gives lookup matches the target mostly
  rejects, merged with the head's nodes; the output stays the target's greedy. The head's
  vocabulary enters the head's levels, the lookup's shape (a chain of 4; three candidates of 2)
  the trie: each pairing once (the product compiled 6 more trie buckets, ~20 s on 2 cores)."""
  hc, head = random_head(target, CFG, 40 if vocab == "own-reduced" else None)
  rs = np.random.RandomState(1)
  base = rs.randint(0, CFG.vocab_size, 9).tolist()
  prompts = [base * 3, [5], rs.randint(0, CFG.vocab_size, 4).tolist() * 2, base[:5]]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  res = SpeculativeEngine(
      target, CFG,
      HostTreeHybrid(EagleProposer(target, CFG, head, hc, tree=TreeParams(2, 3, 6),
                                   lm_head="target" if vocab == "target" else "own"),
                     LookupTrie(gamma=gamma, candidates=cand))).generate(
                              prompts, max_new_tokens=24)
  assert res.tokens == ar.tokens
  assert res.stats.record()["lookup_nodes"] > 0


@pytest.mark.extended
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0),
                                      SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_sampling_is_lossless(sampling):
  """Joint law of the first three tokens (V = 8) equals target-only sampling (chi-square). The
  prompt ends with the target's greedy text, which cycles, so the lookup offers likely
  continuations at most steps: most accepted tokens come from lookup nodes, some from the
  head's (whose reduced vocabulary lacks token 6, the cycle's most frequent)."""
  small = dataclasses.replace(SMALL, num_layers=2)
  tgt2 = init_params(jax.random.key(10), small, scale=0.8)
  hc, head = random_head(tgt2, small, 6, seed=4)
  prompt = PROMPT + Decoder(tgt2, small).generate([PROMPT], max_new_tokens=12).tokens[0]
  dec = SpeculativeEngine(
      tgt2, small,
      HostTreeHybrid(EagleProposer(tgt2, small, head, hc, tree=TreeParams(2, 2, 4)),
                     LookupTrie(gamma=2, candidates=2)))
  res = dec.generate([prompt] * 12_000, max_new_tokens=3, sampling=sampling, seed=7)
  V = small.vocab_size
  t = np.asarray([r[:3] for r in res.tokens])
  samples = t[:, 0] * V * V + t[:, 1] * V + t[:, 2]
  rec = res.stats.record()
  assert 2000 < rec["accepted_from_lookup"] < rec["accepted"] - 500, rec  # both are used
  exact = exact_sequence_probs(tgt2, small, prompt, sampling)
  assert chi2_pvalue(samples, exact) > 1e-3


def test_bad_input(target):
  hc, head = random_head(target, CFG, 40)
  with pytest.raises(ValueError, match="gamma must be >= 1, got gamma=0"):
    LookupTrie(gamma=0)
  with pytest.raises(ValueError, match="min_ngram=3 max_ngram=2"):
    LookupTrie(min_ngram=3, max_ngram=2)
  with pytest.raises(ValueError, match="candidates must be >= 1 .*got candidates=0"):
    LookupTrie(candidates=0)
  with pytest.raises(TypeError, match=r"ChainProposer \(chain\) does not grow one"):
    HostTreeHybrid(ChainProposer(target, CFG, CFG, gamma=2), LookupTrie())
  with pytest.raises(ValueError, match="mesh is not supported"):
    mesh = make_mesh(data=1, model=2, devices=jax.devices()[:2])
    SpeculativeEngine(target, CFG, HostTreeHybrid(EagleProposer(target, CFG, head, hc),
                                                  LookupTrie()), mesh=mesh)
  with pytest.raises(ValueError, match="own reduced vocabulary of Vd=40"):  # the head's checks
    from vocabjax.vocab.subset import VocabSubset
    SpeculativeEngine(
        target, CFG,
        HostTreeHybrid(EagleProposer(target, CFG, head, hc,
                                     draft_vocab=VocabSubset(ids=(1, 2, 3), vocab_size=64)),
                       LookupTrie()))
