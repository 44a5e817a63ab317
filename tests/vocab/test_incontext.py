"""The in-context vocabulary (MicroSpec): per-row state, exact logits, lossless decoding."""

import jax.numpy as jnp
import numpy as np
import pytest

from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.models.llamalike import lm_head
from vocabjax.testing.fixtures import successor_pair
from vocabjax.vocab.incontext import InContextError, InContextVocab, successor_index
from vocabjax.vocab.policy import policy_state, with_rows
from vocabjax.vocab.subset import VocabSubset

from tests.helpers.models import CFG, SMALL, check_vocab_sampling_lossless
from tests.helpers.vocab import trimmed_and_full


def _lru(seq, window, core=(), successors=None):
  """The reference: the `window` most recently used distinct tokens of `seq` (each followed by
  its indexed successors), the core's left out, with the position each was last seen at."""
  flat = []
  for t in seq:
    flat.append(t)
    if successors is not None:
      flat += [int(x) for x in successors[t] if x >= 0]
  last = {}
  for i, t in enumerate(flat):
    if t not in core:
      last[t] = i
  return dict(sorted(last.items(), key=lambda kv: -kv[1])[:window])


def _held(rows, b):
  ids, use = np.asarray(rows["ids"][b]), np.asarray(rows["last_use"][b])
  return {int(t): int(u) for t, u in zip(ids, use) if u >= 0}


@pytest.mark.extended(params=["microspec-40", "evospec-40", "microspec-8", "evospec-8", "microspec-3", "evospec-3"])
@pytest.mark.parametrize("window", [1, 3, 8, 40])
@pytest.mark.parametrize("indexed", [False, True], ids=["microspec", "evospec"])
def test_rows_hold_the_most_recently_used_distinct_tokens(window, indexed, pair):
  """The rows after a prompt and after steps emitting 0..3 tokens each equal the reference,
  with a one-token core (never held) and, for EvoSpec, each token's two indexed successors."""
  rs = np.random.RandomState(window)
  V, B, T = CFG.vocab_size, 3, 10
  tokens = rs.randint(0, 12, (B, T))  # 12 of the 64 ids: tokens repeat
  succ = np.where(rs.rand(V, 2) < 0.7, rs.randint(0, 12, (V, 2)), -1) if indexed else None
  iv = InContextVocab(VocabSubset(np.array([5]), V), window=window, successors=succ)
  params, _ = iv.attach(pair[1], CFG)
  state = policy_state(params)
  lengths, first = np.array([1, 6, 10]), rs.randint(0, 12, B)
  rows = iv.init_rows(state, jnp.asarray(tokens), jnp.asarray(lengths), jnp.asarray(first))
  seqs = [list(tokens[b, :lengths[b]]) + [first[b]] for b in range(B)]
  for b in range(B):
    assert set(_held(rows, b)) == set(_lru(seqs[b], window, {5}, succ)), b
  for step in range(6):
    n = rs.randint(0, 4, B)
    em = np.full((B, 3), -1)
    for b in range(B):
      em[b, :n[b]] = rs.randint(0, 12, n[b])
      seqs[b] += list(em[b, :n[b]])
    rows = iv.observe(state, rows, jnp.asarray(em))
    for b in range(B):
      held = _held(rows, b)
      assert set(held) == set(_lru(seqs[b], window, {5}, succ)), (step, b)
      slot_of = np.asarray(rows["slot_of"][b])
      assert {t for t in range(V) if slot_of[t] >= 0} == set(held)
      for t in held:
        assert int(rows["ids"][b][slot_of[t]]) == t


def test_successor_index_counts_next_tokens():
  seqs = [[1, 2, 1, 2, 1, 3, 4], [4, 0]]
  idx = successor_index(seqs, 6, 2)
  assert idx.tolist() == [[-1, -1], [2, 3], [1, -1], [4, -1], [0, -1], [-1, -1]]
  core = np.zeros(6, bool)
  core[2] = True
  assert successor_index(seqs, 6, 2, exclude=core)[1].tolist() == [3, -1]
  with pytest.raises(InContextError, match="empty calibration set"):
    successor_index([[3]], 6, 2)
  with pytest.raises(InContextError, match=r"n=0"):
    successor_index(seqs, 6, 0)


def test_policy_gives_exact_logits_of_core_and_context_tokens(pair):
  _, draft = pair
  core = VocabSubset(np.array([0, 5, 9]), CFG.vocab_size)
  iv = InContextVocab(core, window=4)
  params, policy = iv.attach(draft, CFG)
  tokens = jnp.asarray([[5, 7, 7, 11, 0], [3, 0, 0, 0, 0]])
  rows = iv.init_rows(policy_state(params), tokens, jnp.asarray([5, 1]), jnp.asarray([20, 3]))
  h = jnp.asarray(np.random.RandomState(0).randn(2, 3, CFG.hidden_size), jnp.float32)
  ids, z = policy(with_rows(params, rows), h)
  assert ids.shape == z.shape == (2, 3, 3 + 4)
  full = np.asarray(lm_head(draft, h, config=CFG))
  ids, z = np.asarray(ids), np.asarray(z)
  for b, want in enumerate([{0, 5, 9, 7, 11, 20}, {0, 5, 9, 3}]):
    finite = np.isfinite(z[b, 0])
    assert set(ids[b, 0][finite].tolist()) == want  # core, then the context less the core
    assert finite.sum() == len(want)  # each token once
    np.testing.assert_allclose(z[b][:, finite],
                               np.take_along_axis(full[b], ids[b][:, finite], -1),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [pytest.param("chain", marks=pytest.mark.full_opt), "tree"])
