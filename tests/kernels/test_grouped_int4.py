"""Grouped int4 (`kernels.blocks.GroupedInt4`): Q4_0's values laid out for an accelerator's dot
(int4 codes [D, F], f32 group scales). Its values are gguf's Q4_0 values bit for bit, `linear`,
row gathers and the indexed head compute with exactly those values, an int4 model on them
decodes every method's greedy tokens as plain decoding does, one device or a mesh, and on a
TPU the dot reads the codes and scales, nothing widened."""

import functools
import re

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.models import greedy_decoders
from vocabjax.checkpoints.loader import dtype_name, load_model
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.kernels import grouped_int4_gpu, grouped_int4_tpu
from vocabjax.kernels.blocks import (BlockError, GroupedInt4, dequantize, grouped_from_blocks,
                                     grouped_in_out, grouped_int4, is_blocks, quantize)
from vocabjax.kernels.cpu_matmul import linear
from vocabjax.kernels.gather import take_rows
from vocabjax.kernels.indexed_lm_head import indexed_lm_head
from vocabjax.lowering import Lowering
from vocabjax.models import LlamaLikeConfig, init_params
from vocabjax.models.llamalike import (LAYER_MATRICES, compute_dtype, has_blocks,
                                       quantize_blocks, quantize_grouped)
from vocabjax.sharding import grouped_specs, make_mesh, shard_params
from vocabjax.testing.tiny import save_tiny_variant

QCFG = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=64, intermediate_size=96,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                       attention_bias=True)


def _matrix(F=96, D=128, seed=0):
  rng = np.random.default_rng(seed)
  w = (rng.standard_normal((F, D)) * rng.uniform(0.01, 3.0, (F, 1))).astype(np.float32)
  w[3, :32] = 0.0  # a group of zeros: scale 0
  w[4, 32:64] = 0.5  # a group of equal values: the first of the largest magnitude
  w[5, 64:96] = np.linspace(-1, 1, 32)  # both signs at the largest magnitude
  return w


def test_its_values_are_ggufs_q4_0_values():
  w = _matrix()
  want = gguf.quants.dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0),
                                gguf.GGMLQuantizationType.Q4_0)
  g = grouped_int4(jnp.asarray(w))
  assert isinstance(g, GroupedInt4) and is_blocks(g)
  assert g.shape == (96, 128) and g.codes.shape == (128, 96) and g.scales.shape == (4, 96)
  assert g.codes.dtype == jnp.int4 and g.scales.dtype == jnp.float32
  assert g.nbytes == 96 * 128 // 2 + 4 * 96 * 4
  np.testing.assert_array_equal(np.asarray(dequantize(g)), want)
  codes = np.asarray(g.codes.astype(jnp.int8))
  assert codes.min() >= -8 and codes.max() <= 7
  # Q4_0's own blocks repack into the same values
  np.testing.assert_array_equal(np.asarray(dequantize(grouped_from_blocks(quantize(w, "Q4_0")))),
                                want)
  # bf16 weights quantize as their f32 values do (a bf16 checkpoint on a TPU)
  wb = jnp.asarray(w, jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(dequantize(grouped_int4(wb))), np.asarray(
      dequantize(quantize(np.asarray(wb, np.float32), "Q4_0"))))


