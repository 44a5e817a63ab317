"""Speculative decoding on a mesh of 8 virtual CPU devices (tests/conftest.py sets XLA_FLAGS):
chain, tree, EAGLE and Medusa, with the vocabulary policies, prompt lookup and cross-vocabulary
drafting give the unsharded greedy tokens on
several mesh shapes (CFG's 4 heads and 2 KV heads do not divide an 8-way model axis: those
weights are replicated), the loop state stays sharded, sampling stays lossless on one mesh, and
bad meshes and batches are refused."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from vocabjax import sharding
from vocabjax.decoding import Decoder, SamplingParams
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.medusa import MedusaProposer
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams
from vocabjax.models import init_params
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs
from vocabjax.vocab.ranked import SpeculativeVocab, svd_ranker
from vocabjax.vocab.policy import policy_state
from vocabjax.vocab.subset import VocabSubset

from tests.helpers.models import CFG, PROMPT, SMALL, prompt_samples
from tests.helpers.heads import random_head
from tests.helpers.heads import heads_for

# tensor parallelism alone and data x model (a third shape, (4, 2), compiled every decoder again
# for 30 s and checked nothing the two do not)
MESHES = [(1, 8), (2, 4)]
# The decoders each mesh runs: on (2, 4) all six; on (1, 8) one of each step kind (chain, tree,
# EAGLE, Medusa with a subset). The chain's subset and ranker heads split their rows over
# "model" as Medusa's subset does, and (2, 4) checks them (~10 s of a 2-core run).
DECODERS = ("chain", "chain_subset", "chain_ranker", "tree", "eagle", "medusa_subset", "medusa")
ON_MESH = {(1, 8): ("chain", "tree", "eagle", "medusa_subset"), (2, 4): DECODERS}
PROMPTS = [[5, 9, 2, 7, 5, 9], [1, 2, 3], [8, 8, 8, 8, 4, 1, 1], [3]]


def test_there_are_8_devices():
  assert jax.device_count() == 8


def _decoders(pair, mesh, names=DECODERS):
  """The named decoders (of `DECODERS`) on `mesh`, built in that order."""
  target, draft = pair
  tp = TreeParams(2, 3, 6)
  subset = VocabSubset(np.arange(0, CFG.vocab_size, 2), CFG.vocab_size)
  kw = {} if mesh is None else {"mesh": mesh}

  def eagle():
    hc, head = random_head(target, CFG, Vd=40)
    return SpeculativeEngine(target, CFG, EagleProposer(target, CFG, head, hc, tree=tp), **kw)

  def medusa_subset():
    heads, mc = heads_for(target, CFG, shared=True)
    return SpeculativeEngine(target, CFG, MedusaProposer(
        target, CFG, heads, mc, choices=[[0], [1], [0, 0]], draft_vocab=subset), **kw)

  make = {
      "chain": lambda: SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3),
                                         **kw),
      "chain_subset": lambda: SpeculativeEngine(target, CFG, ChainProposer(
          draft, CFG, CFG, gamma=3, draft_vocab=subset), **kw),
      "chain_ranker": lambda: SpeculativeEngine(target, CFG, ChainProposer(
          draft, CFG, CFG, gamma=3,
          draft_vocab=SpeculativeVocab(svd_ranker(draft, CFG, rank=4), k=16)), **kw),
      "tree": lambda: SpeculativeEngine(target, CFG, TreeProposer(draft, CFG, CFG, tree=tp),
                                        **kw),
      "eagle": eagle,
      "medusa_subset": medusa_subset,
      "medusa": lambda: SpeculativeEngine(target, CFG, MedusaProposer(
          target, CFG, *heads_for(target, CFG, shared=False), choices=[[0], [1], [0, 0]]),
          **kw),
  }
  return {name: make[name]() for name in names}


@pytest.mark.extended(params=["1-8"])
@pytest.mark.parametrize("data,model", MESHES, ids=lambda x: str(x))
def test_sharded_greedy_equals_unsharded_and_steps_do_not_reshard(pair, data, model):
  """Every decoder on the mesh gives the unsharded greedy tokens, and the step it ran (chain
  with the full head, a subset's rows and a ranker; tree; EAGLE; Medusa) communicates only what
  tensor parallelism needs: all-reduces (row-parallel outputs, vocabulary-split embedding
  lookups) and all-gathers of a few values per row and device (the per-device partial argmaxes
  / top-k rounds over vocabulary-split logits, the step's outputs for the host): no all-to-all,
  no collective-permute, and nothing the size of a cache, a logits row or a batch's hidden
  states. Before attention was split by whole KV-head groups, the cache written and compacted
  per row and top-k traced as argmax rounds on a mesh, the (2, 4) chain step gathered every
  row's cache indices and entries and permuted them between devices, and tree drafting
  gathered whole logits rows. (One test: the step checked is the one generate compiled.)"""
  mesh = sharding.make_mesh(data=data, model=model)
  ar = Decoder(pair[0], CFG).generate(PROMPTS, max_new_tokens=16)
  B, longest = len(PROMPTS), max(map(len, PROMPTS))
  for name, dec in _decoders(pair, mesh, ON_MESH[(data, model)]).items():
    res = dec.generate(PROMPTS, max_new_tokens=16)
    assert res.tokens == ar.tokens, name
    # drafts are accepted (the drafts themselves may differ from one device's in rounding:
    # the one-device drafter prefills in bf16 and uses the CPU matmul kernel)
    assert res.stats.tau > 1.0, name
    if model > 1:  # the target is tensor-parallel: its MLP and vocabulary split
      assert dec.target_params["layers"][0]["w_up"].sharding.spec == P("model", None), name
      assert dec.target_params["embed"].sharding.spec == P("model", None), name
      if name.endswith("_subset"):  # a trimmed head's rows split as the full head's
        assert policy_state(dec.proposer_params)["head"].sharding.spec == P("model", None), name
    _, step, compile_s = dec.programs(SamplingParams(), B, 16, dec.cache_len(longest, 16),
                                      jax.numpy.float32)
    assert compile_s == 0.0, name  # the program generate ran
    coll = sharding.collectives(step.as_text())
    assert set(coll) <= {"all-reduce", "all-gather"}, (name, coll)
    count, nbytes = coll.get("all-gather", (0, 0))
    assert nbytes <= count * 4 * B * 8 * model, (name, coll)  # <= 8 values per row and device


def test_loop_state_stays_sharded(pair):
  mesh = sharding.make_mesh(data=2, model=4)
  dec = _decoders(pair, mesh, ("chain",))["chain"]
  # the shapes the greedy test's chain on this mesh compiles (read back from the compile cache)
  T, S = 16, dec.cache_len(max(map(len, PROMPTS)), 16)
  start, step, _ = dec.programs(SamplingParams(), 4, T, S, np.float32)
  z = jax.numpy.zeros((4, T), jax.numpy.int32)
  _, state = start(z, jax.numpy.ones((4,), jax.numpy.int32), jax.random.key(0))
  before = jax.tree.map(lambda x: x.sharding, state)
  assert state.target_cache.k.sharding.spec[1] == "data"  # rows over the data axis
  state, _, _ = step(dec.target_params, dec.proposer_params, state, jax.random.key(1))
  state, _, _ = step(dec.target_params, dec.proposer_params, state, jax.random.key(2))
  assert jax.tree.map(lambda x: x.sharding, state) == before
  # another prompt block compiles its prefills, not another step: its start places the loop
  # state as the step was compiled for
  start4, step4, _ = dec.programs(SamplingParams(), 4, 4, S, np.float32)
  assert step4 is step and start4 is not start
  z = jax.numpy.zeros((4, 4), jax.numpy.int32)
  _, state4 = start4(z, jax.numpy.ones((4,), jax.numpy.int32), jax.random.key(0))
  assert jax.tree.map(lambda x: x.sharding, state4) == before


def test_sampling_is_lossless_on_a_mesh(small_pair):
  """The first three tokens of 12,000 rows sampled by a chain on a (2, 4) mesh follow the
  target's law (chi-square)."""
  target, draft = small_pair
  mesh = sharding.make_mesh(data=2, model=4)
  sp = SamplingParams(temperature=1.0)
  samples, st = prompt_samples(
      SpeculativeEngine(target, SMALL, ChainProposer(draft, SMALL, SMALL, gamma=2), mesh=mesh), sp)
  assert 0.05 < st.acceptance_rate < 0.95
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) > 1e-3


def test_bad_meshes_and_batches(pair):
  target, draft = pair
  with pytest.raises(ValueError, match=r"mesh data=3 x model=2 does not match 8 devices"):
    sharding.make_mesh(data=3, model=2)
  mesh = sharding.make_mesh(data=4, model=2)
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=2), mesh=mesh)
  with pytest.raises(ValueError, match=r"B=3 rows does not divide the mesh's data axis of 4"):
    dec.generate(PROMPTS[:3], max_new_tokens=4)
  with pytest.raises(ValueError, match=r"layout='in_out': on a mesh"):
    SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=2), mesh=mesh,
                      layout="in_out")