def test_greedy_identical_with_an_in_context_vocabulary(pair, kind):
  target, draft = pair
  rs = np.random.RandomState(0)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
  iv = InContextVocab(VocabSubset(np.array([1, 2]), CFG.vocab_size), window=6)
  dec, _ = trimmed_and_full(kind, target, draft, CFG, iv)
  assert dec.generate(prompts, max_new_tokens=24).tokens == ar.tokens


@pytest.mark.extended(params=["tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_context_tokens_set_acceptance(kind):
  """Drafter = target (t -> t + 1) over 12 tokens. A prompt holding every token the output
  will hold keeps the full drafter's tau; a one-token window holds only the last token, never
  its successor: a draft is accepted only where the successor is the core's token (11 -> 0
  once). Outputs stay identical."""
  config, target, _ = successor_pair(vocab_size=12, skip=0)
  core = VocabSubset(np.array([11]), 12)
  prompts = [[5, 6, 7, 8, 9, 10, 0, 1, 2, 3, 4]]
  ar = Decoder(target, config).generate(prompts, max_new_tokens=10)
  wide, full = trimmed_and_full(kind, target, target, config, InContextVocab(core, window=12))
  narrow, _ = trimmed_and_full(kind, target, target, config, InContextVocab(core, window=1))
  r_full, r_wide, r_narrow = (d.generate(prompts, max_new_tokens=10)
                              for d in (full, wide, narrow))
  assert r_full.tokens == r_wide.tokens == r_narrow.tokens == ar.tokens
  assert r_wide.stats.tau == r_full.stats.tau > 2.0
  assert 1.0 < r_narrow.stats.tau < 1.5


@pytest.mark.extended(params=["t1-chain", "t0.7-p0.9-tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_in_context_sampling_is_lossless(small_pair, sp, kind):
  """12,000 seeded rows over V = 8: a core of one token and a window of two, so the candidates
  change with each row's own tokens; the joint law of the first three tokens is the target's."""
  iv = InContextVocab(VocabSubset(np.array([4]), SMALL.vocab_size), window=2)
  check_vocab_sampling_lossless(kind, small_pair, iv, sp, seed=19)


def test_bad_settings_are_one_line_errors(pair):
  core = VocabSubset(np.array([1]), CFG.vocab_size)
  with pytest.raises(InContextError, match="window=0.*empty in-context vocabulary"):
    InContextVocab(core, window=0)
  with pytest.raises(InContextError, match="window=65 exceeds the vocabulary of V=64"):
    InContextVocab(core, window=65)
  other = InContextVocab(VocabSubset(np.array([1]), 100), window=4)
  with pytest.raises(InContextError, match="100 tokens but the drafter has V=64"):
    other.attach(pair[1], CFG)
  with pytest.raises(InContextError, match=r"successor index is \[V=64, n >= 1\]"):
    InContextVocab(core, window=4, successors=np.zeros((10, 2), np.int32))
  with pytest.raises(ValueError, match="per-request state"):
    params, policy = InContextVocab(core, window=4).attach(pair[1], CFG)
    policy(params, jnp.zeros((1, CFG.hidden_size)))


@pytest.mark.extended(params=["tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_indexed_successors_bring_the_next_token(kind):
  """Drafter = target (t -> t + 1) over 12 tokens, a one-token prompt and a one-slot window: the
  window alone never holds the successor (tau ~1); with a successor index counted on the
  sequence 0..11 each committed token brings its successor, so each step's first draft is a
  candidate, and only that one: the vocabulary grows per step, not per draft (tau 2; the full
  drafter's 4). Outputs stay identical."""
  config, target, _ = successor_pair(vocab_size=12, skip=0)
  core = VocabSubset(np.array([11]), 12)
  idx = successor_index([list(range(12)) + [0]], 12, 1)
  prompts = [[3], [7]]
  ar = Decoder(target, config).generate(prompts, max_new_tokens=12)
  plain, full = trimmed_and_full(kind, target, target, config, InContextVocab(core, window=1))
  evo, _ = trimmed_and_full(kind, target, target, config,
                            InContextVocab(core, window=2, successors=idx))
  r_full, r_plain, r_evo = (d.generate(prompts, max_new_tokens=12) for d in (full, plain, evo))
  assert r_full.tokens == r_plain.tokens == r_evo.tokens == ar.tokens
  assert r_plain.stats.tau < 1.5
  assert r_evo.stats.tau == 2.0 and r_full.stats.tau == 4.0


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_evolving_sampling_is_lossless(small_pair, kind):
  """The in-context slots grown by a successor index (V = 8): the target's law at T = 1."""
  idx = np.random.RandomState(3).randint(-1, 8, (8, 2))
  iv = InContextVocab(VocabSubset(np.array([4]), SMALL.vocab_size), window=2, successors=idx)
  check_vocab_sampling_lossless(kind, small_pair, iv, SamplingParams(1.0), seed=31)


def test_continuous_batching_hands_each_row_its_own_vocabulary(pair):
  """Five prompts through two cache rows: a row taking the next prompt takes that prompt's
  in-context vocabulary (the one-row prefill's rows written over it); greedy output equals
  plain decoding, and equals the batched engine's tokens prompt by prompt."""
  target, draft = pair
  rs = np.random.RandomState(2)
  prompts = [rs.randint(0, 64, n).tolist() for n in (3, 9, 1, 6, 4)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=10)
  iv = InContextVocab(VocabSubset(np.array([1, 2]), CFG.vocab_size), window=6)
  dec, _ = trimmed_and_full("chain", target, draft, CFG, iv)
  res = dec.generate_continuous(prompts, rows=2, max_new_tokens=10)
  assert res.tokens == ar.tokens
