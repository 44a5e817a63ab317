"""Every decoding method in every weight dtype offered: bf16 weight matrices (f32 activations,
as `load_model(dtype="bfloat16")` gives on the CPU) and the XLA path without the CPU kernel.
Greedy output equals the same model's autoregressive output; sampling stays lossless."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.decoding.conftest import CFG, PROMPT, SMALL, prompt_samples
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.pld import PromptLookupDecoder
from vocabjax.decoding.sampling import SamplingParams
from vocabjax.decoding.speculative import ChainDecoder, TreeDecoder
from vocabjax.decoding.tree import TreeParams
from vocabjax.kernels import cpu_matmul
from vocabjax.models.llamalike import cast_weights, compute_dtype
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs


def test_cast_weights_narrows_matrices_only(pair):
  target, _ = pair
  bf = cast_weights(target, jnp.bfloat16)
  assert bf["embed"].dtype == jnp.bfloat16 and bf["layers"][0]["w_up"].dtype == jnp.bfloat16
  assert bf["layers"][0]["attn_norm"].dtype == jnp.float32
  assert bf["layers"][0]["bq"].dtype == jnp.float32
  assert compute_dtype(bf) == jnp.float32


def _methods(target, draft):
  return {"chain": ChainDecoder(target, CFG, draft, CFG, gamma=3),
          "tree": TreeDecoder(target, CFG, draft, CFG, tree=TreeParams(2, 3, 6)),
          "pld": PromptLookupDecoder(target, CFG, gamma=3)}


@pytest.mark.parametrize("dtype,kernel", [("bfloat16", True), ("float32", False),
                                          ("bfloat16", False)])
def test_greedy_identity_per_dtype(pair, dtype, kernel):
  with cpu_matmul.enabled(kernel):
    target, draft = (cast_weights(p, dtype) for p in pair)
    rs = np.random.RandomState(3)
    prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)] + [[5, 9, 2, 5, 9, 2, 5]]
    # fresh functions: jax caches traces per function, and the switch acts at trace time
    ar = Decoder(target, CFG).generate(prompts, max_new_tokens=24)
    for name, dec in _methods(target, draft).items():
      res = dec.generate(prompts, max_new_tokens=24)
      assert res.tokens == ar.tokens, name
      assert res.stats.tau > 1, name


def test_bf16_differs_from_f32_but_decodes(pair):
  """bf16 weights change the logits (so the checks above are not f32 in disguise)."""
  target, _ = pair
  a = Decoder(target, CFG).generate([[1, 2, 3]], max_new_tokens=30).tokens
  b = Decoder(cast_weights(target, jnp.bfloat16), CFG).generate([[1, 2, 3]],
                                                                 max_new_tokens=30).tokens
  assert len(b[0]) == 30
  from vocabjax.models import KVCache, forward
  from vocabjax.models.llamalike import lm_head

  def logits(p):
    h, _ = forward(p, jnp.asarray([[1, 2, 3]]), jnp.arange(3)[None], KVCache.init(CFG, 1, 8),
                   config=CFG)
    return np.asarray(lm_head(p, h, config=CFG))
  diff = np.abs(logits(target) - logits(cast_weights(target, jnp.bfloat16))).max()
  assert 1e-4 < diff < 0.5, (diff, a == b)


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_bf16_sampling_is_lossless(small_pair, kind):
  target, draft = (cast_weights(p, jnp.bfloat16) for p in small_pair)
  sp = SamplingParams(temperature=1.0)
  dec = (ChainDecoder(target, SMALL, draft, SMALL, gamma=2) if kind == "chain" else
         TreeDecoder(target, SMALL, draft, SMALL, tree=TreeParams(2, 2, 4)))
  samples, stats = prompt_samples(dec, sp, seed=11)
  assert 0.05 < stats.acceptance_rate < 0.95
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) > 1e-3


def test_bf16_pld_sampling_is_lossless():
  from vocabjax.models import init_params

  target = cast_weights(init_params(jax.random.key(10), SMALL, scale=0.8), jnp.bfloat16)
  sp = SamplingParams(temperature=1.0)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  prompt = [3, 1, *greedy, 3, 1]
  res = PromptLookupDecoder(target, SMALL, gamma=2).generate([prompt] * 12_000,
                                                             max_new_tokens=3, sampling=sp,
                                                             seed=13)
  assert 0.05 < res.stats.acceptance_rate < 0.95
  V = SMALL.vocab_size
  toks = np.asarray([r[:3] for r in res.tokens])
  samples = toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2]
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, prompt, sp)) > 1e-3
