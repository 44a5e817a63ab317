"""Deviceless TPU compilation of the indexed LM head: libtpu's compiler runs on this CPU host for
v5e, v6e and v5p topologies, so Mosaic's real checks (tile-aligned slices and DMAs, VMEM budget,
MXU products in bf16 and f32) run in CI without a TPU. Lowering alone (the tests in
test_indexed_lm_head.py) does not run them: the old kernel lowered fine and failed here in bf16.

These tests need the `libtpu` package and fail (not skip) without it."""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from vocabjax.kernels.indexed_lm_head import indexed_lm_head, indexed_lm_head_tpu
from vocabjax.testing.tpu_aot import compile_for_tpu, libtpu_available, lower_for_tpu, tpu_devices

pytestmark = pytest.mark.integration  # compiles for TPU / GPU (.ci/run's second step)

GENERATIONS = ["v5e:1x1", "v6e:1x1", "v5p:1x1x1"]
V = 151936  # Qwen2.5's vocabulary (SpecVocab's targets)

# SpecVocab's shapes, B in {1, 10, 16}, K in {128, 1000, 2048, 8192}, D in {896, 2560, 4096}:
# every (B, K) pair once, each (D, dtype) twice, instead of all 72 combinations per generation
# (each compile takes ~0.2 s; this keeps the file well under a minute).
CASES = [(1, 128, 896, jnp.float32), (1, 1000, 2560, jnp.bfloat16),
         (1, 2048, 4096, jnp.float32), (1, 8192, 4096, jnp.bfloat16),
         (10, 128, 2560, jnp.float32), (10, 1000, 896, jnp.bfloat16),
         (10, 2048, 896, jnp.bfloat16),  # SpecVocab's main setting (Qwen2.5-0.5B's head)
         (10, 8192, 2560, jnp.float32), (16, 128, 4096, jnp.bfloat16),
         (16, 1000, 4096, jnp.float32), (16, 2048, 2560, jnp.bfloat16),
         (16, 8192, 896, jnp.float32)]


def _structs(B, K, D, dtype, vocab=V):
  return (jax.ShapeDtypeStruct((B, D), dtype), jax.ShapeDtypeStruct((vocab, D), dtype),
          jax.ShapeDtypeStruct((B, K), jnp.int32))


def _case_id(case):
  B, K, D, dtype = case
  return f"B{B}-K{K}-D{D}-{jnp.dtype(dtype).name}"


def test_libtpu_is_installed():
  assert libtpu_available(), "the TPU compile tests need the TPU compiler: `pip install libtpu`"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("topology", GENERATIONS)