# prompt lookup and cross-vocabulary drafting on the (2, 4) mesh only: rows over "data" (their
# host-side state per row) and tensor parallelism at once; the (1, 8) mesh's own case (more
# devices on "model" than heads) is the sharding rules', which the greedy identity test above
# checks on it for every decoder kind these programs are built from
@pytest.mark.extended
@pytest.mark.parametrize("data,model", [(2, 4)], ids=lambda x: str(x))
def test_prompt_lookup_on_a_mesh(pair, data, model):
  """Prompt lookup decoding (a chain, and a tree of 3 matches' continuations) on a mesh gives
  the unsharded greedy tokens; its verification programs (one per draft count or node count)
  keep the cache sharded and communicate only tensor parallelism's all-reduces and a few
  values per row (as `test_steps_do_not_reshard`)."""
  target = pair[0]
  mesh = sharding.make_mesh(data=data, model=model)
  ar = Decoder(target, CFG).generate(PROMPTS, max_new_tokens=24)
  for candidates in (1, 3):
    dec = SpeculativeEngine(target, CFG, LookupProposer(gamma=3, candidates=candidates), mesh=mesh)
    res = dec.generate(PROMPTS, max_new_tokens=24)
    assert res.tokens == ar.tokens, candidates
    assert sum(map(sum, res.stats.drafted)) > 0, candidates  # matches were verified
    if model > 1:
      assert dec.target_params["layers"][0]["w_up"].sharding.spec == P("model", None)
    B = 4
    # the verification programs generate compiled (one per draft count M or node count n
    # met: the host block's shape, the last of their key's shapes), W = M + 1 or n + 1 tokens
    # verified per row: each
    # all-gather carries at most one value per token, row and device (the per-device partial
    # argmax / max over the vocabulary-split logits), never a logits row or a cache
    progs = [(key.shapes[-1][0][1] + 1, p) for key, p in dec.compiled_programs().items()
             if key.program == "step"]
    assert len(progs) >= 2, candidates
    for W, prog in progs:
      coll = sharding.collectives(prog.as_text())
      assert set(coll) <= {"all-reduce", "all-gather"}, (candidates, W, coll)
      count, nbytes = coll.get("all-gather", (0, 0))
      assert nbytes <= count * 4 * B * W * model, (candidates, W, coll)
  dec = SpeculativeEngine(target, CFG, LookupProposer(gamma=2), mesh=mesh)
  if data > 1:
    with pytest.raises(ValueError, match=rf"B=3 rows does not divide the mesh's data axis of "
                                         rf"{data}"):
      dec.generate(PROMPTS[:3], max_new_tokens=4)


