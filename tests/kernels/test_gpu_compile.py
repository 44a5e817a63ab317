"""The GPU side compiled on this CPU host for Hopper GPUs (deviceless: XLA:GPU and Triton of
JAX's CUDA plugin, `vocabjax.testing.gpu_aot`): the Triton indexed-LM-head kernel at every
configuration the shipped dispatch table would run on an H100 or H200, a tile that overflows
shared memory refused by name, and whole decoding steps compiled for a GPU with no widened
table in them (what a recorded H200 exactness run could not tell apart).

These tests need the plugin (`python -m vocabjax.testing.gpu_aot install`, which the README's
test setup runs) and fail, not skip, without it."""

import jax
import jax.numpy as jnp
import pytest

from vocabjax.kernels import dispatch
from vocabjax.kernels.indexed_lm_head_gpu import indexed_lm_head_gpu
from vocabjax.testing import gpu_aot
from vocabjax.testing.hlo import materialized

pytestmark = pytest.mark.integration  # compiles for TPU / GPU (.ci/run's second step)

TRITON = "__gpu$xla.gpu.triton"


def test_the_plugin_is_installed(capsys):
  assert gpu_aot.plugin_installed(), ("the GPU compile tests need JAX's CUDA plugin: "
                                      "`python -m vocabjax.testing.gpu_aot install`")
  assert gpu_aot.main(["install"]) == 0  # installed: a no-op that says where
  assert str(gpu_aot.plugin_dir()) in capsys.readouterr().out


def test_each_target_is_a_hopper_gpu_of_its_kind():
  for target, kind in (("h100", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200")):
    (dev,) = gpu_aot.gpu_devices(target)
    assert dev.device_kind == kind == gpu_aot.device_kind(target)
  assert jax.devices()[0].platform == "cpu"  # the plugin is no backend of this process
  with pytest.raises(ValueError, match="unknown GPU target 'a100'.*'h100', 'h200'"):
    gpu_aot.gpu_devices("a100")


def _args(B, D, V, K):
  return (jax.ShapeDtypeStruct((B, D), jnp.bfloat16), jax.ShapeDtypeStruct((V, D), jnp.bfloat16),
          jax.ShapeDtypeStruct((B, K), jnp.int32))


@pytest.mark.parametrize("target", ["h100", "h200"])
def test_the_kernel_compiles_at_every_configuration_the_table_ships(target):
  """Every (shape, configuration) the dispatch table holds for this GPU, as measured there:
  Triton compiles it for sm_90 within the shared memory (a jax or Triton upgrade that breaks
  the kernel fails here, not on the next lent GPU)."""
  kind = gpu_aot.device_kind(target)
  entries = [e for e in dispatch.load_table() if e["device_kind"] == kind]
  assert entries, f"the shipped table has no entries for {kind}"
  for e in entries:
    fn = lambda h, U, i, c=e["config"]: indexed_lm_head_gpu(h, U, i, **c)  # noqa: E731
    compiled = gpu_aot.compile_for_gpu(fn, *_args(e["B"], e["D"], e["V"], e["K"]),
                                       target=target, name=f"kernel {e['config']}")
    assert TRITON in compiled.as_text(), e


def test_a_tile_over_the_shared_memory_is_refused_naming_it():
  """A lent H200 met this (block_k 64, block_d 512, 6 stages: 405 KB of 227 KB)."""
  fn = lambda h, U, i: indexed_lm_head_gpu(h, U, i, variant="dot", block_k=64,  # noqa: E731
                                           block_d=512, num_stages=6)
  with pytest.raises(AssertionError) as e:
    gpu_aot.compile_for_gpu(fn, *_args(10, 4096, 151936, 2048), target="h200", name="big tile")
  msg = str(e.value)
  assert "big tile does not compile for GPU h200 (NVIDIA H200)" in msg, msg
  assert "bfloat16[10, 4096], bfloat16[151936, 4096], int32[10, 2048]" in msg, msg
  assert "Shared memory size limit exceeded" in msg, msg


@pytest.mark.parametrize("method", ["chain_g3", "eagle_k2d3n6", "sv16_g3_gpu", "medusa_h3k2",
                                    "pld_g4", "vocabtrim_k32_g3"])
def test_decoding_steps_compile_for_a_gpu_and_widen_no_table(method):
  """The tests' tiny bf16 pair (V = 64, D = 32), the decoder's own step compiled by XLA:GPU:
  no f32 [V, D] array in it (the checks the GPU exactness run applies), and no CPU kernel.
  SpecVocab's chain with impl="gpu" carries the Triton indexed head inside its drafting loop."""
  from tests.helpers.models import CFG
  from vocabjax.bench import tpu
  from vocabjax.bench import stand_ins

  setup = stand_ins.Setup(CFG, CFG, head_vocab=32, head_intermediate=48, ranker_rank=8)
  step = tpu.lower_step(method, setup, topology="gpu:h100", S=128, T=16, compile=True)
  assert step.step_programs
  for name in step.step_programs:
    text = step.programs[name].compiled.as_text()
    assert not materialized(text, (CFG.vocab_size, CFG.hidden_size), "f32"), (method, name)
    assert not tpu.cpu_custom_calls(text), (method, name)
    assert (TRITON in text) == method.endswith("_gpu"), (method, name)
