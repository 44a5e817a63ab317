"""Chain speculative decoding: greedy identity, hand-checked acceptance, exact sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vocabjax.decoding.verify as verify
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.engine import prompt_bucket
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.drafter import ChainProposer, TreeProposer, compile_draft_prefill
from vocabjax.decoding.pld import LookupProposer
from vocabjax.vocab.subset import VocabSubset
from vocabjax.decoding.tree import TreeParams
from vocabjax.kernels import cpu_matmul
from vocabjax.models import init_params
from vocabjax.testing.fixtures import successor_pair
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs

from tests.helpers.models import CFG, PROMPT, SMALL, prompt_samples

# gamma 3 (with its one-row calls) also runs at users' XLA settings (tests/conftest.py)
@pytest.mark.parametrize("gamma", [1, pytest.param(3, marks=pytest.mark.full_opt), 5])
def test_greedy_identical_to_autoregressive(pair, gamma):
  target, draft = pair
  rs = np.random.RandomState(gamma)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4, 17)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=30)
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=gamma))
  batched = dec.generate(prompts, max_new_tokens=30)
  assert batched.tokens == ar.tokens
  if gamma == 3:  # batch 1 too, for one gamma: the rows' independence is the loop's, not the
    for p, ref in zip(prompts, ar.tokens):  # chain length's (~12 s of compiles saved)
      assert dec.generate([p], max_new_tokens=30).tokens[0] == ref
  st = batched.stats
  assert 0 < st.acceptance_rate < 1  # some drafts rejected, some accepted: both paths ran
  assert 1 < st.tau <= gamma + 1


def test_the_engine_does_not_stand_in_for_its_proposer(pair):
  """A proposer's settings are read from the proposer (`dec.proposer.gamma`); the engine's own
  namespace is its own, so a typo or a proposer attribute fails by name."""
  target, draft = pair
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=2))
  assert dec.proposer.gamma == 2
  for name in ("gamma", "gammma"):
    with pytest.raises(AttributeError, match=name):
      getattr(dec, name)


def test_prompt_blocks_share_one_step_program(pair):
  """The step holds [B, S] caches and nothing of the prompt block T: a prompt of another
  length bucket compiles its prefills, not another step, and decodes the plain tokens."""
  target, draft = pair
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=2))
  ar = Decoder(target, CFG)
  progs = []
  for n in (3, 20):  # prompt blocks T = 4 and 32, one 64-slot cache
    p = [list(range(1, n + 1))]
    res = dec.generate(p, max_new_tokens=8, max_len=64)
    assert res.tokens == ar.generate(p, max_new_tokens=8, max_len=64).tokens
    progs.append(dec.programs(SamplingParams(), 1, prompt_bucket(n), 64, jnp.float32))
  (start4, step4, c4), (start32, step32, c32) = progs
  assert step4 is step32 and start4 is not start32 and c4 == c32 == 0.0  # generate compiled
  assert sorted(k.program for k, _ in dec.compiled_programs().items()) == [
      "cache_prefill", "cache_prefill", "prefill", "prefill", "step", "target_prefill",
      "target_prefill"]


def test_target_prefill_is_one_program_for_every_decoder(pair):
  """The target's prompt prefill is one compiled program per shapes, whichever decoder runs
  it: plain decoding and the speculative engines over the same target take the one the first
  of them compiled (the rest of an engine's prefill, the proposer's state, is its own)."""
  target, draft = pair
  p = [[5, 3, 9, 1, 2]]
  decoders = [Decoder(target, CFG), SpeculativeEngine(target, CFG, ChainProposer(
      draft, CFG, CFG, gamma=2)), SpeculativeEngine(target, CFG, LookupProposer(gamma=3))]
  want = decoders[0].generate(p, max_new_tokens=8, max_len=64).tokens
  for dec in decoders[1:]:
    assert dec.generate(p, max_new_tokens=8, max_len=64).tokens == want

  def targets(dec):
    return [prog for k, prog in dec.compiled_programs().items() if k.program == "target_prefill"]

  plain, = targets(decoders[0])
  assert all(targets(dec) == [plain] and targets(dec)[0] is plain for dec in decoders[1:])
  own = [[prog for k, prog in dec.compiled_programs().items() if k.program == "prefill"]
         for dec in decoders[1:]]
  assert all(len(o) == 1 for o in own) and own[0][0] is not own[1][0]


def test_drafter_prefill_is_one_program_for_every_proposer_over_it(pair):
  """The drafter's prompt prefill into its cache (`SharedCachePrefill`) is one program for a
  chain, a tree and a trimmed head's chain over the same drafter; each keeps its own prefill
  of the rest of its state, and every output is plain decoding's."""
  target, draft = pair
  p = [[5, 3, 9, 1, 2, 7]]
  want = Decoder(target, CFG).generate(p, max_new_tokens=10, max_len=64).tokens
  engines = [SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3)),
             SpeculativeEngine(target, CFG, TreeProposer(draft, CFG, CFG, tree=TreeParams(
                 top_k=2, depth=2, total_tokens=4))),
             SpeculativeEngine(target, CFG, ChainProposer(
                 draft, CFG, CFG, gamma=2,
                 draft_vocab=VocabSubset(ids=np.arange(16), vocab_size=CFG.vocab_size)))]
  for dec in engines:
    assert dec.generate(p, max_new_tokens=10, max_len=64).tokens == want
  fills = [[prog for k, prog in dec.compiled_programs().items() if k.program == "cache_prefill"]
           for dec in engines]
  assert all(len(f) == 1 and f[0] is fills[0][0] for f in fills)
  own = {id(prog) for dec in engines for k, prog in dec.compiled_programs().items()
         if k.program == "prefill"}
  assert len(own) == 3
  # another drafter prefill precision is another program
  exact = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3,
                                                       draft_prefill="exact"))
  assert exact.generate(p, max_new_tokens=10, max_len=64).tokens == want
  fill, = [prog for k, prog in exact.compiled_programs().items() if k.program == "cache_prefill"]
  assert fill is not fills[0][0]


