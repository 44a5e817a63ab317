"""The TPU matrix: every registered method's whole step (with each drafter vocabulary policy
where it applies) compiled for real TPUs on this CPU host (deviceless: libtpu's compiler,
`vocabjax.bench.tpu`) at the real vocabulary, on one chip of v5e, v6e and v5p and sharded over
a 4-chip slice of each (v5e:2x2, v6e:2x2, v5p:2x2x1, the model axis over the chips): the
decoders' own programs (`lower()`) with abstract weights placed on TPU chips, so Mosaic's checks
and XLA:TPU's compiler run on exactly what the decoders would run.
`tpu_projection.MATRIX_METHODS` and `tpu_projection.MATRIX_TOPOLOGIES` are the matrix; `python -m
vocabjax.bench tpu-matrix` compiles the same cells and writes their table
(kernels/results/tpu_matrix/, quoted in docs/tpu.md).

Shapes: layers of D=256 (4 heads, 2 KV heads of 64, F=512: `matrix_setup(narrow=True)`, a
third less compile time than Qwen2.5-0.5B's D=896 layers, which `bench tpu-matrix` records),
a 2-layer target and a 1-layer drafter, bf16, B=1, a 256-slot cache, Qwen's V=151936 for
every method (the
tree-shaped steps' drafting top-k runs in two stages on TPU, `Lowering.block_top_k`: 2-4 s a
program), crossvocab with a V=32000 llama drafter.

These tests need the `libtpu` package and fail (not skip) without it."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from vocabjax.bench import tpu
from vocabjax.bench import tpu_projection
from vocabjax.decoding.proposer import continuous_capable
from vocabjax.decoding.drafter import block_layout, fold_catch_up
from vocabjax.kernels import cpu_matmul
from vocabjax.lowering import Lowering, decoding_lowering
from vocabjax.testing.tpu_aot import libtpu_available

pytestmark = pytest.mark.integration  # compiles for TPU / GPU (.ci/run's second step)

S = 256


REAL_V = tpu_projection.matrix_setup(narrow=True)  # the matrix's models, narrow layers (module doc)


@pytest.fixture(scope="module")
def steps():
  """Compiled steps shared by this file's tests: (topology, method, sharded) -> TpuStep."""
  return {}


def _step(steps, topology, method, sharded=False, **kw):
  key = (topology, method, sharded)
  if key not in steps:
    mesh = tpu.tpu_mesh(topology) if sharded else None
    steps[key] = tpu.lower_step(method, REAL_V, topology=topology, S=S, mesh=mesh,
                                compile=True, **kw)
  return steps[key]


def test_libtpu_is_installed():
  assert libtpu_available(), "the TPU compile tests need the TPU compiler: `pip install libtpu`"


def test_the_matrix_holds_every_registered_method_and_generation():
  from vocabjax.methods import METHODS as REGISTRY

  kinds = {m.split("|")[0].split(":")[0] for m in tpu_projection.MATRIX_METHODS}
  # FR-Spec's and coverage-latency trimming's steps are VocabTrim's (a K-row subset)
  assert kinds == set(REGISTRY) - {"frspec", "covtrim"}
  gens = {t.split(":")[0] for t, _ in tpu_projection.MATRIX_TOPOLOGIES}
  assert gens == set(tpu.CHIPS) and {sh for _, sh in tpu_projection.MATRIX_TOPOLOGIES
                                    } == {True, False}
  assert len(tpu_projection.matrix_cells()) == (
      len(tpu_projection.MATRIX_METHODS) * len(tpu_projection.MATRIX_TOPOLOGIES) -
      len(tpu_projection.ONE_DEVICE) * 3)
  policies = {m.split(":")[0] for m in tpu_projection.MATRIX_METHODS if m.startswith((
      "vocabtrim", "specvocab", "microspec", "slimspec", "dynaspec", "evospec"))}
  assert policies == {"vocabtrim", "specvocab", "microspec", "slimspec", "dynaspec", "evospec"}


