"""Models whose matrices are GGUF blocks (`load_model(dtype="gguf")`): every method's greedy
output equals plain decoding's on the same blocks and the f32 model of the dequantized values
token for token; sampling stays lossless (chi-square against the exact law)."""

import jax
import numpy as np
import pytest

from tests.helpers.blocks import to_blocks
from tests.helpers.models import greedy_decoders
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams
from vocabjax.kernels.blocks import BLOCK_TYPES, Q8_TYPES, is_blocks, with_arith
from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.models.llamalike import cast_weights, compute_dtype, has_blocks
from vocabjax.sampling import SamplingParams
from vocabjax.testing.proposers import target_law
from vocabjax.vocab.subset import VocabSubset, attach_subset

# widths of whole K blocks (256 values)
BCFG = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=256, intermediate_size=256,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                       attention_bias=True)
BSMALL = LlamaLikeConfig(arch="llama", vocab_size=8, hidden_size=256, intermediate_size=256,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=128)


def _pair(config, qtype, scale):
  target = init_params(jax.random.key(0), config, scale=scale)
  noise = init_params(jax.random.key(1), config, scale=scale)
  draft = jax.tree.map(lambda a, b: a + 0.2 * b, target, noise)
  return to_blocks(target, qtype), to_blocks(draft, qtype)


def _methods(target, draft, config):
  methods = greedy_decoders(target, draft, config)
  del methods["ar"]
  methods["vocabtrim"] = SpeculativeEngine(target, config, ChainProposer(
      attach_subset(draft, config, VocabSubset(np.arange(0, 64, 2), 64)), config, config,
      gamma=3))
  return methods


@pytest.mark.extended
@pytest.mark.parametrize("qtype", sorted(BLOCK_TYPES))
def test_greedy_identity_on_blocks(qtype):
  (target, target32), (draft, _) = _pair(BCFG, qtype, 0.3)
  assert has_blocks(target) and is_blocks(target["layers"][0]["wq"])
  assert not has_blocks(target32) and compute_dtype(target) == np.float32
  rs = np.random.RandomState(3)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 70)] + [[5, 9, 2, 5, 9, 2, 5]]
  ar = Decoder(target, BCFG).generate(prompts, max_new_tokens=16)
  assert ar.tokens == Decoder(target32, BCFG).generate(prompts, max_new_tokens=16).tokens
  for name, dec in _methods(target, draft, BCFG).items():
    res = dec.generate(prompts, max_new_tokens=16)
    assert res.tokens == ar.tokens, name
    if name != "pld":  # (whether lookups hit depends on the model's text)
      assert res.stats.tau > 1, name


# Q4_K and Q6_K (a Q4_K_M file's) in the fast run, the other types in the integration step
@pytest.mark.extended(params=["tree-Q4_K", "tree-Q6_K", "chain-Q6_K", "chain-Q4_K"])
@pytest.mark.parametrize("qtype", [pytest.param(q, marks=() if q in ("Q4_K", "Q6_K") else
                                                pytest.mark.integration)
                                   for q in sorted(BLOCK_TYPES)])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_sampling_on_blocks_is_lossless(qtype, kind):
  _assert_sampling_lossless(qtype, kind, "exact", seed=17)


def _assert_sampling_lossless(qtype, kind, arith, seed):
  """A chain or tree of a blocks drafter over a blocks target (their products in `arith`)
  samples the target's own law at temperature 1 (chi-square over 6,000 draws)."""
  target, draft = (with_arith(to_blocks(init_params(jax.random.key(k), BSMALL, scale=0.3),
                                        qtype)[0], arith) for k in (10, 11))
  sp = SamplingParams(temperature=1.0)
  proposer = (ChainProposer(draft, BSMALL, BSMALL, gamma=2) if kind == "chain" else
              TreeProposer(draft, BSMALL, BSMALL, tree=TreeParams(2, 2, 4)))
  pvalue, stats = target_law(SpeculativeEngine(target, BSMALL, proposer), target, BSMALL,
                             [3, 1], sp, n=6000, seed=seed)
  assert 0.05 < stats.acceptance_rate < 0.95
  assert pvalue > 1e-3


