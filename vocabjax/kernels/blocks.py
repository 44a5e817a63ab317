"""Weights kept as GGUF's quantized blocks (`BlockWeight`): what a Q4_K_M file holds, in memory.

A GGUF matrix [F, D] of a block type is F rows of D / n blocks, each block n values stored
in a fixed number of bytes (a float16 scale, packed 4/5/6/8-bit codes, and for the K types
sub-block scales and minimums). `BlockWeight` holds those bytes unchanged ([F, row bytes]
uint8) with the type and D as static fields, so a model loaded from a 1.1 GB Q4_K_M file holds
1.1 GB of weights instead of 6.2 GB of f32. `linear` multiplies them on the CPU with the C++
kernel (`cpu_matmul.cc`), which dequantizes 16 values at a time in registers and then does
exactly the f32 kernel's arithmetic; elsewhere (long prefill blocks, GPU, TPU) `dequantize`
widens them in XLA first. Both compute every value with the same f32 operations as `gguf`'s
own `dequantize` (a product, then for the types with a minimum a subtraction or an addition,
each rounded once), so the model is the file's model: logits equal the f32 path over the
dequantized weights bit for bit on the CPU kernel, and greedy tokens are identical.

Types kept as blocks: `BLOCK_TYPES` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: the registry's
files and of most GGUF files); other quantized types are dequantized at load, and the loader
says which.
"""

from __future__ import annotations

import dataclasses
import functools

import gguf
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class BlockType:
  name: str
  ggml_type: int  # gguf.GGMLQuantizationType's value
  values: int  # values per block
  bytes: int  # bytes per block


BLOCK_TYPES = {t.name: t for t in (
    BlockType("Q4_0", 2, 32, 18), BlockType("Q4_1", 3, 32, 20), BlockType("Q5_0", 6, 32, 22),
    BlockType("Q5_1", 7, 32, 24), BlockType("Q8_0", 8, 32, 34),
    BlockType("Q4_K", 12, 256, 144), BlockType("Q5_K", 13, 256, 176),
    BlockType("Q6_K", 14, 256, 210))}


class BlockError(ValueError):
  """Blocks that cannot be a weight: an unknown type, a width that is not whole blocks, a row
  of the wrong byte length."""


def block_type(qtype: str) -> BlockType:
  if qtype not in BLOCK_TYPES:
    raise BlockError(f"quantization type {qtype!r} is not kept as blocks (supported: "
                     f"{', '.join(BLOCK_TYPES)})")
  return BLOCK_TYPES[qtype]


def row_bytes(qtype: str, cols: int) -> int:
  """Bytes of one row of `cols` values in blocks of `qtype`; BlockError if `cols` is not a
  whole number of blocks."""
  t = block_type(qtype)
  if cols <= 0 or cols % t.values:
    raise BlockError(f"a row of {cols} values is not a whole number of {qtype} blocks of "
                     f"{t.values}")
  return cols // t.values * t.bytes


# the arithmetic `linear` multiplies blocks with on the CPU: "exact" (the dequantized values
# times x in f32: the f32 model's logits) or "q8" (x quantized to 8 bits per block and integer
# dot products, llama.cpp's arithmetic: `cpu_matmul.cc`, "int8 activations"; Q8_TYPES only)
ARITHS = ("exact", "q8")
Q8_TYPES = ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K")


@functools.partial(jax.tree_util.register_dataclass, data_fields=["data"],
                   meta_fields=["qtype", "cols", "arith"])
@dataclasses.dataclass(frozen=True)
class BlockWeight:
  """A weight matrix [F, cols] (or a stack of rows [..., cols]) as stored in GGUF blocks;
  `arith`: how the CPU kernel multiplies it (ARITHS)."""
  data: jax.Array  # [..., row_bytes(qtype, cols)] uint8: each row's blocks, as in the file
  qtype: str  # a BLOCK_TYPES name
  cols: int  # D, values per row
  arith: str = "exact"

  def __post_init__(self):
    if self.arith not in ARITHS:
      raise BlockError(f"arith={self.arith!r}: choose one of {ARITHS}")
    if self.arith == "q8" and self.qtype not in Q8_TYPES:
      raise BlockError(f"{self.qtype} blocks have no int8-activation kernel (arith='q8' takes "
                       f"{', '.join(Q8_TYPES)})")
    want = row_bytes(self.qtype, self.cols)
    shape = getattr(self.data, "shape", None)
    if shape is not None and len(shape) and shape[-1] != want:
      raise BlockError(f"{self.qtype} rows of {self.cols} values take {want} bytes; the data's "
                       f"rows have {shape[-1]}")

  @property
  def shape(self) -> tuple[int, ...]:
    return (*self.data.shape[:-1], self.cols)

  @property
  def dtype(self):
    """The stored bytes' dtype (uint8): not a float, so dtype checks treat blocks as
    quantized."""
    return self.data.dtype

  @property
  def ndim(self) -> int:
    return len(self.data.shape)

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.data.shape)) if self.data.shape else 0

  def take(self, idx, mode: str | None = None) -> "BlockWeight":
    """The rows `idx` (any shape) still as blocks: [*idx.shape, cols]."""
    return BlockWeight(jnp.take(self.data, idx, axis=0, mode=mode), self.qtype, self.cols,
                       self.arith)