@pytest.mark.extended
def test_prompt_lookup_sampling_is_lossless_on_a_mesh():
  """12,000 rows sampled by prompt lookup on a (2, 4) mesh follow the target's law (chi-square;
  the prompt of tests/decoding/test_pld.py::test_sampling_is_lossless: its lookups draft
  tokens the target often, not always, samples)."""
  target = init_params(jax.random.key(10), SMALL, scale=0.8)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  prompt = [3, 1, *greedy, 3, 1]
  mesh = sharding.make_mesh(data=2, model=4)
  sp = SamplingParams(temperature=1.0)
  samples, st = prompt_samples(SpeculativeEngine(target, SMALL, LookupProposer(gamma=2), mesh=mesh),
                               sp, seed=7, prompt=prompt)
  assert 0.05 < st.acceptance_rate < 0.95
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, prompt, sp)) > 1e-3


@pytest.mark.extended
@pytest.mark.parametrize("data,model", [(2, 4)], ids=lambda x: str(x))
def test_cross_vocabulary_on_a_mesh(data, model):
  """Cross-vocabulary drafting (a drafter with another tokenizer, n-gram merges on and off) on
  a mesh gives the target's unsharded greedy tokens; its caches keep their shardings across
  steps (rows over "data"), its drafting and verification programs communicate only tensor
  parallelism's all-reduces and a few values per row; a batch that does not divide the data
  axis is refused by name."""
  from tests.helpers.crossvocab import crossvocab_pair, prompts
  from vocabjax.decoding.crossvocab import CrossVocabProposer

  ttok, dtok, tc, dc, target, draft = crossvocab_pair()
  mesh = sharding.make_mesh(data=data, model=model)
  ps = prompts(ttok) + prompts(ttok)[:1]  # 4 rows
  ref = Decoder(target, tc).generate(ps, max_new_tokens=24)
  for ngram in (False, True):
    dec = SpeculativeEngine(
        target, tc,
        CrossVocabProposer(draft, dc, tc, target_tokenizer=ttok, draft_tokenizer=dtok, gamma=3,
                           ngram=ngram), mesh=mesh)
    res = dec.generate(ps, max_new_tokens=24)
    assert res.tokens == ref.tokens, ngram
    assert res.stats.tau > 1.0, ngram
    for params in (dec.target_params,
                   dec.proposer.draft_params):  # both models tensor-parallel: their MLPs split
      assert params["layers"][0]["w_up"].sharding.spec == P("model", None)
    for key, prog in dec.compiled_programs().items():
      if key.program in ("draft", "step"):
        name = key.program
        coll = sharding.collectives(prog.as_text())
        assert set(coll) <= {"all-reduce", "all-gather"}, (name, coll)
        count, nbytes = coll.get("all-gather", (0, 0))
        assert nbytes <= count * 4 * 4 * 8 * model, (name, coll)
  if data > 1:
    with pytest.raises(ValueError, match=rf"B=3 rows does not divide the mesh's data axis of "
                                         rf"{data}"):
      dec.generate(ps[:3], max_new_tokens=4)