# int8 activations (`dtype="gguf-q8"`, llama.cpp's arithmetic): not the f32 model's logits;
# every method's greedy output is plain decoding's on the same arithmetic (a row's products and
# its attention do not depend on how many rows a block has: tests/kernels/test_cpu_attention.py),
# and sampling stays lossless
@pytest.mark.extended(params=["Q6_K", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("qtype", sorted(Q8_TYPES))
def test_greedy_identity_with_int8_activations(qtype):
  (target, _), (draft, _) = _pair(BCFG, qtype, 0.3)
  target, draft = with_arith(target, "q8"), with_arith(draft, "q8")
  assert target["layers"][0]["wq"].arith == "q8"
  rs = np.random.RandomState(5)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 70)] + [[5, 9, 2, 5, 9, 2, 5]]
  ar = Decoder(target, BCFG).generate(prompts, max_new_tokens=16)
  for name, dec in _methods(target, draft, BCFG).items():
    res = dec.generate(prompts, max_new_tokens=16)
    assert res.tokens == ar.tokens, name
    if name != "pld":
      assert res.stats.tau > 1, name


@pytest.mark.extended(params=["tree"])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_sampling_with_int8_activations_is_lossless(kind):
  _assert_sampling_lossless("Q4_K", kind, "q8", seed=19)


def test_blocks_refuse_a_cast():
  (target, _), _ = _pair(BCFG, "Q8_0", 0.05)
  with pytest.raises(ValueError, match=r"cannot cast a GGUF file's quantized blocks to "
                                       r"bfloat16"):
    cast_weights(target, "bfloat16")


@pytest.mark.extended
def test_heads_and_block_drafters_on_a_blocks_target():
  """What reads the target's features, embedding rows or LM head runs on a target of blocks
  (the default for a GGUF file): EAGLE-3 (own rows), EAGLE over the target's head (a subset
  of it), P-EAGLE, Medusa, DFlash, and SpecVocab's ranked head on a drafter of blocks; each
  decodes plain decoding's tokens on the same blocks, the target's head kept as blocks."""
  import dataclasses

  from tests.helpers.heads import heads_for, random_head
  from vocabjax.decoding.dflash import DFlashProposer
  from vocabjax.decoding.eagle import EagleProposer
  from vocabjax.decoding.medusa import MedusaProposer
  from vocabjax.decoding.peagle import PEagleProposer
  from vocabjax.models.dflash import DFlashConfig, init_dflash
  from vocabjax.models.eagle import init_eagle
  from vocabjax.vocab.ranked import SpeculativeVocab, svd_ranker

  (target, target32), (draft, draft32) = _pair(BCFG, "Q8_0", 0.3)
  rs = np.random.RandomState(4)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 30)]
  ar = Decoder(target, BCFG).generate(prompts, max_new_tokens=12)
  hc, hp = random_head(target32, BCFG)
  dc = DFlashConfig(layer=BCFG.replace(arch="qwen3", qk_norm=True, attention_bias=False),
                    target_hidden_size=BCFG.hidden_size, target_layer_ids=(0, 1),
                    block_size=4, mask_token_id=5)
  pc = dataclasses.replace(hc, draft_vocab_size=64, mask_token_id=5)
  mp, mc = heads_for(target32, BCFG)
  proposers = {
      "eagle3": EagleProposer(target, BCFG, hp, hc, tree=TreeParams(2, 3, 6)),
      "eagle_target_subset": EagleProposer(
          target, BCFG, {**hp, "d2t": hp["d2t"] * 0}, dataclasses.replace(hc, draft_vocab_size=64),
          lm_head="target", draft_vocab=VocabSubset(np.arange(0, 64, 2), 64)),
      "peagle": PEagleProposer(target, BCFG, init_eagle(jax.random.key(2), pc, scale=0.3), pc,
                               drafts=3, lm_head="target"),
      "medusa": MedusaProposer(target, BCFG, mp, mc, choices=[[0], [1], [0, 0]]),
      "dflash": DFlashProposer(target, BCFG, init_dflash(jax.random.key(3), dc, scale=0.3), dc),
      "specvocab": ChainProposer(draft, BCFG, BCFG, gamma=3, draft_vocab=SpeculativeVocab(
          svd_ranker(draft32, BCFG, rank=8), k=16)),
  }
  for name, proposer in proposers.items():
    if name.startswith(("eagle_target", "peagle", "dflash")):
      assert is_blocks(proposer.params["lm_head"]), name  # no f32 copy of the target's head
    res = SpeculativeEngine(target, BCFG, proposer).generate(prompts, max_new_tokens=12)
    assert res.tokens == ar.tokens, name