def with_arith(params, arith: str):
  """`params` with every BlockWeight of a Q8_TYPES type multiplied in `arith` (ARITHS); the
  other block types, which have no int8-activation kernel, keep the exact arithmetic."""
  if arith not in ARITHS:
    raise BlockError(f"arith={arith!r}: choose one of {ARITHS}")

  def one(w):
    if isinstance(w, BlockWeight) and (arith == "exact" or w.qtype in Q8_TYPES):
      return dataclasses.replace(w, arith=arith)
    return w

  return jax.tree.map(one, params, is_leaf=lambda v: isinstance(v, BlockWeight))


GROUP = 32  # values per Q4_0 group: one scale each


@functools.partial(jax.tree_util.register_dataclass, data_fields=["codes", "scales"],
                   meta_fields=["split"])
@dataclasses.dataclass(frozen=True)
class GroupedInt4:
  """Q4_0's values laid out for an accelerator's dot: a weight [F, D] (or rows [..., D]) as
  int4 codes with the input axis leading and each group of 32 inputs' scale in f32.

  The same numbers as Q4_0 blocks (value = scale * code, code = Q4_0's 4-bit code less 8, the
  scale its float16 scale exactly), as codes [D, F] int4 and scales [D / 32, F] f32 (5 bits a
  weight): the layout a TPU's grouped-int4 kernel (`kernels.grouped_int4_tpu`) reads, and the
  one XLA:TPU's own dot fuses best (one row: Q4_0's own bytes [F, row bytes] read 8.2-10.4x,
  an [F, D] int4 layout 2.6-3.0x, float16 scales 1.44-1.54x, this layout 1.00-1.05x where the
  outputs are whole 128-lane tiles; at 8 rows even this one is widened in HBM for most shapes:
  kernels/results/tpu_bytes/grouped_int4.md). `linear`, row gathers (`take`,
  `dequantize`), subsets and the indexed head take it as they take GGUF blocks."""

  codes: jax.Array  # [D, *rows] int4 in -8..7 (int8 on a CPU mesh: `sharding.shard_params`);
  #   the input axis leads
  scales: jax.Array  # [D / 32, *rows] f32
  split: str | None = None  # on a mesh (`sharding.shard_params`): "out" when the outputs
  #   (rows) are split over "model", "in" when the inputs (D, whole groups) are, None: whole

  qtype = "Q4_0"  # the block type whose values these are

  @property
  def cols(self) -> int:
    return int(self.codes.shape[0])

  @property
  def shape(self) -> tuple[int, ...]:
    return (*self.codes.shape[1:], self.cols)

  @property
  def dtype(self):
    """int4: not a float, so dtype checks treat the weight as quantized."""
    return self.codes.dtype

  @property
  def ndim(self) -> int:
    return len(self.codes.shape)

  @property
  def nbytes(self) -> int:
    bits = jnp.iinfo(self.codes.dtype).bits
    return int(np.prod(self.codes.shape)) * bits // 8 + 4 * int(np.prod(self.scales.shape))

  def take(self, idx, mode: str | None = None) -> "GroupedInt4":
    """The rows `idx` (any shape) still as codes and scales: shape [*idx.shape, D]."""
    return GroupedInt4(jnp.take(self.codes, idx, axis=1, mode=mode),
                       jnp.take(self.scales, idx, axis=1, mode=mode))


def is_blocks(w) -> bool:
  """Whether `w` is a quantized weight of blocks: GGUF's (`BlockWeight`) or Q4_0's values for an
  accelerator (`GroupedInt4`)."""
  return isinstance(w, (BlockWeight, GroupedInt4))


