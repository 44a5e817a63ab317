"""Every decoding method in every weight dtype offered: bf16 weight matrices (f32 activations,
as `load_model(dtype="bfloat16")` gives on the CPU), weight-only int8 (`quantize_int8`), an
int8 drafter verified by an f32 target, and the XLA path without the CPU kernel.
Greedy output equals the same model's autoregressive output; sampling stays lossless."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.models import CFG, PROMPT, SMALL, greedy_decoders, prompt_samples
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.sampling import SamplingParams
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.tree import TreeParams
from vocabjax.kernels import cpu_matmul
from vocabjax.lowering import cpu_kernel_default
from vocabjax.models.llamalike import cast_weights, compute_dtype
from vocabjax.testing.hlo import materialized, step_hlo
from vocabjax.testing.stats import chi2_pvalue, exact_sequence_probs


def test_cast_weights_narrows_matrices_only(pair):
  target, _ = pair
  bf = cast_weights(target, jnp.bfloat16)
  assert bf["embed"].dtype == jnp.bfloat16 and bf["layers"][0]["w_up"].dtype == jnp.bfloat16
  assert bf["layers"][0]["attn_norm"].dtype == jnp.float32
  assert bf["layers"][0]["bq"].dtype == jnp.float32
  assert compute_dtype(bf) == jnp.float32


def _methods(target, draft, names):
  return {n: d for n, d in greedy_decoders(target, draft).items() if n in names}


# Each (weight dtype, CPU kernel) lowering with the methods whose matmuls it meets in a new
# shape: the chain's drafter (one row per call) and verification (gamma + 1 rows), the tree's
# verification (its nodes + 1 rows). Prompt lookup verifies the chain's gamma + 1 rows with the
# target alone, so it runs in two of the five (~10 s of a 2-core run each).
@pytest.mark.extended(params=["float32-False-chain-tree", "bfloat16-False-chain-tree"])
@pytest.mark.parametrize("dtype,kernel,names", [
    pytest.param("bfloat16", True, ("chain", "tree", "pld"), marks=pytest.mark.full_opt),
    ("float32", False, ("chain", "tree")), ("bfloat16", False, ("chain", "tree")),
    pytest.param("int8", True, ("chain", "tree", "pld"), marks=pytest.mark.full_opt),
    ("int8", False, ("chain", "tree"))], ids=lambda x: "-".join(x) if isinstance(x, tuple)
    else str(x))
def test_greedy_identity_per_dtype(pair, dtype, kernel, names):
  target, draft = (cast_weights(p, dtype) for p in pair)
  rs = np.random.RandomState(3)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)] + [[5, 9, 2, 5, 9, 2, 5]]
  with cpu_kernel_default(kernel):  # decoders built inside fix their lowering
    ar = Decoder(target, CFG)
    methods = _methods(target, draft, names)
  ar = ar.generate(prompts, max_new_tokens=24)
  on_cpu = jax.default_backend() == "cpu"  # elsewhere the CPU kernel is never chosen
  for name, dec in methods.items():
    assert dec.lowering.cpu_kernel == (kernel and on_cpu), name
    res = dec.generate(prompts, max_new_tokens=24)
    assert res.tokens == ar.tokens, name
    assert res.stats.tau > 1, name
    if kernel and on_cpu:  # (XLA's dot path widens its weights by design: why the kernel exists)
      steps = step_hlo(dec)
      assert steps, name
      for text in steps:  # the drafting loop gathers table rows, never widens the table
        found = materialized(text, (CFG.vocab_size, CFG.hidden_size), "f32")
        assert not found, (name, found)


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


def test_quantize_int8_rows(pair):
  from vocabjax.models.llamalike import SCALE, embed_tokens, is_int8, lm_head_weight

  target, _ = pair
  q = cast_weights(target, "int8")
  assert is_int8(q) and not is_int8(target) and compute_dtype(q) == jnp.float32
  for name in ("wq", "w_down"):
    w, wq, s = target["layers"][1][name], q["layers"][1][name], q["layers"][1][name + SCALE]
    assert wq.dtype == jnp.int8 and s.shape == (w.shape[0],)
    assert int(jnp.abs(wq.astype(jnp.int32)).max()) == 127  # each row's largest hits 127
    err = jnp.abs(wq.astype(jnp.float32) * s[:, None] - w)
    assert float((err / s[:, None]).max()) <= 0.5 + 1e-4  # round to nearest
  assert q["layers"][0]["attn_norm"].dtype == jnp.float32
  U = lm_head_weight(q, CFG)  # dequantized
  assert U.dtype == jnp.float32 and float(jnp.abs(U - lm_head_weight(target, CFG)).max()) < 0.01
  E = q["embed"].astype(jnp.float32) * q["embed" + SCALE][:, None]
  np.testing.assert_allclose(embed_tokens(q, jnp.asarray([3, 7])), E[jnp.asarray([3, 7])])
  assert float(jnp.abs(E - target["embed"]).max()) < 0.01
  with pytest.raises(ValueError, match="int8"):
    cast_weights(q, jnp.bfloat16)


def test_int8_drafter_with_f32_target_is_exact(pair):
  """The drafter's precision never touches the output: an int8 drafter under an f32 target
  gives the f32 target's own greedy tokens (what `--draft-dtype int8` runs)."""
  target, draft = pair
  draft8 = cast_weights(draft, "int8")
  rs = np.random.RandomState(3)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)] + [[5, 9, 2, 5, 9, 2, 5]]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=20)
  for dec in (SpeculativeEngine(target, CFG, ChainProposer(draft8, CFG, CFG, gamma=3)),
              SpeculativeEngine(target, CFG,
                                TreeProposer(draft8, CFG, CFG, tree=TreeParams(2, 3, 6)))):
    res = dec.generate(prompts, max_new_tokens=20)
    assert res.tokens == ar.tokens and res.stats.tau > 1


