"""Chain speculative decoding: greedy identity, hand-checked acceptance, exact sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.stats import chi2

import vocabjax.decoding.speculative as spec
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.speculative import ChainDecoder
from vocabjax.models import KVCache, LlamaLikeConfig, forward, init_params, lm_head
from vocabjax.testing.fixtures import successor_pair

CFG = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True)


@pytest.fixture(scope="module")
def pair():
  """A target and a drafter that agree often but not always (the drafter is a noisy copy)."""
  target = init_params(jax.random.key(0), CFG, scale=0.3)
  noise = init_params(jax.random.key(1), CFG, scale=0.3)
  draft = jax.tree.map(lambda a, b: a + 0.5 * b, target, noise)
  return target, draft


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_identical_to_autoregressive(pair, gamma):
  target, draft = pair
  rs = np.random.RandomState(gamma)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4, 17)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=30)
  dec = ChainDecoder(target, CFG, draft, CFG, gamma=gamma)
  batched = dec.generate(prompts, max_new_tokens=30)
  assert batched.tokens == ar.tokens
  for p, ref in zip(prompts, ar.tokens):  # batch 1 too
    assert dec.generate([p], max_new_tokens=30).tokens[0] == ref
  st = batched.stats
  assert 0 < st.acceptance_rate < 1  # some drafts rejected, some accepted: both paths ran
  assert 1 < st.tau <= gamma + 1


def test_hand_checked_acceptance():
  """Successor fixture, gamma 3, prompt [1]: worked by hand in vocabjax/testing/fixtures.py.

  Step 1 drafts 3,5,6 against the target's 3,4,6: one accepted, emits 3,4. Every later step
  meets exactly one token divisible by 3 at the third draft: two accepted, three emitted.
  """
  config, target, draft = successor_pair(12, skip=3)
  res = ChainDecoder(target, config, draft, config, gamma=3).generate([[1]], max_new_tokens=15)
  assert res.tokens[0] == [(2 + i) % 12 for i in range(15)]
  accepted = [row[0] for row in res.stats.accepted]
  assert accepted[:5] == [1, 2, 2, 2, 2]
  # 1 token from prefill, then 2 + 3 + 3 + 3 + 3 = 14 -> 15 tokens after 5 verifications
  assert len(accepted) == 5
  assert res.stats.tau == pytest.approx((2 + 3 * 4) / 5)
  assert res.stats.acceptance_rate == pytest.approx(9 / 15)


def test_identical_drafter_accepts_everything():
  config, target, draft = successor_pair(12, skip=0)
  res = ChainDecoder(target, config, draft, config, gamma=4).generate([[5], [7, 8]],
                                                                     max_new_tokens=21)
  assert res.tokens == [[(6 + i) % 12 for i in range(21)], [(9 + i) % 12 for i in range(21)]]
  assert res.stats.tau == 5 and res.stats.acceptance_rate == 1


def test_eos_inside_an_accepted_block_and_max_new_tokens_mid_block():
  config, target, draft = successor_pair(12, skip=0)
  dec = ChainDecoder(target, config, draft, config, gamma=4)
  # blocks of 5 after the prefill token: 3 | 4 5 6 7 8 | 9 ...; EOS 6 is mid-block
  res = dec.generate([[2], [5]], max_new_tokens=20, eos_token_ids=[6])
  assert res.tokens[0] == [3, 4, 5, 6] and res.finish_reasons[0] == "eos"
  assert res.tokens[1] == [6] and res.finish_reasons[1] == "eos"
  res = dec.generate([[2]], max_new_tokens=8)
  assert res.tokens[0] == [3, 4, 5, 6, 7, 8, 9, 10] and res.finish_reasons == ["length"]


def test_bad_configuration():
  other = CFG.replace(vocab_size=65)
  p = init_params(jax.random.key(0), CFG)
  with pytest.raises(ValueError, match="V=65 differs from the target's V=64.*cross-vocabulary"):
    ChainDecoder(p, CFG, init_params(jax.random.key(0), other), other)
  with pytest.raises(ValueError, match="gamma must be >= 1, got gamma=0"):
    ChainDecoder(p, CFG, p, CFG, gamma=0)
  with pytest.raises(ValueError, match="exceeds the cache length max_len=16"):
    ChainDecoder(p, CFG, p, CFG, gamma=4).generate([[1] * 5], max_new_tokens=6, max_len=16)


# --- statistical losslessness ---------------------------------------------------------------

SMALL = LlamaLikeConfig(arch="llama", vocab_size=8, hidden_size=16, intermediate_size=16,
                        num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
PROMPT = [3, 1]


def _exact_joint(params, sp: SamplingParams) -> np.ndarray:
  """P(x1, x2, x3 | PROMPT) under target-only sampling, by enumerating all V^2 prefixes."""
  V = SMALL.vocab_size

  def dist(seqs):
    seqs = jnp.asarray(seqs)
    B, T = seqs.shape
    h, _ = forward(params, seqs, jnp.broadcast_to(jnp.arange(T), (B, T)),
                   KVCache.init(SMALL, B, T), config=SMALL)
    from vocabjax.decoding.sampling import log_probs
    return np.exp(np.asarray(log_probs(lm_head(params, h[:, -1], config=SMALL), sp),
                             np.float64))

  p1 = dist([PROMPT])[0]
  p2 = dist([PROMPT + [a] for a in range(V)])  # [V, V]
  p3 = dist([PROMPT + [a, b] for a in range(V) for b in range(V)]).reshape(V, V, V)
  return p1[:, None, None] * p2[:, :, None] * p3


def _chi2_pvalue(samples: np.ndarray, probs: np.ndarray) -> float:
  """Goodness of fit; cells expecting < 5 draws are pooled into one."""
  n = len(samples)
  counts = np.bincount(samples, minlength=probs.size).astype(np.float64)
  probs = probs.ravel()
  assert counts[probs == 0].sum() == 0, "a token with target probability 0 was emitted"
  big = probs * n >= 5
  obs, exp = counts[big], probs[big] * n
  if (~big).any() and probs[~big].sum() > 0:
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, probs[~big].sum() * n)
  stat = ((obs - exp) ** 2 / exp).sum()
  return float(chi2.sf(stat, len(obs) - 1))


def _spec_samples(target, draft, sp, n=12_000, gamma=2):
  dec = ChainDecoder(target, SMALL, draft, SMALL, gamma=gamma)
  res = dec.generate([PROMPT] * n, max_new_tokens=3, sampling=sp, seed=5)
  V = SMALL.vocab_size
  toks = np.asarray([r[:3] for r in res.tokens])
  return toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2], res.stats


@pytest.fixture(scope="module")
def small_pair():
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  draft = init_params(jax.random.key(11), SMALL, scale=0.8)  # unrelated: many rejections
  return target, draft


@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_sampling_is_lossless(small_pair, sp):
  """12,000 seeded rows; the joint law of the first three tokens (tokens 2-3 come from
  speculation) matches target-only sampling: chi-square p-value > 1e-3 (a correct sampler
  fails this 0.1% of the time; the seed is fixed, so the test is deterministic)."""
  target, draft = small_pair
  samples, stats = _spec_samples(target, draft, sp)
  assert 0.1 < stats.acceptance_rate < 0.9  # rejections and residual sampling really happen
  assert _chi2_pvalue(samples, _exact_joint(target, sp)) > 1e-3


def test_broken_acceptance_rule_is_detected(small_pair, monkeypatch):
  """Accepting every draft (ignoring p/q) makes the same test fail decisively."""
  target, draft = small_pair

  def accept_all(key, drafts, p, q):
    G = drafts.shape[1]
    n = jnp.full((drafts.shape[0],), G, jnp.int32)
    return n, jax.random.categorical(key, jnp.log(p[:, G]), axis=-1).astype(jnp.int32)

  monkeypatch.setattr(spec, "verify_chain_sampling", accept_all)
  sp = SamplingParams(1.0)
  samples, _ = _spec_samples(target, draft, sp)
  assert _chi2_pvalue(samples, _exact_joint(target, sp)) < 1e-6
