"""GGUF (llama.cpp) checkpoints: config from metadata, dequantized params, tokenizer.

Reading and dequantization are the `gguf` package's (`GGUFReader`, the quantization classes'
`dequantize_rows`), driven faster with the same fields, tensors and values bit for bit: fields
sliced from a plain ndarray view of the file instead of its `np.memmap`, rows dequantized in
256-row groups on a thread pool (docs/engine.md, 'CPU speed', on loading GGUF files).
llama.cpp's converter permutes the rows of the q/k projections of the *llama* architecture
(it turns the half-split RoPE layout into the interleaved one); `unpermute_qk` undoes it, as
transformers' GGUF loader does. Qwen2/Qwen3 GGUFs use the NEOX RoPE layout and are not permuted.
Gemma 3 GGUFs hold its norms as 1 + w (llama.cpp's converter adds the 1 that transformers'
Gemma3RMSNorm adds at run time); the loader subtracts it (in f32) so both formats load to the
same params. llama.cpp fixes what GGUF metadata does not say: every 6th layer global (unless
`attention.sliding_window_pattern` says otherwise), local RoPE base 10,000, scores scaled by
head_dim ** -0.5 (D / H for the 27B).
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from vocabjax.checkpoints.convert import CheckpointError, assemble_params
from vocabjax.checkpoints.hf_config import UnsupportedConfigError, yarn_mscale
from vocabjax.checkpoints.zoo import cache_dir
from vocabjax.kernels.blocks import BLOCK_TYPES, BlockError, BlockWeight, from_numpy
from vocabjax.models.config import LlamaLikeConfig

_GGUF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}
GEMMA3_SLIDING_PATTERN = 6  # llama.cpp's `set_swa_pattern(6)` for LLM_ARCH_GEMMA3
GEMMA3_LOCAL_ROPE_BASE = 10_000.0  # llama.cpp's rope_freq_base_train_swa for gemma3


@functools.lru_cache(maxsize=1)
def _reader_class():
  """gguf.GGUFReader with its `_get` slicing a plain ndarray view of the file (module doc), if
  this gguf's `_get` is the one the override was written for; else the stock reader."""
  import inspect

  import gguf

  stock = gguf.GGUFReader
  if list(inspect.signature(stock._get).parameters) != ["self", "offset", "dtype", "count",
                                                        "override_order"]:
    return stock

  class FastReader(stock):
    def _get(self, offset, dtype, count=1, override_order=None):
      plain = self.__dict__.get("_plain")
      if plain is None:  # self.data (the memmap) is set before the first field is read
        plain = self._plain = self.data.view(np.ndarray)
      count = int(count)
      end = offset + np.dtype(dtype).itemsize * count
      arr = plain[offset:end].view(dtype=dtype)[:count]
      return arr.view(arr.dtype.newbyteorder(
          self.byte_order if override_order is None else override_order))

  return FastReader


# GGUF value types (gguf's GGUFValueType) -> bytes of one value; 8 = string, 9 = array
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def check_header_counts(path: Path) -> None:
  """Walk a GGUF file's header (its metadata and tensor infos) checking every count and length
  against the bytes left in the file before anything is allocated: `gguf`'s reader trusts them,
  and a 140-byte file whose array claims 2^40 elements makes it allocate until memory runs out.
  CheckpointError naming the key and the count."""
  import struct

  size = path.stat().st_size
  with open(path, "rb") as f:
    data = f.read(min(size, 64 << 20))  # the header: metadata and tensor infos come first
  pos = 0

  def need(n: int, what: str) -> None:
    if n < 0 or pos + n > size:
      raise CheckpointError(f"{path}: corrupt or truncated GGUF header: {what} needs {n:,} "
                            f"bytes at offset {pos:,}, the file has {size:,}")
    if pos + n > len(data):
      raise CheckpointError(f"{path}: GGUF header larger than {len(data) >> 20} MB at {what}: "
                            f"not a model file vocabjax reads")

  def take(fmt: str, what: str):
    nonlocal pos
    n = struct.calcsize(fmt)
    need(n, what)
    v = struct.unpack_from(fmt, data, pos)
    pos += n
    return v[0] if len(v) == 1 else v

  def string(what: str) -> str:
    nonlocal pos
    n = take("<Q", what)
    need(n, f"{what} ({n:,}-byte string)")
    out = data[pos:pos + n].decode("utf-8", "replace")
    pos += n
    return out

  def value(t: int, what: str) -> None:
    nonlocal pos
    if t in _SCALAR_BYTES:
      need(_SCALAR_BYTES[t], what)
      pos += _SCALAR_BYTES[t]
    elif t == 8:
      string(what)
    elif t == 9:
      et, count = take("<I", what), take("<Q", what)
      least = _SCALAR_BYTES.get(et, 8)  # a string element is at least its 8-byte length
      need(count * least, f"{what}: an array claiming {count:,} elements")
      if et in _SCALAR_BYTES:
        pos += count * least
      else:
        for i in range(count):
          value(et, f"{what}[{i}]")
    else:
      raise CheckpointError(f"{path}: corrupt GGUF header: {what} has unknown value type {t}")

  magic = take("<4s", "the magic")
  if magic != b"GGUF":
    raise CheckpointError(f"{path}: not a readable GGUF file (magic {magic!r}, not b'GGUF')")
  take("<I", "the version")
  n_tensors, n_kv = take("<Q", "the tensor count"), take("<Q", "the metadata count")
  need(n_kv * 13, f"{n_kv:,} metadata entries")  # key length 8 + type 4 + a 1-byte value
  need(n_tensors * 24, f"{n_tensors:,} tensor infos")  # name 8 + dims 4 + type 4 + offset 8
  for i in range(n_kv):
    key = string(f"metadata key {i}")
    value(take("<I", f"{key}'s type"), key)
  for i in range(n_tensors):
    name = string(f"tensor info {i}")
    dims = take("<I", f"{name}'s dimension count")
    if dims > 8:
      raise CheckpointError(f"{path}: corrupt GGUF header: tensor {name} claims {dims} "
                            f"dimensions")
    need(8 * dims + 12, f"tensor {name}'s shape")
    pos += 8 * dims + 12


