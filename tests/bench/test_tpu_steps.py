"""Every decoding method's whole step compiled for real TPUs on this CPU host (deviceless:
libtpu's compiler, `vocabjax.bench.tpu`): the decoders' own step functions with abstract
weights placed on TPU chips, so Mosaic's checks and XLA:TPU's compiler run on exactly what the
decoders would run on v5e and v6e, and sharded over a 4-chip v5e mesh (model axis over 4).

Shapes: Qwen2.5-0.5B's layers (D=896, 14 heads, 2 KV heads of 64, F=4864), a 2-layer target
and a 1-layer drafter, bf16, B=1, a 256-slot cache. The vocabulary is Qwen's V=151936 for the
chain-like methods (plain, chain, PLD, VocabTrim, SpecVocab's Pallas head over the real [V, D]
table, crossvocab with a V=32000 llama drafter); the tree-shaped methods (tree, EAGLE, Medusa)
use V=4096 because XLA:TPU takes 13-16 s to compile one top_k over a [B, k, V] operand at
V >= 8192 (0.9 s at V=4096; a 2-D [k, V] one takes 0.7 s at V=151936), which those steps run
per tree level or head: the real V would add about 15 s per compiled program here.

These tests need the `libtpu` package and fail (not skip) without it."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from vocabjax.bench import tpu
from vocabjax.decoding.speculative import block_layout, fold_catch_up
from vocabjax.kernels import cpu_matmul
from vocabjax.lowering import Lowering, decoding_lowering
from vocabjax.models import LlamaLikeConfig
from vocabjax.testing.tpu_aot import libtpu_available

GENERATIONS = ["v5e:1x1", "v6e:1x1"]
S = 256


def qwen2(V: int, L: int) -> LlamaLikeConfig:
  return LlamaLikeConfig(arch="qwen2", vocab_size=V, hidden_size=896, intermediate_size=4864,
                         num_layers=L, num_heads=14, num_kv_heads=2, head_dim=64,
                         attention_bias=True, tie_word_embeddings=True,
                         max_position_embeddings=32768)


CROSS = LlamaLikeConfig(arch="llama", vocab_size=32000, hidden_size=512, intermediate_size=1536,
                        num_layers=1, num_heads=8, num_kv_heads=2, head_dim=64)
REAL_V = tpu.Setup(qwen2(151936, 2), qwen2(151936, 1), cross_draft=CROSS)
SMALL_V = tpu.Setup(qwen2(4096, 2), qwen2(4096, 1), head_vocab=2048)  # module doc: top_k
SETUPS = {"ar": REAL_V, "chain_g3": REAL_V, "pld_g4": REAL_V, "vocabtrim_k8192_g3": REAL_V,
          "sv2048_g3_tpu": REAL_V, "crossvocab_g4": REAL_V, "tree_k4d4n16": SMALL_V,
          "eagle_k1d4": SMALL_V, "eagle_k4d4n16": SMALL_V, "medusa_h3k2": SMALL_V}


@pytest.fixture(scope="module")
def steps():
  """Compiled steps shared by this file's tests: (topology, method, sharded) -> TpuStep."""
  return {}


def _step(steps, topology, method, sharded=False, **kw):
  key = (topology, method, sharded)
  if key not in steps:
    mesh = tpu.tpu_mesh(topology) if sharded else None
    steps[key] = tpu.lower_step(method, SETUPS[method], topology=topology, S=S, mesh=mesh,
                                compile=True, **kw)
  return steps[key]


def test_libtpu_is_installed():
  assert libtpu_available(), "the TPU compile tests need the TPU compiler: `pip install libtpu`"


def test_every_default_method_is_compiled_here():
  assert set(SETUPS) == set(tpu.METHODS)


# Every method for v5e; for v6e the SpecVocab step whose Pallas kernel Mosaic checks per TPU
# generation, and the trimmed head its test compares with. The other steps are plain XLA:TPU
# programs: what v5e compiles v6e compiles (the v6e chain, tree and plain steps were dropped
# in session 38: ~16 s of a 2-core run that checked the same XLA ops for another target).
V6E_METHODS = ("sv2048_g3_tpu", "vocabtrim_k8192_g3")
CASES = ([("v5e:1x1", m) for m in tpu.METHODS]
         + [("v6e:1x1", m) for m in tpu.METHODS if m in V6E_METHODS])


@pytest.mark.parametrize("topology,method", CASES)
def test_every_method_compiles(steps, topology, method):
  # lower_step raises AssertionError naming the method, program, topology and shapes
  step = _step(steps, topology, method)
  for name in step.step_programs:
    prog = step.programs[name]
    assert prog.compiled is not None, name
    # no CPU-only custom call (the C++ matmul kernel) may reach a TPU program
    assert tpu.cpu_custom_calls(prog.text) == [], (method, name)
    mem = prog.compiled.memory_analysis()
    assert mem.argument_size_in_bytes > 0 and mem.temp_size_in_bytes < 1 << 30, (method, name)
  # the donated KV caches come back in place (aliased), not as copies
  assert step.cache_bytes_per_chip() > 0
  main = step.programs[step.step_programs[-1]].compiled.memory_analysis()
  assert main.alias_size_in_bytes > 0, method