def test_tpu_kernel_compiles(topology, case):
  B, K, D, dtype = case
  compiled = compile_for_tpu(indexed_lm_head_tpu, *_structs(B, K, D, dtype), topology=topology,
                             name=f"indexed_lm_head_tpu[{_case_id(case)}]")
  # no XLA-side copy of U (reshaping the [V, D] table relayouts all of it, V*D bytes per call,
  # the traffic the kernel is there to avoid) and no lane-padded intermediate of the logits:
  # the temporaries stay within a few copies of h[B, D] and of the kernel's output
  # f32[B, P*Kp] (P rows per 32-bit word; B padded to 8 sublanes; v5p keeps the most)
  P, B8 = 4 // jnp.dtype(dtype).itemsize, -(-B // 8) * 8
  small = B8 * D * 4 + B8 * P * (-(-K // 256) * 256) * 4
  temp = compiled.memory_analysis().temp_size_in_bytes
  assert temp <= 4 * small, f"{temp} bytes of XLA temporaries (h and the logits: {small})"


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_tpu_kernel_compiles_with_odd_vocab_and_block_512(dtype):
  # V odd: bf16's last row has no pair partner and goes through the XLA tail path
  f = functools.partial(indexed_lm_head_tpu, block_k=512)
  compile_for_tpu(f, *_structs(10, 1000, 896, dtype, vocab=V - 1), name="block_k=512, V odd")


@pytest.mark.parametrize("topology", GENERATIONS)
def test_dispatcher_picks_the_tpu_kernel_when_compiled_for_tpu(topology):
  structs = _structs(10, 2048, 896, jnp.bfloat16)
  text = lower_for_tpu(indexed_lm_head, *structs, topology=topology).as_text()
  assert "tpu_custom_call" in text  # platform_dependent chose the Mosaic branch
  compile_for_tpu(indexed_lm_head, *structs, topology=topology,
                  name="indexed_lm_head(impl='auto')")


def _misaligned_toy(x_hbm_ref, o_ref, buf, sem):
  # one row DMA'd from/to a dynamic row: bf16 packs two rows per 32-bit word, so Mosaic cannot
  # prove the slices aligned and refuses them (the old kernel's bug); f32 rows are whole words
  from jax.experimental.pallas import tpu as pltpu

  r = pl.program_id(0) + 1
  copy = pltpu.make_async_copy(x_hbm_ref.at[pl.ds(r, 1)], buf.at[pl.ds(r, 1)], sem)
  copy.start()
  copy.wait()
  o_ref[...] = buf[...].astype(jnp.float32)


def _toy(x):  # x[64, 256]
  from jax.experimental.pallas import tpu as pltpu

  return pl.pallas_call(
      _misaligned_toy, grid=(2,),
      in_specs=[pl.BlockSpec(memory_space=pltpu.MemorySpace.HBM)],
      out_specs=pl.BlockSpec((64, 256), lambda i: (0, 0)),
      out_shape=jax.ShapeDtypeStruct((64, 256), jnp.float32),
      scratch_shapes=[pltpu.VMEM((64, 256), x.dtype), pltpu.SemaphoreType.DMA(())])(x)


def test_compile_check_reports_mosaic_errors_with_name_and_shapes():
  with pytest.raises(AssertionError) as err:
    compile_for_tpu(_toy, jax.ShapeDtypeStruct((64, 256), jnp.bfloat16), name="misaligned_toy")
  msg = str(err.value)
  assert "misaligned_toy does not compile for TPU v5e:1x1" in msg
  assert "bfloat16[64, 256]" in msg
  assert "aligned" in msg and "Mosaic" in msg  # the first lines of Mosaic's own message
  # the same kernel in f32 (one row per word) compiles: the check is not failing everything
  compile_for_tpu(_toy, jax.ShapeDtypeStruct((64, 256), jnp.float32), name="aligned_toy")


def test_unknown_topology_is_a_value_error_naming_it():
  with pytest.raises(ValueError, match="unknown TPU topology 'v9z:1x1'"):
    tpu_devices("v9z:1x1")
  assert tpu_devices("v5e:1x1")[0].device_kind == "TPU v5 lite"


def test_deviceless_compiles_stay_out_of_the_persistent_compilation_cache(tmp_path):
  """With JAX's persistent cache on (the suite's), a CPU program is stored and a deviceless TPU
  one is not (it could not be loaded back: no TPU client; every later run warned and compiled
  it again)."""
  import os
  import subprocess
  import sys

  code = ("import os, jax, jax.numpy as jnp\n"
          "from vocabjax.testing.tpu_aot import compile_for_tpu\n"
          "jax.jit(lambda x: x * 2)(jnp.ones(3))\n"
          "before = set(os.listdir(os.environ['JAX_COMPILATION_CACHE_DIR']))\n"
          "def tpu_only(x):\n  return x * 3 + 1\n"
          "compile_for_tpu(tpu_only, jax.ShapeDtypeStruct((8, 128), jnp.float32))\n"
          "after = set(os.listdir(os.environ['JAX_COMPILATION_CACHE_DIR']))\n"
          "print(len(before), sorted(after - before))\n")
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  stored, new = out.stdout.strip().splitlines()[-1].split(" ", 1)
  assert int(stored) >= 1 and new == "[]", out.stdout