def open_gguf(path: str | os.PathLike):
  """A GGUFReader, after checking the file is complete; CheckpointError otherwise."""
  path = Path(path)
  size = path.stat().st_size
  check_header_counts(path)
  try:
    reader = _reader_class()(path)
  except Exception as e:  # the reader raises ValueError/IndexError/... on garbage
    raise CheckpointError(f"{path}: not a readable GGUF file ({size} bytes): "
                          f"{type(e).__name__}: {e}") from e
  for t in reader.tensors:
    end = int(t.data_offset) + int(t.n_bytes)
    if end > size or t.data.nbytes != t.n_bytes:
      raise CheckpointError(f"{path}: truncated GGUF: tensor {t.name} needs bytes up to {end}, "
                            f"file has {size}")
  return reader


TOKENIZER_KEY = "vocabjax.tokenizer_key"  # `load_gguf`'s metadata: the file's `tokenizer_key`


def metadata(reader) -> dict:
  """All key/value fields as Python values (arrays of strings are left out for speed)."""
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("tokenizer.ggml.") and key != "tokenizer.ggml.eos_token_id" and \
        key != "tokenizer.ggml.bos_token_id" and key != "tokenizer.ggml.model":
      continue
    try:
      out[key] = field.contents()
    except Exception:  # unusual types: skip, they never carry model sizes
      continue
  return out


def _gguf_yarn(arch: str, get, problems: list) -> dict:
  """LlamaLikeConfig's yarn fields from llama.cpp's `rope.scaling.*` keys. llama.cpp's ramp
  (`ggml_rope_yarn_corr_dims`: floor / ceil of the correction dimensions) and its scale of cos
  and sin (1 + 0.1 ln factor) are transformers' with `truncate`; its further knobs (an
  attention factor, an extrapolation mix, DeepSeek's log multiplier) are refused unless at
  their neutral values."""
  original = get("rope.scaling.original_context_length")
  if not original:
    problems.append(f"{arch}.rope.scaling.type='yarn' without "
                    f"{arch}.rope.scaling.original_context_length")
  for key, neutral in (("rope.scaling.attn_factor", (1.0,)),
                       ("rope.scaling.yarn_attn_factor", (1.0,)),
                       ("rope.scaling.yarn_ext_factor", (-1.0, 1.0)),
                       ("rope.scaling.yarn_log_multiplier", (0.0,))):
    value = get(key)
    if value is not None and float(value) not in neutral:
      problems.append(f"{arch}.{key}={value} (YaRN with it not implemented)")
  return dict(rope_original_max_position=int(original or 1),
              rope_attention_factor=yarn_mscale(float(get("rope.scaling.factor", 1.0) or 1.0)),
              rope_beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
              rope_beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)), rope_truncate=True)