@pytest.mark.parametrize("platform", ["cpu", "gpu"])  # gpu: the Triton kernel's rows
def test_linear_gathers_and_the_indexed_head_use_those_values(platform, monkeypatch):
  if platform == "gpu" and jax.default_backend() != "gpu":  # the kernel in the interpreter
    monkeypatch.setattr(grouped_int4_gpu, "grouped_matmul", functools.partial(
        grouped_int4_gpu.grouped_matmul, interpret=True))
  w = _matrix()
  g = grouped_int4(jnp.asarray(w))
  deq = np.asarray(dequantize(g))
  x = np.random.default_rng(1).standard_normal((2, 3, 128)).astype(np.float32)
  lowering = Lowering(platform=platform)
  with jax.default_matmul_precision("highest"):  # a GPU's default f32 dot rounds to TF32
    y = linear(jnp.asarray(x), g, lowering=lowering)
  np.testing.assert_allclose(np.asarray(y), x @ deq.T, rtol=1e-5, atol=1e-5)
  # bf16 activations: on an accelerator the dot takes the values rounded to bf16 (f32 sums);
  # on the CPU, the exact values in f32
  xb = jnp.asarray(x, jnp.bfloat16)
  yb = linear(xb, g, lowering=lowering)
  assert yb.dtype == jnp.float32
  wb = deq if platform == "cpu" else np.asarray(jnp.asarray(deq, jnp.bfloat16), np.float32)
  np.testing.assert_allclose(np.asarray(yb), np.asarray(xb, np.float32) @ wb.T, rtol=1e-5,
                             atol=1e-4)
  idx = jnp.array([[1, 5, 95], [7, 3, 3]])
  np.testing.assert_array_equal(np.asarray(take_rows(g, idx)), deq[np.asarray(idx)])
  with pytest.raises(ValueError, match="carry their own scales"):
    linear(jnp.asarray(x), g, jnp.ones(96), lowering=lowering)


def test_the_indexed_head_over_grouped_rows():
  w = _matrix()
  g = grouped_int4(jnp.asarray(w))
  h = jnp.asarray(np.random.default_rng(2).standard_normal((2, 128)), jnp.float32)
  idx = jnp.array([[0, 9, 95, 4], [3, 3, 17, 60]])
  z = indexed_lm_head(h, g, idx)
  want = np.einsum("bkd,bd->bk", np.asarray(dequantize(g))[np.asarray(idx)], np.asarray(h))
  np.testing.assert_allclose(np.asarray(z), want, rtol=1e-5, atol=1e-5)


def _pair():
  target = init_params(jax.random.key(0), QCFG, scale=0.3)
  noise = init_params(jax.random.key(1), QCFG, scale=0.3)
  return target, jax.tree.map(lambda a, b: a + 0.3 * b, target, noise)


PROMPTS = [[5, 9, 2, 5, 9, 2, 5], [7], list(range(3, 40))]


def test_an_int4_model_decodes_exactly_on_grouped_codes():
  """Every method on a grouped-int4 target and drafter: plain decoding's tokens on the same
  model, and those are the tokens of the same model on Q4_0 blocks (the same values)."""
  target, draft = _pair()
  gt, gd = quantize_grouped(target), quantize_grouped(draft)
  for layer in gt["layers"]:
    assert all(isinstance(layer[n], GroupedInt4) for n in LAYER_MATRICES)
  assert has_blocks(gt) and compute_dtype(gt) == jnp.float32
  np.testing.assert_array_equal(np.asarray(gt["layers"][0]["attn_norm"]),
                                np.asarray(target["layers"][0]["attn_norm"]))
  decoders = greedy_decoders(gt, gd, QCFG)
  del decoders["pld"]  # its verification is the chain's program here (one XLA path)
  ar = decoders.pop("ar").generate(PROMPTS, max_new_tokens=12)
  for name, dec in decoders.items():
    res = dec.generate(PROMPTS, max_new_tokens=12)
    assert res.tokens == ar.tokens, name
    assert res.stats.tau > 1, name
  blocks = Decoder(quantize_blocks(target), QCFG).generate(PROMPTS, max_new_tokens=12)
  assert blocks.tokens == ar.tokens


def test_int4_on_a_mesh_is_split_as_its_matrices(tmp_path):
  path = save_tiny_variant("llama_mha", tmp_path / "m")
  mesh = make_mesh(data=1, model=2, devices=jax.devices()[:2])
  m = load_model(path, dtype="int4", mesh=mesh, load_tokenizer=False, progress=False)
  one = load_model(path, dtype="int4", load_tokenizer=False, progress=False)
  assert dtype_name(m.dtype) == "int4"
  layer = m.params["layers"][0]
  up, wo, down = layer["w_up"], layer["wo"], layer["w_down"]
  assert isinstance(up, GroupedInt4) and isinstance(m.params["embed"], GroupedInt4)
  # column-parallel w_up [F, D]: its outputs (codes' second axis) split; row-parallel wo [64,
  # 64]: its inputs (codes' first axis, 2 groups) split; w_down's 96 inputs are 3 groups, which
  # 2 devices do not divide: whole
  assert tuple(up.codes.sharding.spec) == tuple(up.scales.sharding.spec) == (None, "model")
  assert tuple(wo.codes.sharding.spec) == tuple(wo.scales.sharding.spec) == ("model", None)
  assert tuple(down.codes.sharding.spec) == (None, None)
  # the same values as one device's Q4_0 blocks
  np.testing.assert_array_equal(np.asarray(dequantize(up)),
                                np.asarray(dequantize(one.params["layers"][0]["w_up"])))
  out = Decoder(m.params, m.config, mesh=mesh).generate([[5, 9, 2, 5, 9, 2], [7]],
                                                       max_new_tokens=8)
  ref = Decoder(one.params, one.config).generate([[5, 9, 2, 5, 9, 2], [7]], max_new_tokens=8)
  assert out.tokens == ref.tokens