@pytest.mark.parametrize("topology", ["v5e:1x1", "v5e:2x2"])
def test_continuous_batching_hands_rows_over(topology):
  """Continuous batching's own program (`lower(programs=("put_row",))`: a one-row prefill's
  loop state written into row b of four) compiles for a v5e chip and for a v5e:2x2 slice
  (model-parallel: the state keeps its shardings) for every speculative method (the host-tree
  hybrids on one chip only; the one-row prefill is the matrix's prefill at B=1)."""
  import jax.numpy as jnp

  from vocabjax.sampling import SamplingParams

  sharded = topology != "v5e:1x1"
  chip = tpu.devices_of(topology)[0]
  mesh = tpu.tpu_mesh(topology) if sharded else None
  for method in tpu_projection.MATRIX_METHODS:
    if method == "ar" or (sharded and method.split(":")[0] in tpu_projection.ONE_DEVICE):
      continue  # plain decoding hands its cache row over (`put_cache_row`)
    dec = tpu.build_decoder(method, REAL_V, device=None if sharded else chip, mesh=mesh)
    with tpu.tpu_tracing(chip, mesh, "tpu"):
      prog = dec.lower(SamplingParams(), 4, 1, S, jnp.bfloat16, programs=("put_row",))[
          "put_row"]
    compiled = prog.compile()
    assert compiled.memory_analysis().argument_size_in_bytes > 0, method
    if sharded:  # the rows' state comes out placed as it went in
      outs = jax.tree.leaves(compiled.output_shardings)
      ins = jax.tree.leaves(compiled.input_shardings[0][0])
      dims = [len(x.shape) for x in jax.tree.leaves(prog.out_info)]
      assert len(outs) == len(ins) == len(dims) and all(
          o.is_equivalent_to(i, d) for o, i, d in zip(outs, ins, dims)), method


@pytest.mark.parametrize("method,topology,sharded", tpu_projection.matrix_cells())
def test_every_method_compiles_on_every_generation_and_slice(steps, method, topology, sharded):
  # lower_step raises AssertionError naming the method, program, topology and shapes
  step = _step(steps, topology, method, sharded)
  # every registered method batches continuously (`generate --rows` takes them all)
  assert (getattr(step.decoder, "proposer", None) is None
          or continuous_capable(step.decoder.proposer))
  row = tpu_projection.matrix_cell(method, REAL_V, topology, sharded, step=step)
  assert row["cpu_custom_calls"] == [], row  # no CPU-only custom call reaches a TPU program
  assert row["argument_bytes"] > 0 and row["temp_bytes"] < 1 << 30, row
  assert row["flops"] > 0 and row["bytes_accessed"] > 0, row
  # the donated KV caches come back in place (aliased), not as copies
  assert step.cache_bytes_per_chip() > 0 and row["alias_bytes"] > 0, row
  if sharded:
    assert dict(step.decoder.mesh.shape) == {"data": 1, "model": 4}
  # SpecVocab's ranked head holds the Mosaic kernel (impl auto: the TPU's branch), on a
  # drafter or a DFlash drafter's head, and so does MicroSpec's in-context head on one chip (on
  # a slice its rows are XLA's partitioned gather), and DynaSpec's shortlist head likewise; no
  # other step does
  assert (row["mosaic_calls"] > 0) == (method.startswith("specvocab") or "ranker=" in method or (
      method.startswith(("microspec", "dynaspec", "evospec")) and not sharded)), row


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
  """The engine's prefill programs: the target's prompt prefill (plain decoding's program), the
  drafter's into its cache (every proposer over the drafter's) and the chain's state from
  them, each donating and aliasing the caches it fills."""
  step = tpu.lower_step("chain:gamma=3", REAL_V, topology="v5e:1x1", S=S, T=64, prefill=True)
  names = ("target_prefill", "cache_prefill", "prefill")
  assert step.decoder.prefill_programs == names
  step.compile(list(names))
  alias = {}
  for name in names:
    assert "tpu_custom_call" not in step.programs[name].text
    alias[name] = step.programs[name].compiled.memory_analysis().alias_size_in_bytes
  target_bytes, draft_bytes = (tpu.cache_bytes(c) for c in step.caches)
  assert alias["target_prefill"] >= target_bytes > 0
  assert alias["cache_prefill"] >= draft_bytes > 0
  assert alias["prefill"] >= step.cache_bytes_per_chip() == target_bytes + draft_bytes