@pytest.mark.parametrize("topology", GENERATIONS)
def test_specvocab_tpu_step_holds_the_pallas_kernel(steps, topology):
  step = _step(steps, topology, "sv2048_g3_tpu")
  text = step.programs["step"].text
  assert "tpu_custom_call" in text  # the Mosaic kernel (impl="tpu"), not XLA's gather
  # and no other method's step holds one
  assert "tpu_custom_call" not in _step(steps, topology, "vocabtrim_k8192_g3").programs[
      "step"].text


def test_tpu_tracing_builds_decoders_for_a_tpu_and_nothing_reads_the_backend_while_tracing():
  import jax.numpy as jnp

  from vocabjax.lowering import with_lowering

  x = jax.ShapeDtypeStruct((2, 896), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((64, 896), jnp.bfloat16)
  on_cpu_lw = decoding_lowering(mesh=False)
  with tpu.tpu_tracing():
    assert block_layout() == "out_in" and fold_catch_up()
    lw = decoding_lowering(mesh=False)  # what decoders built inside lower with
  assert lw.platform == "tpu" and not lw.cpu_kernel and lw.block_top_k
  assert on_cpu_lw.platform == "cpu" and jax.default_backend() == "cpu"  # nothing patched

  def lowered(lowering, platforms=None):  # a fresh function per trace
    fn = jax.jit(lambda x, w: cpu_matmul.linear(x, w, lowering=lowering))
    return fn.trace(x, w).lower(lowering_platforms=platforms).as_text()

  on_cpu, on_tpu = lowered(on_cpu_lw), lowered(lw)
  if on_cpu_lw.cpu_kernel and cpu_matmul.available():  # the check is not vacuous here
    assert tpu.cpu_custom_calls(on_cpu), on_cpu[:2000]
    # untagged (platform ""): decided where it lowers, the CPU's kernel for a CPU only
    assert tpu.cpu_custom_calls(lowered(Lowering()))
  assert tpu.cpu_custom_calls(on_tpu) == []
  assert tpu.cpu_custom_calls(lowered(Lowering(), ("tpu",))) == []
  # the weight stays bf16 into the dot (XLA:CPU's path widens it to f32 first)
  assert "tensor<64x896xf32>" not in on_tpu and "tensor<64x896xbf16>" in on_tpu
  assert with_lowering({}, lw)["lowering"].platform == "tpu"


def test_chain_prefill_compiles():
  """The engine's one prefill program: the target's prompt prefill and the drafter's, both
  caches donated and aliased."""
  step = tpu.lower_step("chain_g3", REAL_V, topology="v5e:1x1", S=S, T=64, prefill=True)
  assert step.decoder.prefill_programs == ("prefill",)
  step.compile(["prefill"])
  assert "tpu_custom_call" not in step.programs["prefill"].text
  mem = step.programs["prefill"].compiled.memory_analysis()
  assert mem.alias_size_in_bytes >= step.cache_bytes_per_chip() > 0


# --- sharded over 4 chips -----------------------------------------------------------------

@pytest.mark.parametrize("method", ["ar", "chain_g3", "eagle_k4d4n16"])
def test_sharded_steps_compile_on_a_4_chip_mesh(steps, method):
  step = _step(steps, "v5e:2x2", method, sharded=True)
  mesh = step.decoder.mesh
  assert dict(mesh.shape) == {"data": 1, "model": 4}
  params = step.decoder.params if method == "ar" else step.decoder.tp
  # the target is tensor-parallel: its MLP and vocabulary split over the 4 chips
  assert params["layers"][0]["w_up"].sharding.spec == P("model", None)
  assert params["embed"].sharding.spec == P("model", None)
  full = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  per_chip = step.programs["step"].compiled.memory_analysis().argument_size_in_bytes
  unsharded = _step(steps, "v5e:1x1", method)
  one_chip = unsharded.programs["step"].compiled.memory_analysis().argument_size_in_bytes
  assert per_chip < 0.6 * one_chip and full <= one_chip, (per_chip, one_chip, full)
  assert tpu.cpu_custom_calls(step.programs["step"].text) == []


def test_specvocab_kernel_step_on_a_slice_runs_the_kernel_under_shard_map(steps):
  """SpecVocab's Pallas head on a v5e:2x2 slice: the indexed head runs under shard_map over
  the vocabulary-split LM head (`indexed_lm_head_sharded`; before: refused, Mosaic kernels are
  not partitioned by GSPMD), the step compiles with the Mosaic call in it, and each chip holds
  a share of the weights (the one-chip step's arguments hold them all)."""
  step = _step(steps, "v5e:2x2", "sv2048_g3_tpu", sharded=True)
  prog = step.programs["step"]
  assert "tpu_custom_call" in prog.text
  assert tpu.cpu_custom_calls(prog.text) == []
  per_chip = prog.compiled.memory_analysis().argument_size_in_bytes
  one_chip = _step(steps, "v5e:1x1", "sv2048_g3_tpu").programs["step"].compiled \
      .memory_analysis().argument_size_in_bytes
  assert per_chip < 0.6 * one_chip, (per_chip, one_chip)


def test_unknown_method_and_topology_are_value_errors_naming_them():
  with pytest.raises(ValueError, match="unknown method 'tree_k4'"):
    tpu.lower_step("tree_k4", REAL_V)
  with pytest.raises(ValueError, match="unknown TPU topology 'v9z:1x1'"):
    tpu.lower_step("ar", REAL_V, topology="v9z:1x1")
