"""The layer loop (`Lowering.layer_loop`): a decoder of GGUF blocks runs its layers as one loop
body with the layer an operand of the CPU kernels, and computes the unrolled layers' bits."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.blocks import random_blocks, to_blocks
from vocabjax.kernels import cpu_matmul
from vocabjax.kernels.blocks import BLOCK_TYPES, Q8_TYPES, dequantize, from_numpy, with_arith
from vocabjax.lowering import Lowering, with_lowering
from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.models import llamalike as ll
from vocabjax.models.cache import KVCache

pytestmark = pytest.mark.skipif(not cpu_matmul.available(), reason="needs the CPU kernel")

CFG = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=256, intermediate_size=512,
                      num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                      attention_bias=True)
CPU = Lowering(platform="cpu")


def _mixed_blocks():
  """CFG's random model as Q4_K blocks with layers 1 and 3's wv and w_down Q6_K (a Q4_K_M
  file's mix: the block types differ from layer to layer)."""
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  q4, _ = to_blocks(params, "Q4_K")
  q6, _ = to_blocks(params, "Q6_K")
  for i in (1, 3):
    for name in ("wv", "w_down"):
      q4["layers"][i][name] = q6["layers"][i][name]
  return q4


def _run(params, lowering, T, capture=()):
  """A fresh prefill of T tokens, then steps of 1, 4 and 1 tokens (the kernel for any rows):
  every hidden state, captured layer output and the caches, as numpy arrays."""
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 64, (1, T + 6)))

  def call(params, tokens, cache, fresh, lw):
    pos = cache.lengths[:, None] + jnp.arange(tokens.shape[1])[None]
    p = with_lowering(params, lw)
    if capture:
      return ll.forward_features(p, tokens, pos, cache, config=CFG, layers=capture, fresh=fresh)
    return (*ll.forward(p, tokens, pos, cache, config=CFG, fresh=fresh), None)

  prefill = jax.jit(lambda p, t, c: call(p, t, c, True, lowering))
  step = jax.jit(lambda p, t, c: call(p, t, c, False, lowering.replace(any_rows=True)))
  h, cache, feats = prefill(params, tokens[:, :T], KVCache.init(CFG, 1, 128))
  out = [h, feats]
  for n in (1, 4, 1):
    h, cache, feats = step(params, tokens[:, T:T + n], cache)
    out += [h, feats]
    T += n
  return [np.asarray(a) for a in (*out, cache.k, cache.v) if a is not None]


@pytest.mark.parametrize("arith", ["exact", "q8"])
@pytest.mark.parametrize("T", [5, cpu_matmul.MAX_ROWS + 11])
@pytest.mark.parametrize("capture", [(), (1, 3)])
def test_loop_computes_the_unrolled_bits(arith, T, capture):
  params = _mixed_blocks()
  if arith == "q8":
    params = with_arith(params, "q8")
  cache = KVCache.init(CFG, 1, 64)
  assert ll.loops_layers(params["layers"], CFG, CPU, cache)
  assert not ll.loops_layers(params["layers"], CFG, CPU.replace(layer_loop=False), cache)
  loop = _run(params, CPU, T, capture)
  unrolled = _run(params, CPU.replace(layer_loop=False), T, capture)
  assert len(loop) == len(unrolled)
  for a, b in zip(loop, unrolled):
    np.testing.assert_array_equal(a, b)


def test_loop_with_the_bf16_gemm_prefill():
  """A drafter's prefill (`Lowering.bf16_blocks`, the bf16 GEMM above GEMM_MIN_ROWS rows)."""
  params = _mixed_blocks()
  lw = CPU.replace(bf16_blocks=True)
  for a, b in zip(_run(params, lw, 40), _run(params, lw.replace(layer_loop=False), 40)):
    np.testing.assert_array_equal(a, b)


def test_the_program_is_one_loop_reading_the_weights_in_place():
  params = _mixed_blocks()
  step = jax.jit(lambda p, t, c: ll.forward(
      with_lowering(p, CPU.replace(any_rows=True)), t, c.lengths[:, None] + jnp.arange(1)[None],
      c, config=CFG))
  compiled = step.lower(params, jnp.zeros((1, 1), jnp.int32), KVCache.init(CFG, 1, 64)).compile()
  hlo = compiled.as_text()
  assert " while(" in hlo or "while(" in hlo
  # 7 projections in one body (the layers are not unrolled), none of the blocks copied
  assert hlo.count('custom_call_target="vocabjax_VjLayerMatmul"') == 7
  smallest = min(w.data.size for layer in params["layers"] for w in layer.values()
                 if hasattr(w, "qtype"))
  copied = [int(np.prod([int(d) for d in m.group(1).split(",") if d]))
            for m in re.finditer(r"= u8\[([0-9,]*)\][^ ]* copy\(", hlo)]
  assert all(n < smallest for n in copied), (copied, smallest)