def test_hand_checked_acceptance():
  """Successor fixture, gamma 3, prompt [1]: worked by hand in vocabjax/testing/fixtures.py.

  Step 1 drafts 3,5,6 against the target's 3,4,6: one accepted, emits 3,4. Every later step
  meets exactly one token divisible by 3 at the third draft: two accepted, three emitted.
  """
  config, target, draft = successor_pair(12, skip=3)
  res = SpeculativeEngine(target, config, ChainProposer(draft, config, config,
                                                        gamma=3)).generate([[1]], max_new_tokens=15)
  assert res.tokens[0] == [(2 + i) % 12 for i in range(15)]
  accepted = [row[0] for row in res.stats.accepted]
  assert accepted[:5] == [1, 2, 2, 2, 2]
  # 1 token from prefill, then 2 + 3 + 3 + 3 + 3 = 14 -> 15 tokens after 5 verifications
  assert len(accepted) == 5
  assert res.stats.tau == pytest.approx((2 + 3 * 4) / 5)
  assert res.stats.acceptance_rate == pytest.approx(9 / 15)


def test_identical_drafter_accepts_everything():
  config, target, draft = successor_pair(12, skip=0)
  res = SpeculativeEngine(target, config, ChainProposer(draft, config, config,
                                                        gamma=4)).generate([[5], [7, 8]],
                                                                           max_new_tokens=21)
  assert res.tokens == [[(6 + i) % 12 for i in range(21)], [(9 + i) % 12 for i in range(21)]]
  assert res.stats.tau == 5 and res.stats.acceptance_rate == 1


def test_eos_inside_an_accepted_block_and_max_new_tokens_mid_block():
  config, target, draft = successor_pair(12, skip=0)
  dec = SpeculativeEngine(target, config, ChainProposer(draft, config, config, gamma=4))
  # blocks of 5 after the prefill token: 3 | 4 5 6 7 8 | 9 ...; EOS 6 is mid-block
  res = dec.generate([[2], [5]], max_new_tokens=20, eos_token_ids=[6])
  assert res.tokens[0] == [3, 4, 5, 6] and res.finish_reasons[0] == "eos"
  assert res.tokens[1] == [6] and res.finish_reasons[1] == "eos"
  res = dec.generate([[2]], max_new_tokens=8)
  assert res.tokens[0] == [3, 4, 5, 6, 7, 8, 9, 10] and res.finish_reasons == ["length"]


def test_bad_configuration():
  other = CFG.replace(vocab_size=65)
  p = init_params(jax.random.key(0), CFG)
  with pytest.raises(ValueError, match="V=65 differs from the target's V=64.*CrossVocabProposer"):
    SpeculativeEngine(p, CFG, ChainProposer(init_params(jax.random.key(0), other), other, CFG))
  with pytest.raises(ValueError, match="gamma must be >= 1, got gamma=0"):
    SpeculativeEngine(p, CFG, ChainProposer(p, CFG, CFG, gamma=0))
  with pytest.raises(ValueError, match="exceeds the cache length max_len=16"):
    SpeculativeEngine(p, CFG, ChainProposer(p, CFG, CFG,
                                            gamma=4)).generate([[1] * 5], max_new_tokens=6,
                                                               max_len=16)


# --- statistical losslessness ---------------------------------------------------------------


def _spec_samples(target, draft, sp):
  return prompt_samples(
      SpeculativeEngine(target, SMALL, ChainProposer(draft, SMALL, SMALL, gamma=2)), sp, seed=5)


@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9)],
                         ids=["t1", "t0.7-p0.9"])
def test_sampling_is_lossless(small_pair, sp):
  """12,000 seeded rows; the joint law of the first three tokens (tokens 2-3 come from
  speculation) matches target-only sampling: chi-square p-value > 1e-3 (a correct sampler
  fails this 0.1% of the time; the seed is fixed, so the test is deterministic)."""
  target, draft = small_pair
  samples, stats = _spec_samples(target, draft, sp)
  assert 0.1 < stats.acceptance_rate < 0.9  # rejections and residual sampling really happen
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) > 1e-3