def test_an_eagle_head_file_on_a_blocks_target_loads_as_on_its_f32_twin(tmp_path):
  """The registry's `eagle` method on a target of GGUF blocks (the default for a .gguf file)
  loads the head's weights as floats, the same values as beside the f32 model of the same
  dequantized weights (the blocks' stored dtype is uint8: a head cast to it drafted nothing the
  target accepted), and drafts and accepts the same tokens at every step."""
  from tests.helpers.heads import random_head
  from vocabjax.checkpoints.eagle2 import load_head
  from vocabjax.checkpoints.eagle3 import save_eagle3
  from vocabjax.checkpoints.loader import Model
  from vocabjax.decoding.eagle import HEAD_KEY
  from vocabjax.methods import METHODS
  from vocabjax.train.features import model_identity

  (target, target32), _ = _pair(BCFG, "Q8_0", 0.3)
  f32 = Model(config=BCFG, params=target32, tokenizer=None, eos_token_ids=(), source="t.gguf",
              dtype="float32")
  blocks = Model(config=BCFG, params=target, tokenizer=None, eos_token_ids=(), source="t.gguf",
                 dtype="gguf")
  hc, hp = random_head(target32, BCFG, Vd=BCFG.vocab_size)
  hp["d2t"] = hp["d2t"] * 0
  head = save_eagle3(hp, hc, tmp_path / "head", target=model_identity(f32))
  params = {"head": str(head), "lm_head": "target", "top_k": 1, "depth": 3, "total_tokens": 3}
  rs = np.random.RandomState(5)
  prompts = [rs.randint(0, 64, n).tolist() for n in (5, 17)]
  runs = {}
  for name, model in (("f32", f32), ("blocks", blocks)):
    dec = METHODS["eagle"].make(model, None, params)
    assert is_blocks(dec.proposer.params["lm_head"]) == (name == "blocks")
    runs[name] = (dec.proposer.params, dec.generate(prompts, max_new_tokens=16))
  own32, ownq = (jax.tree.leaves(runs[k][0][HEAD_KEY]) for k in ("f32", "blocks"))
  assert len(own32) == len(ownq) > 0
  for a, b in zip(own32, ownq):
    assert b.dtype == a.dtype
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
  (_, r32), (_, rq) = runs["f32"], runs["blocks"]
  assert rq.tokens == r32.tokens
  assert rq.stats.accepted == r32.stats.accepted and sum(map(sum, r32.stats.accepted)) > 0
  with pytest.raises(ValueError, match="weights load as floats, got dtype=uint8"):
    load_head(head, dtype=target["embed"].dtype)


def test_a_long_prefill_widens_one_matrix_at_a_time():
  """Past the kernel's rows a prefill runs XLA's dot on widened matrices; each is widened when
  its input exists (`cpu_matmul.widened_after`), so the program's temp buffers hold about one
  widened matrix, not every layer's (XLA:CPU otherwise widens all of them up front)."""
  from vocabjax.decoding.autoregressive import compile_prefill
  from vocabjax.kernels.cpu_matmul import MAX_ROWS
  from vocabjax.lowering import decoding_lowering
  from vocabjax.models import KVCache

  config = BCFG.replace(num_layers=6, intermediate_size=1024)
  target = to_blocks(init_params(jax.random.key(0), config, scale=0.3), "Q8_0")[0]
  T = 2 * MAX_ROWS
  program = compile_prefill(target, config, SamplingParams(), 1, T, KVCache.init(config, 1, T),
                            decoding_lowering(mesh=None))
  widened = sum(4 * w.shape[0] * w.shape[1] for layer in target["layers"]
                for w in layer.values() if is_blocks(w))
  temp = program.memory_analysis().temp_size_in_bytes
  assert temp < widened / 3, (temp, widened)