def test_a_split_of_fewer_groups_than_devices_leaves_the_inputs_whole():
  g = grouped_int4(jnp.ones((8, 64)))  # 2 groups of inputs
  mesh = make_mesh(data=1, model=4, devices=jax.devices()[:4])
  from jax.sharding import PartitionSpec as P
  assert grouped_specs(g, P(None, "model"), mesh) == (P(None, None), P(None, None))
  assert grouped_specs(g, P("model", None), mesh) == (P(None, "model"), P(None, "model"))


def test_bad_input_is_refused_in_one_line():
  with pytest.raises(BlockError, match=r"w_x: a Q4_0 group of 32 values does not divide its "
                                       r"rows \(shape \(8, 48\)\)"):
    grouped_int4(jnp.zeros((8, 48)), "w_x")
  with pytest.raises(BlockError, match="only a matrix of Q4_0 blocks repacks"):
    grouped_from_blocks(quantize(np.zeros((4, 32), np.float32), "Q8_0"))
  target = init_params(jax.random.key(0), QCFG, scale=0.3)
  with pytest.raises(ValueError, match="quantized blocks already"):
    quantize_grouped(quantize_grouped(target))


@pytest.mark.skipif(len(jax.devices()) < 2, reason="a mesh of two devices (the suite's CPU "
                    "has eight; a one-GPU machine has one)")
def test_blocks_on_a_mesh_are_refused_in_one_line():
  target = init_params(jax.random.key(0), QCFG, scale=0.3)
  mesh = make_mesh(data=1, model=2, devices=jax.devices()[:2])
  with pytest.raises(ValueError, match="GGUF blocks are a one-device option"):
    shard_params(quantize_blocks(target), QCFG, mesh)


@pytest.mark.parametrize("M,D,F", [(1, 512, 640), (8, 896, 1216), (5, 1024, 384),
                                   (3, 256, 4748)])