# --- sharded over 4 chips -----------------------------------------------------------------

@pytest.mark.parametrize("method", ["ar", "chain:gamma=3", "eagle:top_k=2,depth=2,total_tokens=4"])
def test_sharded_steps_split_the_target_over_the_chips(steps, method):
  step = _step(steps, "v5e:2x2", method, sharded=True)
  mesh = step.decoder.mesh
  assert dict(mesh.shape) == {"data": 1, "model": 4}
  params = step.decoder.params if method == "ar" else step.decoder.target_params
  # the target is tensor-parallel: its MLP and vocabulary split over the 4 chips
  assert params["layers"][0]["w_up"].sharding.spec == P("model", None)
  assert params["embed"].sharding.spec == P("model", None)
  full = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  per_chip = step.programs["step"].compiled.memory_analysis().argument_size_in_bytes
  unsharded = _step(steps, "v5e:1x1", method)
  one_chip = unsharded.programs["step"].compiled.memory_analysis().argument_size_in_bytes
  assert per_chip < 0.6 * one_chip and full <= one_chip, (per_chip, one_chip, full)
  assert tpu.cpu_custom_calls(step.programs["step"].text) == []


@pytest.mark.parametrize("method", ["chain:gamma=3", "eagle:top_k=2,depth=2,total_tokens=4"])
def test_sharded_prefills_compile_with_the_target_split(method):
  """On a v5e:2x2 slice the prefill programs (the target's, shared with plain decoding, with
  the features an EAGLE head reads; a drafter's into its cache; the loop state from them)
  compile partitioned, each chip holding a share of the target's weights."""
  step = tpu.lower_step(method, REAL_V, topology="v5e:2x2", S=S, T=64,
                        mesh=tpu.tpu_mesh("v5e:2x2"), prefill=True, compile=True)
  names = step.decoder.prefill_programs
  assert names[0] == "target_prefill" and names[-1] == "prefill"
  assert ("cache_prefill" in names) == method.startswith("chain")
  for name in names:
    assert tpu.cpu_custom_calls(step.programs[name].text) == [], name
  one = tpu.lower_step(method, REAL_V, topology="v5e:1x1", S=S, T=64, prefill=True,
                       compile=True)
  args = [x.programs["target_prefill"].compiled.memory_analysis().argument_size_in_bytes
          for x in (step, one)]
  assert args[0] < 0.6 * args[1], args


def test_specvocab_kernel_step_on_a_slice_runs_the_kernel_under_shard_map(steps):
  """SpecVocab's Pallas head on a v5e:2x2 slice: the indexed head runs under shard_map over
  the vocabulary-split LM head (`indexed_lm_head_sharded`; before: refused, Mosaic kernels are
  not partitioned by GSPMD), the step compiles with the Mosaic call in it, and each chip holds
  a share of the weights (the one-chip step's arguments hold them all)."""
  step = _step(steps, "v5e:2x2", "specvocab:k=2048,gamma=3", sharded=True)
  prog = step.programs["step"]
  assert "tpu_custom_call" in prog.text
  assert tpu.cpu_custom_calls(prog.text) == []
  per_chip = prog.compiled.memory_analysis().argument_size_in_bytes
  one_chip = _step(steps, "v5e:1x1", "specvocab:k=2048,gamma=3").programs["step"].compiled \
      .memory_analysis().argument_size_in_bytes
  assert per_chip < 0.6 * one_chip, (per_chip, one_chip)


@pytest.mark.parametrize("policy", ["microspec;core=512;window=2560", "dynaspec;top=4",
                                    "slimspec", "evospec;base=8192;window=1024"])
