"""The CPU attention kernel of decoding steps (`cpu_matmul.attention`): against the einsum
softmax attention, a query's output independent of how many queries its block has, masks that
hide every slot, bf16 caches; and a model's verified block equal to its one-token steps bit for
bit, on f32 weights, GGUF blocks and int8 activations (the reason the kernel exists)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.blocks import builds_agree, to_blocks
from vocabjax.kernels import cpu_matmul
from vocabjax.kernels.blocks import with_arith
from vocabjax.lowering import Lowering, with_lowering
from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.models.cache import KVCache
from vocabjax.models.llamalike import forward

STEP = Lowering(platform="cpu", any_rows=True)  # a decoding step's lowering on the CPU


def _reference(q, k, v, mask, divisor):
  scores = jnp.einsum("BTNGe,BSNe->BNGTS", q, k.astype(jnp.float32)) / divisor
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  return jnp.einsum("BNGTS,BSNe->BTNGe", probs, v.astype(jnp.float32))


def _operands(B, T, N, G, hd, S, kv_dtype=jnp.float32, seed=0):
  rs = np.random.RandomState(seed)
  q = jnp.asarray(rs.randn(B, T, N, G, hd) * 2, jnp.float32)
  k = jnp.asarray(rs.randn(B, S, N, hd), kv_dtype)
  v = jnp.asarray(rs.randn(B, S, N, hd), kv_dtype)
  lengths = rs.randint(1, S - T + 1, B)
  slots = np.arange(S)[None, None]
  mask = jnp.asarray(slots < (lengths[:, None, None] + np.arange(T)[None, :, None] + 1))
  return q, k, v, mask


def test_the_kernel_is_used_in_decoding_steps_only():
  assert cpu_matmul.uses_attention(jnp.float32, jnp.float32, STEP)
  assert cpu_matmul.uses_attention(jnp.float32, jnp.bfloat16, STEP)
  assert not cpu_matmul.uses_attention(jnp.bfloat16, jnp.bfloat16, STEP)
  assert not cpu_matmul.uses_attention(jnp.float32, jnp.float32, STEP.replace(any_rows=False))
  assert not cpu_matmul.uses_attention(jnp.float32, jnp.float32, STEP.replace(cpu_kernel=False))
  assert not cpu_matmul.uses_attention(jnp.float32, jnp.float32, STEP.replace(platform="gpu"))


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("B,T,N,G,hd,S", [(1, 1, 2, 6, 128, 64), (2, 5, 1, 2, 24, 37),
                                          (1, 9, 2, 1, 8, 20), (3, 3, 4, 3, 256, 16)])
def test_matches_the_einsum_attention(B, T, N, G, hd, S, kv_dtype):
  q, k, v, mask = _operands(B, T, N, G, hd, S, jnp.dtype(kv_dtype))
  divisor = float(np.sqrt(hd))
  out = jax.jit(cpu_matmul.attention, static_argnums=4)(q, k, v, mask, divisor)
  assert out.shape == q.shape and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), np.asarray(_reference(q, k, v, mask, divisor)),
                             rtol=2e-5, atol=2e-5)


def test_a_layer_of_the_stacked_caches_is_read_where_it_lies():
  """`layer=i` over the caches [L, B, S, N, hd] is the attention over their slice i, bit for
  bit, and a decoding step's program copies no layer's slice out of the stack (XLA copied
  k_all[i] and v_all[i] per layer and step: a cost proportional to the cache's size)."""
  from vocabjax.testing.hlo import materialized

  q, k, v, mask = _operands(2, 3, 2, 2, 32, 24, seed=5)
  ks = jnp.stack([k * (i + 1) for i in range(3)])
  vs = jnp.stack([v - i for i in range(3)])
  f = jax.jit(cpu_matmul.attention, static_argnums=(4, 5))
  for i in range(3):
    np.testing.assert_array_equal(np.asarray(f(q, ks, vs, mask, 5.0, i)),
                                  np.asarray(f(q, ks[i], vs[i], mask, 5.0)))
  with pytest.raises(ValueError, match="layer 3 is outside the stacked caches' 3 layers"):
    cpu_matmul.attention(q, ks, vs, mask, 5.0, 3)

  cfg = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=128, intermediate_size=96,
                        num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32)
  params = with_lowering(init_params(jax.random.key(1), cfg), STEP)
  cache = KVCache.init(cfg, 1, 96)
  step = jax.jit(functools.partial(forward, config=cfg)).lower(
      params, jnp.zeros((1, 1), jnp.int32), jnp.full((1, 1), 5), cache).compile()
  text = step.as_text()
  assert "vocabjax_VjAttention" in text
  assert not materialized(text, (1, 96, 2, 32)), "a layer's cache was copied out of the stack"