def grouped_in_out(w: GroupedInt4, dtype=jnp.float32) -> jax.Array:
  """The values of `w` [D, *rows] (input axis first), each scale * code in f32 (exact: a 4-bit
  code times a float16 scale), then cast to `dtype`."""
  D = w.cols
  rows = w.codes.shape[1:]
  q = w.codes.astype(jnp.float32).reshape(D // GROUP, GROUP, *rows)
  return (q * w.scales[:, None]).reshape(D, *rows).astype(dtype)


def grouped_int4(w, name: str = "weight") -> GroupedInt4:
  """`w` [F, D] (floats, any backend, traceable) quantized as `gguf`'s Q4_0 quantizer does it
  (per 32 inputs: the value of largest magnitude m, scale m / -8, codes trunc(x / scale + 8.5)
  clipped to 0..15; the scale stored in float16), as a GroupedInt4: the values of
  `quantize(w, "Q4_0")` (tests/kernels/test_grouped_int4.py), computed on the device. BlockError
  naming `name` when D is not a whole number of groups."""
  shape = tuple(np.shape(w))
  if len(shape) != 2 or shape[1] % GROUP:
    raise BlockError(f"{name}: a Q4_0 group of {GROUP} values does not divide its rows (shape "
                     f"{shape})")
  return _grouped_int4(w)


@jax.jit
def _grouped_int4(w) -> GroupedInt4:
  F, D = w.shape
  x = jnp.asarray(w, jnp.float32).reshape(F, D // GROUP, GROUP)
  top = jnp.take_along_axis(x, jnp.argmax(jnp.abs(x), axis=-1)[..., None], axis=-1)
  d = top / -8.0
  inv = jnp.where(d == 0, 0.0, 1.0 / jnp.where(d == 0, 1.0, d))
  q = jnp.clip(jnp.trunc(x * inv + jnp.float32(8.5)), 0, 15).astype(jnp.int8) - 8
  codes = q.reshape(F, D).T.astype(jnp.int4)
  scales = d[..., 0].astype(jnp.float16).astype(jnp.float32).T
  return GroupedInt4(codes, scales)


def grouped_from_blocks(w: BlockWeight) -> GroupedInt4:
  """Q4_0 blocks [F, row bytes] repacked as a GroupedInt4 of the same values."""
  if not isinstance(w, BlockWeight) or w.qtype != "Q4_0" or w.ndim != 2:
    raise BlockError(f"only a matrix of Q4_0 blocks repacks as grouped int4; got "
                     f"{getattr(w, 'qtype', type(w).__name__)} of shape {tuple(w.shape)}")
  t = block_type("Q4_0")
  F = w.data.shape[0]
  b = w.data.reshape(F, w.cols // t.values, t.bytes).astype(jnp.uint8)
  q = _nibbles(b[..., 2:]).reshape(F, w.cols).astype(jnp.int8) - 8
  return GroupedInt4(q.T.astype(jnp.int4), _f16(b[..., 0:2]).T)


def _f16(b) -> jax.Array:
  """Two bytes [..., 2] (little-endian) -> their float16 value as f32 [...]."""
  return jax.lax.bitcast_convert_type(b, jnp.float16).astype(jnp.float32)


def _nibbles(qs) -> jax.Array:
  """[..., n] bytes -> [..., 2, n]: low nibbles, then high nibbles."""
  return jnp.stack([qs & 0xF, qs >> 4], axis=-2)


def _k_scales(s) -> tuple[jax.Array, jax.Array]:
  """The K types' 12 scale bytes [..., 12] -> 6-bit (scales, mins), each [..., 8] f32."""
  d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
  sc = jnp.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
  mn = jnp.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
  return sc.astype(jnp.float32), mn.astype(jnp.float32)


def dequantize(w: BlockWeight | GroupedInt4) -> jax.Array:
  """The f32 values [..., cols] of `w`, each computed as `gguf.quants.dequantize` computes it."""
  if isinstance(w, GroupedInt4):
    return jnp.moveaxis(grouped_in_out(w), 0, -1)
  t = block_type(w.qtype)
  lead = w.data.shape[:-1]
  b = w.data.reshape(*lead, w.cols // t.values, t.bytes).astype(jnp.uint8)
  if t.name == "Q8_0":
    q = jax.lax.bitcast_convert_type(b[..., 2:], jnp.int8).astype(jnp.float32)
    out = q * _f16(b[..., 0:2])[..., None]
  elif t.name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
    start = {"Q4_0": 2, "Q4_1": 4, "Q5_0": 6, "Q5_1": 8}[t.name]
    q = _nibbles(b[..., start:]).reshape(*b.shape[:-1], 32)
    if t.name in ("Q5_0", "Q5_1"):  # the fifth bits: bit l of a little-endian 32-bit word
      word = b[..., start - 4:start]
      bits = (word[..., jnp.arange(32) // 8] >> (jnp.arange(32) % 8).astype(jnp.uint8)) & 1
      q = q | (bits << 4)
    d = _f16(b[..., 0:2])[..., None]
    if t.name in ("Q4_0", "Q5_0"):
      out = d * (q.astype(jnp.int8) - (8 if t.name == "Q4_0" else 16)).astype(jnp.float32)
    else:
      out = d * q.astype(jnp.float32) + _f16(b[..., 2:4])[..., None]
  elif t.name in ("Q4_K", "Q5_K"):
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scales(b[..., 4:16])
    qs = b[..., 16:144] if t.name == "Q4_K" else b[..., 48:176]
    q = _nibbles(qs.reshape(*qs.shape[:-1], 4, 32)).reshape(*b.shape[:-1], 8, 32)
    if t.name == "Q5_K":
      qh = b[..., 16:48]
      bits = (qh[..., None, :] >> jnp.arange(8, dtype=jnp.uint8)[:, None]) & 1
      q = q | (bits << 4)
    out = (d[..., None] * sc)[..., None] * q.astype(jnp.float32) - (dmin[..., None] * mn)[..., None]
  else:  # Q6_K
    ql, qh = b[..., 0:128], b[..., 128:192]
    sc = jax.lax.bitcast_convert_type(b[..., 192:208], jnp.int8).astype(jnp.float32)
    d = _f16(b[..., 208:210])
    lo = _nibbles(ql.reshape(*ql.shape[:-1], 2, 64)).reshape(*b.shape[:-1], 8, 32)
    hi = ((qh.reshape(*qh.shape[:-1], 2, 1, 32) >> jnp.array([0, 2, 4, 6], jnp.uint8)[:, None])
          & 3).reshape(*b.shape[:-1], 8, 32)
    q = ((lo | (hi << 4)).astype(jnp.int8) - 32).reshape(*b.shape[:-1], 16, 16)
    out = (d[..., None] * sc)[..., None] * q.astype(jnp.float32)
  return out.reshape(*lead, w.cols)


def from_numpy(data: np.ndarray, qtype: str, cols: int | None = None) -> BlockWeight:
  """A BlockWeight of a GGUF tensor's bytes [F, row bytes] (as `gguf`'s reader hands them)."""
  t = block_type(qtype)
  data = np.ascontiguousarray(data, np.uint8)
  if cols is None:
    if data.shape[-1] % t.bytes:
      raise BlockError(f"{qtype} rows are whole blocks of {t.bytes} bytes; these have "
                       f"{data.shape[-1]}")
    cols = data.shape[-1] // t.bytes * t.values
  return BlockWeight(jnp.asarray(data), qtype, cols)


# block types `gguf`'s own quantizers write (its K types only read): weight-only quantization
# of any checkpoint into blocks (`models.llamalike.quantize_blocks`)
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def quantize(w, qtype: str, name: str = "weight") -> BlockWeight:
  """`w` [F, D] (floats) quantized into blocks of `qtype` by `gguf.quants.quantize` (Q4_0:
  groups of 32 weights as 4-bit codes with one float16 scale, llama.cpp's own rounding), so a
  model quantized here is what llama.cpp would make of the same weights. BlockError, naming
  `name`, when the type has no quantizer or D is not a whole number of groups."""
  if qtype not in QUANTIZABLE:
    raise BlockError(f"cannot quantize into {qtype!r}: gguf quantizes {', '.join(QUANTIZABLE)}"
                     f" (its K types are read, not written)")
  t = block_type(qtype)
  shape = tuple(np.shape(w))
  if len(shape) != 2 or shape[1] % t.values:
    raise BlockError(f"{name}: a {qtype} group of {t.values} values does not divide its rows "
                     f"(shape {shape})")
  data = gguf.quants.quantize(np.asarray(w, np.float32), gguf.GGMLQuantizationType[qtype])
  return BlockWeight(jnp.asarray(data), qtype, shape[1])