def test_which_models_loop():
  cache = KVCache.init(CFG, 1, 64)
  dense = init_params(jax.random.key(0), CFG)
  assert not ll.loops_layers(dense["layers"], CFG, CPU, cache)  # f32 weights stay unrolled
  blocks = _mixed_blocks()
  assert not ll.loops_layers(blocks["layers"], CFG, Lowering(platform="tpu"), cache)
  assert not ll.loops_layers(blocks["layers"], CFG, CPU.replace(cpu_kernel=False), cache)
  assert not ll.loops_layers(blocks["layers"][:1], CFG.replace(num_layers=1), CPU, cache)
  gemma = CFG.replace(arch="gemma3", sliding_window=8,
                      layer_types=("sliding_attention",) * 3 + ("full_attention",))
  assert not ll.loops_layers(blocks["layers"], gemma, CPU, KVCache.init(gemma, 1, 64))
  odd = [dict(layer) for layer in blocks["layers"]]
  odd[2]["w_up"] = jnp.zeros((512, 256))  # one layer's projection not blocks
  assert not ll.loops_layers(odd, CFG, CPU, cache)


@pytest.mark.parametrize("qtype", sorted(BLOCK_TYPES))
def test_layer_kernels_equal_the_one_weight_path(qtype):
  """`layer_dequantize` gives `dequantize`'s values and `layer_linear` the one-weight kernel's
  products, bit for bit, whichever layer of several (of two block types) is asked for."""
  other = "Q8_0" if qtype != "Q8_0" else "Q4_0"
  ws = tuple(from_numpy(random_blocks(q, 48, 256, seed=s), q, 256)
             for s, q in enumerate((other, qtype, other)))
  x = jnp.asarray(np.random.RandomState(1).randn(3, 256), jnp.float32)
  for arith in ("exact", "q8") if qtype in Q8_TYPES and other in Q8_TYPES else ("exact",):
    wa = tuple(with_arith({"w": w}, arith)["w"] for w in ws)
    for layer in range(3):
      got = jax.jit(lambda i, x: (cpu_matmul.layer_dequantize(wa, i),
                                  cpu_matmul.layer_linear(x, wa, i, CPU)))(layer, x)
      np.testing.assert_array_equal(got[0], dequantize(wa[layer]))
      want = cpu_matmul.linear(x, wa[layer], lowering=CPU)
      np.testing.assert_array_equal(got[1], want)
    # after a value: `widened_after`'s bits (-0 made +0); a NaN one makes every value NaN
    for first in (-2.5, np.nan):
      after = x.at[0, 0].set(first)
      got = jax.jit(lambda i, a: cpu_matmul.layer_dequantize(ws, i, a))(1, after)
      want = cpu_matmul.widened_after(ws[1], after)
      np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                    np.asarray(want).view(np.uint32))
      assert np.isnan(np.asarray(got)).all() == np.isnan(first)


def test_layer_linear_names_a_width_mismatch():
  ws = (from_numpy(random_blocks("Q4_0", 8, 64), "Q4_0", 64),) * 2
  with pytest.raises(ValueError, match="x's width 32 differs from the weights' 64"):
    cpu_matmul.layer_linear(jnp.zeros((1, 32)), ws, 0, CPU)


@pytest.mark.extended
def test_layer_kernels_agree_across_builds(tmp_path):
  """The layer targets in every build of the kernel (native, AVX2, portable, AVX-512 without
  VNNI): the same bits, for each block type and both arithmetics."""
  from tests.helpers.blocks import builds_agree

  code = (
      "import jax, jax.numpy as jnp, numpy as np\n"
      "from tests.helpers.blocks import random_blocks\n"
      "from vocabjax.kernels.blocks import BLOCK_TYPES, Q8_TYPES, from_numpy, with_arith\n"
      "from vocabjax.kernels.cpu_matmul import layer_dequantize, layer_linear\n"
      "from vocabjax.lowering import Lowering\n"
      "x = jnp.asarray(np.random.RandomState(2).randn(12, 512), jnp.float32)\n"
      "out = {}\n"
      "for q in sorted(BLOCK_TYPES):\n"
      "  ws = (from_numpy(random_blocks('Q8_0', 40, 512, seed=4), 'Q8_0', 512),\n"
      "        from_numpy(random_blocks(q, 40, 512, seed=5), q, 512))\n"
      "  for arith in ('exact', 'q8') if q in Q8_TYPES else ('exact',):\n"
      "    wa = tuple(with_arith({'w': w}, arith)['w'] for w in ws)\n"
      "    out[f'{q}_{arith}_deq'] = np.asarray(layer_dequantize(wa, 1, x))\n"
      "    for m in (1, 3, 12):\n"
      "      out[f'{q}_{arith}_{m}'] = np.asarray(layer_linear(x[:m], wa, 1,\n"
      "                                                        Lowering(platform='cpu')))\n"
      "np.savez(__import__('sys').argv[1], **out)\n")
  builds_agree(tmp_path, code)