@pytest.mark.extended(params=["chain-bfloat16", "tree-bfloat16"])
@pytest.mark.parametrize("kind,dtype", [("chain", jnp.bfloat16), ("tree", jnp.bfloat16),
                                        ("chain", "int8")])
def test_narrow_sampling_is_lossless(small_pair, kind, dtype):
  target, draft = (cast_weights(p, dtype) for p in small_pair)
  sp = SamplingParams(temperature=1.0)
  dec = (SpeculativeEngine(target, SMALL, ChainProposer(draft, SMALL, SMALL, gamma=2))
         if kind == "chain" else SpeculativeEngine(
             target, SMALL, TreeProposer(draft, SMALL, SMALL, tree=TreeParams(2, 2, 4))))
  samples, stats = prompt_samples(dec, sp, seed=11)
  assert 0.05 < stats.acceptance_rate < 0.95
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, PROMPT, sp)) > 1e-3


def test_bf16_pld_sampling_is_lossless():
  from vocabjax.models import init_params

  target = cast_weights(init_params(jax.random.key(10), SMALL, scale=0.8), jnp.bfloat16)
  sp = SamplingParams(temperature=1.0)
  greedy = Decoder(target, SMALL).generate([[3, 1]], max_new_tokens=6).tokens[0]
  prompt = [3, 1, *greedy, 3, 1]
  res = SpeculativeEngine(target, SMALL, LookupProposer(gamma=2)).generate([prompt] * 12_000,
                                                             max_new_tokens=3, sampling=sp,
                                                             seed=13)
  assert 0.05 < res.stats.acceptance_rate < 0.95
  V = SMALL.vocab_size
  toks = np.asarray([r[:3] for r in res.tokens])
  samples = toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2]
  assert chi2_pvalue(samples, exact_sequence_probs(target, SMALL, prompt, sp)) > 1e-3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_prefill_precision_follows_the_weights(pair, dtype):
  """bf16 weights prefill through the CPU's bf16 GEMM (bf16-rounded activations, as PyTorch's
  bf16), f32 and int8 ones in exact f32; either way a chain's greedy output equals AR's on
  prompts long enough for the GEMM (a 70-token block). The chain runs both prefills every
  method uses (the target's and a drafter's: tree and prompt lookup share them; checking their
  steps at this cache size too cost ~18 s of a 2-core run and reached no other prefill code)."""
  from vocabjax.decoding.autoregressive import abstract_cache, compile_prefill, prefill_in_bf16
  from vocabjax.sampling import SamplingParams

  target, draft = (cast_weights(p, dtype) for p in pair)
  assert prefill_in_bf16(target) == (dtype == "bfloat16")
  hlo = compile_prefill(target, CFG, SamplingParams(), 1, 128,
                        abstract_cache(CFG, 1, 256, jnp.float32)).as_text()
  assert ("VjGemmBF16" in hlo) == (dtype == "bfloat16" and cpu_matmul.gemm_available())
  rs = np.random.RandomState(11)
  prompts = [rs.randint(0, 64, n).tolist() for n in (70, 33)]
  ar = Decoder(target, CFG).generate(prompts, max_new_tokens=16)
  chain = _methods(target, draft, ("chain",))["chain"]
  assert chain.generate(prompts, max_new_tokens=16).tokens == ar.tokens