def test_the_tpu_kernel_computes_the_grouped_values(M, D, F):
  """The Pallas kernel in Pallas's interpreter: whole and partial column blocks, a width taken
  whole (896: its scales' block is every group) and in blocks of 512."""
  rng = np.random.default_rng(M + D)
  codes = jnp.asarray(rng.integers(-8, 8, (D, F)), jnp.int4)
  scales = jnp.asarray(rng.uniform(0.01, 0.1, (D // 32, F)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((M, D)), jnp.float32)
  want = np.asarray(x) @ np.asarray(grouped_in_out(GroupedInt4(codes, scales)))
  y = grouped_int4_tpu.grouped_matmul(x, codes, scales, interpret=True)
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-4)
  if M == 8:  # the shard_map form over 2 devices, split by outputs and by inputs
    mesh = make_mesh(data=1, model=2, devices=jax.devices()[:2])
    for split in ("out", "in"):
      ys = grouped_int4_tpu.grouped_matmul_sharded(x, codes, scales, mesh=mesh, split=split,
                                                   interpret=True)
      np.testing.assert_allclose(np.asarray(ys), want, rtol=1e-5, atol=1e-4)
  with pytest.raises(ValueError, match="do not fit"):
    grouped_int4_tpu.grouped_matmul(x, codes[:, :-1], scales, interpret=True)
  with pytest.raises(ValueError, match="outside the kernel"):
    grouped_int4_tpu.grouped_matmul(jnp.zeros((300, D)), codes, scales, interpret=True)


def widened_arrays(hlo: str, n: int) -> list[str]:
  """The float arrays of at least n elements an optimized HLO module computes (a weight of n
  values widened: XLA's own dot over grouped int4 widens [896, 4864] into bf16 [28,32,4864] at
  8 rows)."""
  out = []
  for dtype, dims in re.findall(r"= (bf16|f32|f16)\[([0-9,]+)\]", hlo):
    if int(np.prod([int(d) for d in dims.split(",")])) >= n:
      out.append(f"{dtype}[{dims}]")
  return out


@pytest.mark.integration  # compiles for TPU (.ci/run's second step)
@pytest.mark.parametrize("M", [1, 8])
def test_on_a_tpu_the_dot_never_widens_the_weight_in_hbm(M):
  """Deviceless v5e compiles of `linear` over grouped int4, one chip ([4096, 14336], and
  Qwen2.5-0.5B's [896, 4864] whose widened block XLA's own dot writes to HBM at 8 rows) and a
  2x2 slice (split by outputs, by inputs): the projection is the Pallas kernel, and no
  program buffer holds the weight widened."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from vocabjax.bench import tpu
  from vocabjax.testing.tpu_aot import lower_for_tpu, not_cached

  S = jax.ShapeDtypeStruct

  def f(x, codes, scales, split=None, mesh=None):
    return linear(x, GroupedInt4(codes, scales, split),
                  lowering=Lowering(platform="tpu", mesh=mesh))

  def check(compiled, D, F, chips=1):
    text = compiled.as_text()
    assert "tpu_custom_call" in text
    assert widened_arrays(text, D * F // chips) == []

  for D, F in ((4096, 14336), (896, 4864)):
    args = (S((1, M, D), jnp.bfloat16), S((D, F), jnp.int4), S((D // 32, F), jnp.float32))
    with not_cached():
      check(lower_for_tpu(f, *args, topology="v5e:1x1").compile(), D, F)
  mesh = tpu.tpu_mesh("v5e:2x2")
  for D, F, spec, split in ((896, 4864, (None, "model"), "out"),
                            (4864, 896, ("model", None), "in")):
    sh = NamedSharding(mesh, P(*spec))
    args = (S((1, M, D), jnp.bfloat16, sharding=NamedSharding(mesh, P())),
            S((D, F), jnp.int4, sharding=sh), S((D // 32, F), jnp.float32, sharding=sh))
    fn = jax.jit(lambda x, c, s, split=split: f(x, c, s, split, mesh))
    with not_cached(), jax.default_device(mesh.devices.flat[0]):
      check(fn.trace(*args).lower().compile(), D, F, chips=4)


def test_int4_loaded_for_an_accelerator_is_grouped_and_computes_in_bf16(tmp_path, monkeypatch):
  """`load_model(dtype="int4")` where JAX's backend is a GPU or TPU (the backend's name faked:
  this host has a CPU): the backend's bf16 weights quantized into grouped int4, norms in bf16
  (so activations and cache are bf16), the values of gguf's Q4_0 of those bf16 weights."""
  from vocabjax.checkpoints import loader

  path = save_tiny_variant("llama_mha", tmp_path / "m")
  monkeypatch.setattr(loader, "jax", type("Jax", (), {"default_backend": staticmethod(
      lambda: "tpu")}))
  m = load_model(path, dtype="int4", load_tokenizer=False, progress=False)
  assert dtype_name(m.dtype) == "int4"
  up = m.params["layers"][0]["w_up"]
  assert isinstance(up, GroupedInt4) and up.codes.dtype == jnp.int4
  assert m.params["final_norm"].dtype == jnp.bfloat16 and compute_dtype(m.params) == jnp.bfloat16
  # the tiny checkpoint is f32: the backend's bf16 load rounds it first; gguf's Q4_0 of those
  # rounded values is what the devices computed, bit for bit
  f32 = load_model(path, dtype="float32", load_tokenizer=False, progress=False)
  rounded = np.asarray(jnp.asarray(f32.params["layers"][0]["w_up"], jnp.bfloat16), np.float32)
  np.testing.assert_array_equal(np.asarray(dequantize(up)),
                                np.asarray(dequantize(quantize(rounded, "Q4_0"))))
