"""Random GGUF blocks of every kept type (valid scales, random codes) and their reference values."""

from __future__ import annotations

import numpy as np

from vocabjax.kernels.blocks import BLOCK_TYPES

# byte offsets of each type's float16 fields within a block
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
              "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


# the largest |code x sub-block scale| of each type: a value is about d times that
CODE_RANGE = {"Q8_0": 127, "Q4_0": 8, "Q4_1": 15, "Q5_0": 16, "Q5_1": 31, "Q4_K": 63 * 15, "Q5_K": 63 * 31,
              "Q6_K": 127 * 32}


def random_blocks(qtype: str, rows: int, cols: int, seed: int = 0, scale: float = 0.05
                  ) -> np.ndarray:
  """[rows, row bytes] uint8: random codes and sub-block scales, finite float16 scales (either
  sign; the K types' minimums' scale positive) such that values stay within about `scale`."""
  t = BLOCK_TYPES[qtype]
  rng = np.random.default_rng(seed)
  blocks = rng.integers(0, 256, (rows, cols // t.values, t.bytes), dtype=np.uint8)
  for off in F16_FIELDS[qtype]:
    d = rng.uniform(0.25, 1.0, blocks.shape[:2]) * scale / CODE_RANGE[qtype]
    if off == 0 and qtype not in ("Q4_K", "Q5_K"):
      d = d * rng.choice([-1.0, 1.0], blocks.shape[:2])
    if off == 2 and qtype in ("Q4_1", "Q5_1"):  # the minimum, added
      d = -d * CODE_RANGE[qtype] / 2
    elif off == 2:  # dmin: minimums d_min x (6-bit m), subtracted
      d = d * CODE_RANGE[qtype] / 2 / 63
    blocks[:, :, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(*blocks.shape[:2], 2)
  return blocks.reshape(rows, -1)


def reference(data: np.ndarray, qtype: str) -> np.ndarray:
  """gguf's own dequantization of [rows, row bytes] -> f32 [rows, cols]."""
  import gguf

  return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]).astype(np.float32)


def to_blocks(params: dict, qtype: str) -> tuple[dict, dict]:
  """(params with every weight matrix as `qtype` blocks, the same model in f32: each matrix
  the blocks' dequantized values): a GGUF file's model and its f32 twin, without a file."""
  import jax.numpy as jnp

  from vocabjax.kernels.blocks import from_numpy
  from vocabjax.testing.tiny import quantize_blocks

  def one(w):
    b = quantize_blocks(np.asarray(w, np.float32), qtype)
    return from_numpy(b, qtype, w.shape[1]), jnp.asarray(reference(b, qtype))

  blocks, dense = dict(params), dict(params)
  for name in ("embed", "lm_head"):
    if name in params:
      blocks[name], dense[name] = one(params[name])
  blocks["layers"], dense["layers"] = [], []
  for layer in params["layers"]:
    lb, ld = dict(layer), dict(layer)
    for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
      lb[name], ld[name] = one(layer[name])
    blocks["layers"].append(lb)
    dense["layers"].append(ld)
  return blocks, dense


def builds_agree(tmp_path, code: str) -> None:
  """Run `code` (Python that saves a dict of arrays with np.savez to sys.argv[1]) once per
  build of the CPU kernel: native, AVX2 (`x86-64-v3`), portable (`x86-64`) and, on a host with
  AVX-512BW, `skylake-avx512` (512-bit integer rows without VNNI), on a host with AVX-VNNI,
  `alderlake` (256-bit rows with AVX-VNNI's dot products and no AVX-512), each in its own
  process (one library per process) and cache; every array equal to the native build's, bit
  for bit."""
  import os
  import subprocess
  import sys

  from vocabjax.kernels.cpu_matmul import cpuinfo

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  results = []
  marches = ["native", "x86-64-v3", "x86-64"]
  flags = cpuinfo().get("flags", "").split()
  if "avx512bw" in flags:  # AVX-512 without VNNI's dot products
    marches.append("skylake-avx512")
  if "avx_vnni" in flags:  # VNNI's dot products in their AVX (VEX) form, without AVX-512
    marches.append("alderlake")
  for march in marches:
    out = tmp_path / f"{march}.npz"
    env = {**os.environ, "VOCABJAX_CPU_MARCH": march, "VOCABJAX_CACHE": str(tmp_path / march)}
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=env, cwd=root)
    results.append(np.load(out))
  for key in results[0].files:
    for other, march in zip(results[1:], marches[1:]):
      np.testing.assert_array_equal(np.asarray(results[0][key], np.float32).view(np.uint32),
                                    np.asarray(other[key], np.float32).view(np.uint32),
                                    err_msg=f"{key} {march}")
