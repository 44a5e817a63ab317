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
from vocabjax.kernels.blocks import BLOCK_TYPES, is_blocks
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


@pytest.mark.extended(params=["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"])
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
  target = to_blocks(init_params(jax.random.key(10), BSMALL, scale=0.3), qtype)[0]
  draft = to_blocks(init_params(jax.random.key(11), BSMALL, scale=0.3), qtype)[0]
  sp = SamplingParams(temperature=1.0)
  proposer = (ChainProposer(draft, BSMALL, BSMALL, gamma=2) if kind == "chain" else
              TreeProposer(draft, BSMALL, BSMALL, tree=TreeParams(2, 2, 4)))
  pvalue, stats = target_law(SpeculativeEngine(target, BSMALL, proposer), target, BSMALL,
                             [3, 1], sp, n=6000, seed=17)
  assert 0.05 < stats.acceptance_rate < 0.95
  assert pvalue > 1e-3


def test_blocks_refuse_a_cast():
  (target, _), _ = _pair(BCFG, "Q8_0", 0.05)
  with pytest.raises(ValueError, match=r"cannot cast a GGUF file's quantized blocks to "
                                       r"bfloat16"):
    cast_weights(target, "bfloat16")