@pytest.mark.extended
def test_cross_vocabulary_sampling_is_lossless_on_a_mesh():
  """The exact rule with n-gram merges on a (2, 4) mesh: 2,400 rows (batches of 400) follow
  the target's law (chi-square), with many merged drafts accepted."""
  from tests.helpers.crossvocab import merging_law
  from vocabjax.testing.fixtures import merging_pair

  pvalue, merged = merging_law(merging_pair(seed=0), "exact", SamplingParams(temperature=1.0),
                                2400, 400, mesh=sharding.make_mesh(data=2, model=4))
  assert merged > 0.5
  assert pvalue > 1e-3


def test_int8_weights_on_a_mesh_decode_as_on_one_device(pair):
  """Weight-only int8 target and drafter (`quantize_int8`) on a (2, 4) mesh: each matrix's
  per-row scales split as its rows (`sharding.with_scale_specs`), the chain's greedy tokens
  the one-device int8 target's; GGUF blocks (the CPU kernel's format) stay one-device."""
  from vocabjax.kernels.blocks import quantize
  from vocabjax.models.llamalike import quantize_int8

  target, draft = (quantize_int8(p) for p in pair)
  mesh = sharding.make_mesh(data=2, model=4)
  dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3), mesh=mesh)
  layer = dec.target_params["layers"][0]
  assert layer["w_up"].sharding.spec == P("model", None)  # F 48 over 4
  assert layer["w_up_scale"].sharding.spec == P("model")
  assert layer["w_down_scale"].sharding.spec == P()
  assert dec.target_params["embed_scale"].sharding.spec == P("model")
  res = dec.generate(PROMPTS, max_new_tokens=12)
  assert res.tokens == Decoder(target, CFG).generate(PROMPTS, max_new_tokens=12).tokens
  assert res.stats.tau > 1.0
  with pytest.raises(ValueError, match="GGUF blocks are a one-device option"):
    sharding.shard_params({**pair[0], "embed": quantize(np.asarray(pair[0]["embed"]), "Q8_0")},
                          CFG, mesh)


def test_newer_policies_on_a_mesh_equal_plain_greedy(pair):
  """MicroSpec's in-context rows (loop state with a row axis, placed over "data"), DynaSpec's
  clusters and SlimSpec's factors on a (2, 4) mesh: the unsharded plain greedy tokens."""
  from vocabjax.decoding import Decoder
  from vocabjax.models.identity import drafter_identity
  from vocabjax.models.llamalike import lm_head_weight
  from vocabjax.vocab.clustered import ClusterRouter, ClusteredVocab, fit_clusters
  from vocabjax.vocab.incontext import InContextVocab
  from vocabjax.vocab.lowrank import LowRankHead

  target, draft = pair
  mesh = sharding.make_mesh(data=2, model=4)
  members = fit_clusters(np.asarray(lm_head_weight(draft, CFG)), 8, iters=2)
  rs = np.random.RandomState(0)
  router = ClusterRouter(members, rs.randn(8, CFG.hidden_size).astype(np.float32),
                         np.zeros(8, np.float32), drafter_identity(draft, CFG))
  ar = Decoder(target, CFG).generate(PROMPTS, max_new_tokens=12)
  for vocab in (InContextVocab(VocabSubset(np.array([1, 2]), CFG.vocab_size), window=6),
                ClusteredVocab(router, 2), LowRankHead(svd_ranker(draft, CFG, 4))):
    dec = SpeculativeEngine(target, CFG, ChainProposer(draft, CFG, CFG, gamma=3,
                                                       draft_vocab=vocab), mesh=mesh)
    assert dec.generate(PROMPTS, max_new_tokens=12).tokens == ar.tokens, type(vocab).__name__
