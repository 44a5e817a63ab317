"""`Lowering.sum_attention` (opt-in): attention over the cache as summed products, each
layer's output tied to the caches before the next layer writes. On XLA:GPU the step then writes
its cache slots in place instead of rewriting the whole stacked cache
(kernels/results/gpu_cache_traffic/); here: the same logits as the einsum path, greedy
identity of every decoder with it, and the GPU step compiled deviceless without the rewrites."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.models import CFG, greedy_decoders
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.lowering import Lowering, sum_attention_default, with_lowering
from vocabjax.models import KVCache, forward
from vocabjax.models.llamalike import cast_weights, lm_head


def _logits(params, lowering, tokens):
  """A prompt prefilled (the einsum-free fresh path), then each later token as a one-token
  step through the cache: the path `sum_attention` changes."""
  p = with_lowering(params, lowering)
  cache = KVCache.init(CFG, 1, 32)
  out = []
  h, cache = forward(p, jnp.asarray([tokens[:4]]), jnp.arange(4)[None], cache, config=CFG)
  for t in range(4, len(tokens)):
    h, cache = forward(p, jnp.asarray([[tokens[t]]]), jnp.asarray([[t]]), cache, config=CFG)
    out.append(np.asarray(lm_head(p, h, config=CFG))[0, -1])
  return np.stack(out)


def test_summed_attention_gives_the_einsum_paths_logits(pair):
  target, _ = pair
  toks = [5, 9, 2, 5, 9, 2, 7, 1, 33, 12, 60, 4]
  for dtype in ("float32", "bfloat16"):
    params = target if dtype == "float32" else cast_weights(target, dtype)
    ref = _logits(params, Lowering(cpu_kernel=False), toks)
    got = _logits(params, Lowering(cpu_kernel=False, sum_attention=True), toks)
    np.testing.assert_allclose(got, ref, atol=2e-5 if dtype == "float32" else 2e-2, rtol=0)
    assert np.abs(ref).max() > 0.1  # logits of substance


@pytest.mark.extended(params=["float32"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_decoder_keeps_greedy_identity_with_summed_attention(pair, dtype):
  target, draft = (p if dtype == "float32" else cast_weights(p, dtype) for p in pair)
  rs = np.random.RandomState(7)
  prompts = [rs.randint(0, 64, n).tolist() for n in (1, 9, 4)] + [[5, 9, 2, 5, 9, 2, 5]]
  with sum_attention_default(True):  # decoders fix their lowering when constructed
    decoders = greedy_decoders(target, draft)
  assert all(d.lowering.sum_attention for d in decoders.values())
  assert not Decoder(target, CFG).lowering.sum_attention  # off outside (the default)
  ar = decoders.pop("ar").generate(prompts, max_new_tokens=20)
  for name, dec in decoders.items():
    res = dec.generate(prompts, max_new_tokens=20)
    assert res.tokens == ar.tokens, name
    assert res.stats.tau > 1, name


@pytest.mark.integration
@pytest.mark.parametrize("method", ["ar", "chain_g3", "tree_k2d3n6"])
def test_the_gpu_step_writes_slots_in_place_with_summed_attention(method):
  """XLA:GPU (deviceless, an H100): with the option the step neither copies nor transposes
  the stacked K / V caches, in the step or in its drafting loop's body (the einsum path does
  both, and the tree's drafting loop copies the drafter's cache every iteration: a recorded
  H200 run); the plain and chain steps' slot writes are all in place (the tree's compaction
  scatters)."""
  from vocabjax.bench import tpu
  from vocabjax.bench import stand_ins
  from vocabjax.testing.hlo import whole_array_writes

  S = 256
  shape = (CFG.num_layers, 1, S, CFG.num_kv_heads, CFG.head_dim)
  setup = stand_ins.Setup(CFG, CFG, head_vocab=32, head_intermediate=48, ranker_rank=8)
  with sum_attention_default(True):
    step = tpu.lower_step(method, setup, topology="gpu:h100", S=S, T=16, compile=True)
  assert step.decoder.lowering.sum_attention
  for name in step.step_programs:
    text = step.programs[name].compiled.as_text()
    everywhere = whole_array_writes(text, shape, entry_only=False)
    assert everywhere and not {k for _, k in everywhere} & {"copy", "transpose"}, everywhere
    if method != "tree_k2d3n6":
      assert {k for _, k in whole_array_writes(text, shape)} == {"in-place"}, everywhere


@pytest.mark.extended
def test_the_environment_switches_it_on_for_a_process():
  """`VOCABJAX_SUM_ATTENTION=1` at import (what eval/gpu_exactness.py --sum-attention
  sets for its pytest runs) makes it every decoder's default."""
  import os
  import subprocess
  import sys

  code = ("from vocabjax.lowering import decoding_lowering; "
          "print(decoding_lowering(mesh=False).sum_attention)")
  for value, want in (("1", "True"), ("0", "False")):
    env = {**os.environ, "VOCABJAX_SUM_ATTENTION": value, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.stdout.strip() == want, out.stderr[-2000:]