def test_broken_acceptance_rule_is_detected(small_pair, monkeypatch):
  """Accepting every draft (ignoring p/q) makes the same test fail decisively."""
  target, draft = small_pair

  def accept_all(key, drafts, p, q, n_valid=None):
    G = drafts.shape[1]
    n = jnp.full((drafts.shape[0],), G, jnp.int32)
    return n, jax.random.categorical(key, jnp.log(p[:, G]), axis=-1).astype(jnp.int32)

  monkeypatch.setattr(verify, "verify_chain_sampling", accept_all)
  sp = SamplingParams(1.0)
  samples, _ = _spec_samples(target, draft, sp)
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) < 1e-6


@pytest.mark.parametrize("make", [
    lambda t, d: SpeculativeEngine(t, CFG, ChainProposer(d, CFG, CFG, gamma=3)),
    lambda t, d: SpeculativeEngine(t, CFG, TreeProposer(d, CFG, CFG, tree=TreeParams(2, 3, 5))),
], ids=["chain", "tree"])
def test_no_recompilation_across_steps(pair, make):
  target, draft = pair
  dec = make(target, draft)
  dec.generate([[1, 2, 3]], max_new_tokens=5, max_len=128)  # compiles the three programs
  compiles = []

  def listener(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    res = dec.generate([[4, 5, 6, 7]], max_new_tokens=40, max_len=128)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert res.stats.target_forwards > 5 and res.compile_s == 0.0
  assert compiles == []


@pytest.mark.parametrize("draft_prefill", ["bf16", "exact"])
def test_drafter_prefill_precision_keeps_greedy_identity(pair, draft_prefill):
  """The drafter's prompt prefill in bf16 (the CPU's bf16 GEMM) or exact: outputs equal AR's;
  the bf16 one lowers to the GEMM where the CPU has it, and only the drafter's prefill does."""
  from vocabjax.decoding.autoregressive import abstract_cache
  from vocabjax.kernels import cpu_matmul
  from vocabjax.lowering import step_lowering

  target, draft = pair
  rs = np.random.RandomState(7)
  prompts = [rs.randint(0, 64, n).tolist() for n in (45, 70)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=20)
  dec = SpeculativeEngine(target, CFG,
                          ChainProposer(draft, CFG, CFG, gamma=3, draft_prefill=draft_prefill))
  assert dec.generate(prompts, max_new_tokens=20).tokens == ar.tokens
  cache = abstract_cache(CFG, 2, 128, jnp.float32)
  hlo = compile_draft_prefill(dec.proposer_params, CFG, 2, 128, cache, draft_prefill).as_text()
  # the GEMM is a CPU kernel: on a GPU (eval/gpu_exactness.py) no program holds it
  assert ("VjGemmBF16" in hlo) == (draft_prefill == "bf16" and cpu_matmul.gemm_available()
                                   and jax.default_backend() == "cpu")
  # the target's prefill (f32 weights) and the decoder's steps stay exact f32
  assert not dec.lowering.bf16_blocks and not step_lowering(dec.lowering).bf16_blocks
  with pytest.raises(ValueError, match="draft_prefill"):
    SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, draft_prefill="fp8"))


def test_a_batch_block_beyond_the_kernels_rows_keeps_the_kernel(pair):
  # 16 rows x 5 tokens = 80 > MAX_ROWS: the step's projections must still be the CPU kernel's
  # (XLA's dot would round them differently from plain decoding's one-token steps)
  target, draft = pair
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=4))
  B = 16
  assert B * 5 > cpu_matmul.MAX_ROWS
  kernels = []
  for b in (1, B):
    _, step, _ = dec.programs(SamplingParams(), b, 16, 64, jnp.float32)
    kernels.append(step.as_text().count("VjSkinnyMatmul"))
  assert kernels[0] > 0 and kernels[1] == kernels[0]
  _, ar_step, _ = Decoder(target, CFG).programs(SamplingParams(), 80, 16, 64, jnp.float32)
  assert ar_step.as_text().count("VjSkinnyMatmul") > 0


def test_programs_are_keyed_by_their_lowering(pair):
  """A decoder's programs are cached per `ProgramKey` (program, proposer, sampling, shapes,
  lowering): a changed `lowering` builds new programs instead of reusing the old ones (before
  the key held the lowering, the old programs ran)."""
  target, draft = pair
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=2))
  p = [[1, 2, 3]]
  first = dec.generate(p, max_new_tokens=6, max_len=64)
  before = {k.lowering for k, _ in dec.compiled_programs().items()}
  dec.lowering = dec.lowering.replace(block_top_k=8)
  again = dec.generate(p, max_new_tokens=6, max_len=64)
  after = {k.lowering for k, _ in dec.compiled_programs().items()}
  assert again.tokens == first.tokens and again.compile_s > 0
  assert before < after and dec.lowering in after - before