def config_from_gguf(meta: dict, tensor_names: set[str], vocab_size: int,
                     rope_freqs: np.ndarray | None = None) -> LlamaLikeConfig:
  arch = meta.get("general.architecture")
  if arch not in _GGUF_ARCHS:
    raise UnsupportedConfigError(f"unknown GGUF architecture general.architecture={arch!r}; "
                                 f"supported: {sorted(_GGUF_ARCHS)}")

  def get(key, default=None):
    return meta.get(f"{arch}.{key}", default)

  problems = []
  if get("expert_count", 0):
    problems.append(f"{arch}.expert_count={get('expert_count')} (mixture of experts)")
  if get("attention.sliding_window") and arch != "gemma3":
    problems.append(f"{arch}.attention.sliding_window={get('attention.sliding_window')}")
  for key in ("attn_logit_softcapping", "final_logit_softcapping"):
    if get(key):
      problems.append(f"{arch}.{key}={get(key)} (soft-capping not implemented)")
  scaling = get("rope.scaling.type", "none")
  if scaling not in ("none", "linear", "yarn"):
    problems.append(f"{arch}.rope.scaling.type={scaling!r} (supported: none, linear, yarn)")
  yarn = {}
  if scaling == "yarn":  # llama.cpp's YaRN, which is transformers' with truncate
    yarn = _gguf_yarn(arch, get, problems)
  D, H = int(get("embedding_length")), int(get("attention.head_count"))
  head_dim = int(get("attention.key_length", D // H))
  if int(get("rope.dimension_count", head_dim)) != head_dim:
    problems.append(f"{arch}.rope.dimension_count={get('rope.dimension_count')} != "
                    f"head_dim={head_dim} (partial rotary)")
  if problems:
    raise UnsupportedConfigError(f"GGUF {arch} metadata not supported: {'; '.join(problems)}")
  L = int(get("block_count"))
  gemma = {}
  if arch == "gemma3":
    # the 27B's query_pre_attn_scalar is D / H (168), the others' head_dim (llama.cpp)
    scalar = D // H if (L == 62 and D == 5376) else head_dim
    window = get("attention.sliding_window")
    # `attention.sliding_window_pattern`: an int n (every n-th layer global) or one bool per
    # layer (true: sliding); files without it get llama.cpp's fixed 6
    pattern = get("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
    if isinstance(pattern, (list, tuple)):
      if len(pattern) != L:
        raise UnsupportedConfigError(f"GGUF {arch}.attention.sliding_window_pattern has "
                                     f"{len(pattern)} entries for {L} layers")
      sliding = [bool(x) for x in pattern]
    else:
      sliding = [(i + 1) % int(pattern) != 0 for i in range(L)]
    gemma = dict(
        hidden_act="gelu_tanh", norm_unit_offset=True, sandwich_norms=True,
        scale_embeddings=True, query_pre_attn_scalar=float(scalar),
        sliding_window=int(window) if window else None,
        layer_types=tuple("sliding_attention" if s and window else "full_attention"
                          for s in sliding),
        rope_local_theta=GEMMA3_LOCAL_ROPE_BASE)
  return LlamaLikeConfig(
      arch=_GGUF_ARCHS[arch],
      vocab_size=int(vocab_size),
      hidden_size=D,
      intermediate_size=int(get("feed_forward_length")),
      num_layers=L,
      num_heads=H,
      num_kv_heads=int(get("attention.head_count_kv", H)),
      head_dim=head_dim,
      rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
      rope_theta=float(get("rope.freq_base", 10000.0)),
      rope_type=scaling if scaling in ("linear", "yarn") else "default",
      rope_factor=float(get("rope.scaling.factor", 1.0) or 1.0),
      **yarn,
      rope_freq_factors=None if rope_freqs is None else tuple(float(x) for x in rope_freqs),
      attention_bias="blk.0.attn_q.bias" in tensor_names,
      qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
      tie_word_embeddings="output.weight" not in tensor_names,
      max_position_embeddings=int(get("context_length", 4096)),
      **gemma,
  )


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
  """Invert llama.cpp's `permute` of q/k rows (interleaved RoPE pairs -> half-split)."""
  rows = w.shape[0]
  return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


DEQUANT_ROWS = 256  # rows per dequantization task (gguf.quants uses 16, in one thread)


@functools.lru_cache(maxsize=1)
def _quant_classes() -> dict:
  """GGMLQuantizationType -> gguf.quants' class for it (those with `dequantize_rows`)."""
  import gguf.quants as q

  out = {}
  for cls in vars(q).values():
    qtype = getattr(cls, "qtype", None)
    if isinstance(cls, type) and qtype is not None and hasattr(cls, "dequantize_rows"):
      out[qtype] = cls
  return out


def dequantize(data: np.ndarray, qtype, pool=None) -> np.ndarray:
  """`gguf.quants.dequantize(data, qtype)`, bit for bit, faster: a quantized tensor's rows
  dequantized DEQUANT_ROWS at a time by its gguf class's `dequantize_rows`, on `pool` (a
  ThreadPoolExecutor) when given, into one f32 array. Other types go to gguf itself."""
  import gguf.quants

  cls = _quant_classes().get(qtype) if data.ndim >= 1 and data.size else None
  if cls is None:  # F32, F16 (views / one cast) and anything gguf has no class for
    return gguf.quants.dequantize(data, qtype)
  if hasattr(cls, "init_grid"):  # the i-quants' lookup tables, built once (as gguf does)
    cls.init_grid()
  rows = data.reshape(-1, data.shape[-1])
  out_cols = gguf.quants.quant_shape_from_byte_shape(rows.shape, qtype)[-1]
  out = np.empty((rows.shape[0], out_cols), np.float32)

  def part(i):
    out[i:i + DEQUANT_ROWS] = cls.dequantize_rows(rows[i:i + DEQUANT_ROWS])

  starts = range(0, rows.shape[0], DEQUANT_ROWS)
  if pool is None or len(starts) == 1:
    for i in starts:
      part(i)
  else:
    for f in [pool.submit(part, i) for i in starts]:
      f.result()
  return out.reshape(*data.shape[:-1], out_cols)


def load_gguf(path: str | os.PathLike, dtype=jnp.float32, *, placement=None,
              keep_blocks: bool = False) -> tuple[LlamaLikeConfig, dict, dict]:
  """Read a GGUF file: (config, params, metadata). `placement`: config -> the params'
  Shardings, each tensor placed as it is dequantized (`convert.assemble_params`).
  `keep_blocks`: matrices of a type in `kernels.blocks.BLOCK_TYPES` stay as their blocks
  (`BlockWeight`); matrices of other quantized types are dequantized to `dtype`, with a
  warning naming them."""
  from concurrent.futures import ThreadPoolExecutor

  path = Path(path)
  if keep_blocks and placement is not None:
    raise ValueError("GGUF blocks are a one-device format: no placement on a mesh")
  with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
    return _load_gguf(path, dtype, pool, placement, keep_blocks)


def _load_gguf(path: Path, dtype, pool, placement=None, keep_blocks: bool = False
               ) -> tuple[LlamaLikeConfig, dict, dict]:
  reader = open_gguf(path)
  meta = {**metadata(reader), TOKENIZER_KEY: tokenizer_key(reader)}
  tensors = {t.name: t for t in reader.tensors}
  rope_freqs = None
  if "rope_freqs.weight" in tensors:  # Llama 3.1+ GGUFs bake llama3 scaling into this tensor
    t = tensors["rope_freqs.weight"]
    rope_freqs = dequantize(t.data, t.tensor_type, pool).reshape(-1)
  if "token_embd.weight" not in tensors:
    raise CheckpointError(f"{path}: tensor token_embd.weight missing")
  vocab_size = int(tensors["token_embd.weight"].shape[-1])  # ggml ne order: [D, V]
  config = config_from_gguf(meta, set(tensors), vocab_size, rope_freqs)

  widened: dict[str, int] = {}  # quantized types not kept as blocks -> tensors dequantized

  def lookup(name: str) -> np.ndarray | BlockWeight:
    try:
      return _lookup(name)
    finally:
      t = tensors[name]
      release_pages(reader, int(t.data_offset), int(t.n_bytes))

  def _lookup(name: str) -> np.ndarray | BlockWeight:
    t = tensors[name]
    qtype = t.tensor_type.name
    if keep_blocks and len(t.shape) == 2 and qtype in BLOCK_TYPES:
      rows = np.asarray(t.data).reshape(int(t.shape[1]), -1)  # [F, row bytes]
      if config.arch == "llama" and name.endswith("attn_q.weight"):
        rows = unpermute_qk(rows, config.num_heads)
      elif config.arch == "llama" and name.endswith("attn_k.weight"):
        rows = unpermute_qk(rows, config.num_kv_heads)
      try:
        return from_numpy(rows, qtype, int(t.shape[0]))
      except BlockError as e:
        raise CheckpointError(f"{path}: tensor {name}: {e}") from None
    if keep_blocks and qtype not in ("F32", "F16", "BF16"):
      widened[qtype] = widened.get(qtype, 0) + 1
    w = dequantize(t.data, t.tensor_type, pool)
    # ggml's ne is reversed numpy order; dequantize keeps the byte-row layout, reshape to be sure.
    w = w.reshape(tuple(int(n) for n in reversed(t.shape.tolist())))
    if config.arch == "llama" and name.endswith(("attn_q.weight", "attn_q.bias")):
      w = unpermute_qk(w, config.num_heads)
    elif config.arch == "llama" and name.endswith(("attn_k.weight", "attn_k.bias")):
      w = unpermute_qk(w, config.num_kv_heads)
    elif config.norm_unit_offset and name.endswith("norm.weight"):
      w = w.astype(np.float32) - 1.0  # stored 1 + w (module doc)
    if not w.flags.owndata:  # a view of the file (an F32 norm or bias): a copy, else the
      w = np.array(w)  # array XLA:CPU may share keeps the whole file mapped (1.1 GB of RSS)
    return w

  params = assemble_params(config, lookup, tensors.keys(), scheme="gguf", dtype=dtype,
                           source=str(path),
                           shardings=placement(config) if placement else None)
  if widened:
    import warnings

    warnings.warn(f"{path.name}: {', '.join(f'{n} {q}' for q, n in sorted(widened.items()))} "
                  f"tensor(s) dequantized to {np.dtype(dtype).name} (kept as blocks: "
                  f"{', '.join(BLOCK_TYPES)})", stacklevel=3)
  return config, params, meta


def release_pages(reader, offset: int, nbytes: int) -> None:
  """Drop the file's pages [offset, offset + nbytes) from this process's resident memory once a
  tensor has been read out of them (madvise MADV_DONTNEED on the reader's read-only mapping:
  a later read maps them in again from the file, so nothing is lost). Without it a load holds
  the whole file's pages beside the copies made of them: the 1.5B target's Q4_K_M load peaked
  at 2.6 GB of resident memory for a 1.1 GB file."""
  mm = getattr(getattr(reader, "data", None), "_mmap", None)
  advice = getattr(mmap, "MADV_DONTNEED", None)
  if mm is None or advice is None or nbytes <= 0:
    return
  start = offset // mmap.PAGESIZE * mmap.PAGESIZE
  try:
    mm.madvise(advice, start, offset + nbytes - start)
  except (OSError, ValueError):  # a mapping that refuses the advice keeps its pages
    pass


def tokenizer_key(reader) -> str:
  """The identity of a GGUF file's tokenizer (`reader`: its `open_gguf`): a sha256 of its
  `tokenizer.*` metadata fields as stored (each field's bytes: its name, type and value), so two
  files with the same vocabulary share one cached build and files that differ never do,
  whatever their names, sizes and times. Loaders pass it from the reader they already hold
  (`load_gguf`'s metadata carries it as TOKENIZER_KEY): a second parse of a 152K-token
  vocabulary costs seconds."""
  raw = reader.data.view(np.ndarray)
  h = hashlib.sha256()
  for name in sorted(reader.fields):
    if name.startswith("tokenizer."):
      field = reader.fields[name]
      end = field.offset + sum(int(part.nbytes) for part in field.parts)
      h.update(raw[field.offset:end].tobytes())
  return h.hexdigest()[:32]


def load_gguf_tokenizer(path: str | os.PathLike, cache_root: Path | None = None,
                        key: str | None = None):
  """transformers' fast tokenizer built from the GGUF vocabulary, cached after the first build
  (under `tokenizer_key`: the vocabulary's content). The cached copy is read back as the
  generic fast tokenizer of its saved pipeline (`tokenizer.json`): a model-specific class
  (Qwen2Tokenizer, ...) rebuilds its own pre-tokenizer instead, which for a GGUF vocabulary
  whose converter wrote another one splits text differently from the first build. `key`: the
  file's `tokenizer_key` where the caller has it (else the file is parsed for it)."""
  # (AutoTokenizer only to build: importing it imports torch, 0.18 GiB of resident memory that
  # every run reading the cached tokenizer would carry)
  from transformers import PreTrainedTokenizerFast

  path = Path(path).resolve()
  key = key or tokenizer_key(open_gguf(path))
  cached = (cache_root or cache_dir()) / "tokenizers" / key
  if (cached / "tokenizer_config.json").exists():
    return PreTrainedTokenizerFast.from_pretrained(cached)
  import importlib.util

  from transformers import AutoTokenizer

  if importlib.util.find_spec("torch") is None:
    raise ImportError(f"building the tokenizer of {path.name} uses transformers' GGUF reader, "
                      f"which needs torch: pip install 'vocabjax[gguf]' (or torch==2.13.0 "
                      f"for the local CPU wheel)")
  tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
  tmp = cached.with_name(cached.name + ".partial")
  try:
    tok.save_pretrained(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if not cached.exists():
      os.replace(tmp, cached)
    return PreTrainedTokenizerFast.from_pretrained(cached)  # what every later run reads
  except OSError:
    return tok  # a read-only cache only costs a rebuild next time