def test_an_eagle_head_compiles_under_each_newer_policy(steps, policy):
  """An EAGLE head over the target's full LM head, restricted by each newer policy (`bench
  tpu`'s `|policy=` settings, what the papers' projection uses), on one v5e chip: the step
  compiles with the head's rows read by the policy, not the whole head."""
  method = f"eagle:top_k=2,depth=2,total_tokens=4,lm_head=target|policy={policy}"
  step = _step(steps, "v5e:1x1", method)
  full = _step(steps, "v5e:1x1", "eagle:top_k=2,depth=2,total_tokens=4,lm_head=target")
  assert tpu.cpu_custom_calls(step.programs["step"].text) == []
  assert type(step.decoder.proposer.draft_vocab).__name__ in (
      "InContextVocab", "ClusteredVocab", "LowRankHead")
  # the policy's head is cheaper than the full head's V x D per drafting call
  assert (tpu._cost(step.programs["step"].compiled)["flops"]
          < tpu._cost(full.programs["step"].compiled)["flops"])


def test_unknown_method_and_topology_are_value_errors_naming_them():
  with pytest.raises(ValueError, match="unknown method 'tree_k4'"):
    tpu.lower_step("tree_k4", REAL_V)
  with pytest.raises(ValueError, match="unknown TPU topology 'v9z:1x1'"):
    tpu.lower_step("ar", REAL_V, topology="v9z:1x1")


QUANTIZED_V = {w: dataclasses.replace(REAL_V, weights=w) for w in ("int8", "int4")}


@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("method", tpu_projection.QUANTIZED_METHODS)
@pytest.mark.parametrize("topology,sharded", tpu_projection.MATRIX_TOPOLOGIES)
def test_quantized_weights_compile_on_every_generation_and_slice(method, topology, sharded,
                                                                 weights):
  """Weight-only int8 and grouped int4 target and drafter (`Setup.weights`): each step compiles
  on one chip and on a slice of every generation, its arguments hold the int8 matrices and
  their scales, or the int4 codes and group scales (split as the rows on a slice), and XLA's
  HBM count of plain decoding's step stays within 1.2x of what it must read (no widened copy
  of a weight, no relayout of an int8 embedding for its lookups). int4's projections run the
  grouped-int4 Pallas kernel (`kernels.grouped_int4_tpu`, under shard_map on a slice), whose
  reads XLA's count does not see: its steps hold the kernel's calls instead."""
  import numpy as np

  from vocabjax.kernels.blocks import GroupedInt4

  setup = QUANTIZED_V[weights]
  mesh = tpu.tpu_mesh(topology) if sharded else None
  step = tpu.lower_step(method, setup, topology=topology, S=S, mesh=mesh, compile=True,
                        costs=True)
  row = tpu_projection.matrix_cell(method, setup, topology, sharded, step=step)
  assert row["cpu_custom_calls"] == [] and row["flops"] > 0, row
  params = getattr(step.decoder, "params", None) or step.decoder.target_params
  up = params["layers"][0]["w_up"]
  if weights == "int8":
    assert up.dtype == np.int8 and "w_up_scale" in params["layers"][0]
    if sharded:
      assert up.sharding.spec == P("model", None)
      assert params["layers"][0]["w_up_scale"].sharding.spec == P("model")
  else:
    assert isinstance(up, GroupedInt4) and up.codes.dtype == jnp.int4
    assert up.scales.dtype == jnp.float32
    if sharded:  # codes [D, F]: a column-parallel matrix splits its outputs
      assert up.codes.sharding.spec == P(None, "model")
      assert up.scales.sharding.spec == P(None, "model")
    text = "".join(step.programs[n].text for n in step.step_programs)
    assert text.count("tpu_custom_call") >= setup.target.num_layers * 7, text.count(
        "tpu_custom_call")
  if method == "ar" and weights == "int8":  # plain decoding reads each matrix once (a tree's
    # and a chain's ratios at these narrow layers: test_tpu_projection's HBM test)
    with tpu.tpu_tracing(None, mesh):
      hbm = step.hbm_costs()["bytes_accessed"]
    ratio = hbm / tpu_projection.stream_bytes(tpu_projection.method_spec(method), step)
    assert 0.8 < ratio <= 1.2, (topology, ratio)