def test_a_querys_output_does_not_depend_on_its_block():
  q, k, v, mask = _operands(2, 16, 2, 6, 128, 200, seed=3)
  f = jax.jit(cpu_matmul.attention, static_argnums=4)
  full = np.asarray(f(q, k, v, mask, 11.3))
  for lo, hi in [(0, 1), (3, 4), (2, 7), (0, 9), (5, 16), (0, 16)]:
    np.testing.assert_array_equal(np.asarray(f(q[:, lo:hi], k, v, mask[:, lo:hi], 11.3)),
                                  full[:, lo:hi])


def test_a_row_that_sees_nothing_weighs_every_slot_equally():
  q, k, v, mask = _operands(1, 2, 1, 2, 16, 12, seed=4)
  mask = mask.at[0, 1].set(False)
  out = np.asarray(cpu_matmul.attention(q, k, v, mask, 4.0))
  np.testing.assert_allclose(out[0, 1, 0], np.broadcast_to(np.asarray(v)[0, :, 0].mean(0),
                                                           (2, 16)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out, np.asarray(_reference(q, k, v, mask, 4.0)), rtol=2e-5,
                             atol=2e-5)


def test_bad_shapes_are_refused():
  q, k, v, mask = _operands(1, 2, 2, 2, 16, 12)
  with pytest.raises(Exception, match="expected q\\[B, T, N, G, hd\\], k and v"):
    jax.block_until_ready(cpu_matmul.attention(q, k, v[:, :, :1], mask, 4.0))


@pytest.mark.extended
def test_the_avx2_and_portable_builds_compute_the_same_bits(tmp_path):
  """The kernel is plain C++ the compiler vectorizes (its exponential a polynomial, no libm):
  the AVX2 and portable builds give the native build's bits."""
  code = (
      "import numpy as np, jax.numpy as jnp\n"
      "from tests.kernels.test_cpu_attention import _operands\n"
      "from vocabjax.kernels.cpu_matmul import attention\n"
      "out = {}\n"
      "for kv in ('float32', 'bfloat16'):\n"
      "  q, k, v, mask = _operands(2, 5, 2, 3, 72, 50, jnp.dtype(kv), seed=6)\n"
      "  out[kv] = np.asarray(attention(q, k, v, mask, 8.5))\n"
      "np.savez(__import__('sys').argv[1], **out)\n")
  builds_agree(tmp_path, code)


CFG = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=768, intermediate_size=512,
                      num_layers=2, num_heads=6, num_kv_heads=2, head_dim=128,
                      attention_bias=True)


@pytest.mark.parametrize("weights", ["f32", "Q4_K", "Q4_K-q8", "Q6_K-q8"])
def test_a_verified_block_is_its_one_token_steps_bit_for_bit(weights):
  """A block of T tokens through a decoding step's program (the target verifying a draft)
  gives each token the final hidden state of one-token steps (plain decoding), every bit: with
  XLA's einsum attention blocks of 3, 5, 8 or 16 tokens differed in the last bits, which
  8-bit activations (`gguf-q8`) amplified into different greedy tokens."""
  params = init_params(jax.random.key(0), CFG, scale=0.3)
  if weights != "f32":
    params = to_blocks(params, weights.split("-")[0])[0]
    if weights.endswith("q8"):
      params = with_arith(params, "q8")
  params = with_lowering(params, STEP)
  fwd = jax.jit(functools.partial(forward, config=CFG), static_argnames=("fresh",))
  rs = np.random.RandomState(0)
  P = 37
  _, cache = fwd(params, jnp.asarray(rs.randint(0, 64, (1, P))), jnp.arange(P)[None],
                 KVCache.init(CFG, 1, 128), fresh=True)
  for T in (2, 3, 5, 8, 16):
    tokens = jnp.asarray(rs.randint(0, 64, (1, T)))
    block, _ = fwd(params, tokens, (P + jnp.arange(T))[None], cache)
    steps, c = [], cache
    for t in range(T):
      h, c = fwd(params, tokens[:, t:t + 1], jnp.asarray([[P + t]]), c)
      steps.append(np.asarray(h))
    np.testing.assert_array_equal(np.asarray(block), np.concatenate(steps, 1), err_msg=f"T={T}")
