"""One entry point for every model argument: a local HF dir, a GGUF file, or a registry name."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from vocabjax import sharding
from vocabjax.checkpoints import hub, zoo
from vocabjax.checkpoints.convert import CheckpointError, check_finite
from vocabjax.checkpoints.gguf_io import (TOKENIZER_KEY, load_gguf, load_gguf_tokenizer,
                                          open_gguf, tokenizer_key)
from vocabjax.checkpoints.hf import load_hf, read_hf_config
from vocabjax.kernels.blocks import with_arith
from vocabjax.lowering import target_platform
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import (INT4, LAYER_MATRICES, cast_weights, has_blocks, is_int8,
                                       quantize_blocks, quantize_grouped, with_mlp_layout)

_DTYPES = {"float32": jnp.float32, "f32": jnp.float32, "bfloat16": jnp.bfloat16,
           "bf16": jnp.bfloat16, "float16": jnp.float16, "f16": jnp.float16, "int8": jnp.int8}


def default_dtype(backend: str | None = None):
  """f32 on CPU (XLA's CPU bf16 matvec is ~8x slower), bf16 on GPU/TPU."""
  return jnp.float32 if (backend or jax.default_backend()) == "cpu" else jnp.bfloat16


GGUF = "gguf"  # the dtype that keeps a GGUF file's quantized blocks (`kernels.blocks`)
# GGUF's blocks multiplied as llama.cpp multiplies them: activations quantized to 8 bits per
# block, integer dot products (`kernels.blocks.BlockWeight.arith` "q8"; its Q8_TYPES)
GGUF_Q8 = "gguf-q8"
INT4_DTYPE = "int4"  # weight-only int4: any checkpoint quantized into Q4_0 blocks at load
_QUANTIZED = (GGUF, GGUF_Q8, INT4_DTYPE)  # dtypes that are not jnp dtypes


def parse_dtype(dtype: Any):
  """None -> the backend default; a name ('f32', 'bfloat16', 'int8', ...) or a dtype -> that
  dtype (int8 means weight-only int8, `models.llamalike.quantize_int8`); 'gguf' -> GGUF (the
  file's own quantization: its blocks kept as stored, a GGUF file only); 'gguf-q8' -> GGUF_Q8
  (the same blocks multiplied with 8-bit activations, llama.cpp's arithmetic); 'int4' -> weight-only
  grouped int4 (`models.llamalike.quantize_blocks`: Q4_0 blocks, any checkpoint)."""
  if dtype is None or dtype == "auto":
    return default_dtype()
  if isinstance(dtype, str):
    if dtype in _QUANTIZED:
      return dtype
    if dtype not in _DTYPES:
      raise ValueError(f"unknown {dtype=}; choose one of {sorted(_DTYPES) + list(_QUANTIZED)} "
                       f"or 'auto'")
    return _DTYPES[dtype]
  return jnp.dtype(dtype).type


def is_gguf_source(name_or_path: str | os.PathLike) -> bool:
  """Whether a model argument names a GGUF file (a path ending .gguf, or a registry model whose
  file is one), decided without fetching or reading it."""
  entry = zoo.REGISTRY.get(str(name_or_path))
  return (entry.filename if entry else str(name_or_path)).lower().endswith(".gguf")


def weights_default(name_or_path: str | os.PathLike, dtype: Any = None, mesh=None,
                    backend: str | None = None):
  """The dtype `load_model(name_or_path, dtype=dtype, mesh=mesh)` loads: `parse_dtype(dtype)`,
  except that no dtype (None or 'auto') loads a GGUF file's own quantization (GGUF: its blocks
  as stored) on one CPU device, where the blocks kernel runs; a mesh, a GPU or a TPU takes the
  backend default, the file's values dequantized."""
  if dtype is None or dtype == "auto":
    backend = backend or jax.default_backend()
    return (GGUF if mesh is None and backend == "cpu" and is_gguf_source(name_or_path)
            else default_dtype(backend))
  return parse_dtype(dtype)


def dtype_name(dtype: Any) -> str:
  """The name a record gives a parsed dtype: 'float32', 'bfloat16', 'int8', 'int4', 'gguf',
  'gguf-q8'."""
  return dtype if isinstance(dtype, str) and dtype in _QUANTIZED else jnp.dtype(dtype).name


@dataclasses.dataclass
class Model:
  """A loaded model: static config, params pytree, tokenizer (or None) and stop tokens."""

  config: LlamaLikeConfig
  params: dict
  tokenizer: Any
  eos_token_ids: tuple[int, ...]
  source: str
  dtype: Any
  _layouts: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

  def in_layout(self, layout: str) -> dict:
    """`params` with the MLP weights in `layout` (converted once, then reused)."""
    if layout not in self._layouts:
      self._layouts[layout] = with_mlp_layout(self.params, layout)
    return self._layouts[layout]

  @property
  def name(self) -> str:
    return Path(self.source).name


# Gemma 3's chat template (text turns) as its instruction-tuned checkpoints ship it: the
# assistant's role is "model", a system message is prefixed to the first user turn, and a turn
# ends with <end_of_turn>. GGUF files of the base models carry none; `gemma3_chat` adds it.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")
GEMMA3_END_OF_TURN = "<end_of_turn>"


def gemma3_chat(tokenizer) -> tuple[int, ...]:
  """Give a Gemma 3 tokenizer without a chat template Gemma 3's (`GEMMA3_CHAT_TEMPLATE`);
  return the id of `<end_of_turn>`, which ends a chat turn (a stop token), if it has one."""
  if tokenizer is None:
    return ()
  if not getattr(tokenizer, "chat_template", None):
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
  tid = tokenizer.convert_tokens_to_ids(GEMMA3_END_OF_TURN)
  return (int(tid),) if isinstance(tid, int) and tid != tokenizer.unk_token_id else ()


def eos_ids(*candidates) -> tuple[int, ...]:
  """The distinct non-negative ids among `candidates` (ints, lists of ints or None), in order:
  a model's EOS tokens from its generation config, config and tokenizer."""
  out: list[int] = []
  for c in candidates:
    for x in (c if isinstance(c, (list, tuple)) else [c]):
      if x is not None and int(x) >= 0 and int(x) not in out:
        out.append(int(x))
  return tuple(out)


def load_model(name_or_path: str | os.PathLike, *, dtype: Any = None,
               load_tokenizer: bool = True, progress: bool | None = None,
               allow_bin: bool | None = None, mesh=None) -> Model:
  """Load a model from an HF directory, a `.gguf` file, a registry name (fetched if needed) or
  a hub id (`org/name[@revision]`, downloaded through huggingface_hub: `checkpoints.hub`).

  `allow_bin`: read pickled PyTorch weights (`pytorch_model.bin`) where a model has no
  safetensors, with `torch.load(weights_only=True)`; refused by default (None: the
  environment's `VOCABJAX_ALLOW_BIN`).

  `progress`: the download's, the checksum's and int4's bars (None: shown, unless within
  `checkpoints.hub.showing_progress(False)`, as under the commands' `--quiet`).

  `mesh` (a ("data", "model") mesh, `sharding.make_mesh`): each tensor is read and placed with
  its sharding on the mesh (`sharding.param_shardings`, the layout the decoders run a mesh in)
  before the next is read, so the host holds about one tensor, not the model, and no device
  holds more than its share; int8 is quantized on the mesh (each matrix's rows where the
  matrix is split, `sharding.with_scale_specs`).

  `dtype`: the weights' dtype; None or 'auto': a GGUF file's own quantization on one CPU
  device (its blocks kept as stored, as 'gguf'), else f32 on the CPU and bf16 on GPU/TPU
  (`weights_default`). On GPU/TPU every param takes it. On the CPU backend a dtype
  narrower than f32 applies to the weight matrices only (`models.llamalike.cast_weights`):
  norms, biases, activations and the KV cache stay f32, which is what runs fast there.
  `int8` (any backend) is weight-only int8 with per-row f32 scales, quantized from the f32
  weights at load (`models.llamalike.quantize_int8`); activations and the cache stay f32.
  `gguf` (a .gguf file, one device) keeps the file's quantized matrices as their blocks
  (`kernels.blocks`); its norms and biases load as f32. `gguf-q8` keeps them too and has the
  CPU kernel multiply them as llama.cpp does (x quantized to 8 bits per block, integer dot
  products: `BlockWeight.arith` "q8", for the types in `kernels.blocks.Q8_TYPES`; the others
  keep the exact arithmetic): not the f32 model's logits, the same logits in every method. `int4` (any checkpoint) on one CPU
  device loads f32 and quantizes every matrix into Q4_0 blocks (groups of 32 weights, a
  float16 scale each: `models.llamalike.quantize_blocks`), which then run as a GGUF file's
  blocks do; on a mesh, a GPU or a TPU it loads the backend's float dtype (bf16 on GPU/TPU:
  activations and cache stay bf16) and quantizes on the devices into the same values laid out
  for XLA's dot (`models.llamalike.quantize_grouped`, `kernels.blocks.GroupedInt4`: int4 codes
  and f32 group scales, split over a mesh as the float matrices are).
  """
  dtype = weights_default(name_or_path, dtype, mesh)
  progress = hub.progress_default(progress)
  int4 = isinstance(dtype, str) and dtype == INT4_DTYPE
  # int4 on a mesh, a GPU or a TPU: Q4_0's values laid out for XLA's dot (`GroupedInt4`),
  # quantized on the devices from the backend's float weights; on one CPU device: Q4_0 blocks
  grouped = int4 and (mesh is not None or jax.default_backend() != "cpu")
  if grouped:
    dtype = default_dtype(target_platform(mesh) if mesh is not None else jax.default_backend())
    int4 = False
  q8 = dtype == GGUF_Q8
  keep_blocks = dtype in (GGUF, GGUF_Q8)
  if keep_blocks and mesh is not None:
    raise ValueError(f"GGUF blocks (dtype={dtype!r}) are a one-device format: load the model "
                     f"in float32 or bfloat16 onto a mesh")
  if q8 and jax.default_backend() != "cpu":
    raise ValueError(f"dtype='gguf-q8' is the CPU kernel's arithmetic; the {jax.default_backend()} "
                     f"backend has no blocks kernel: load the model in bfloat16, int8 or int4")
  path = zoo.resolve(name_or_path, progress=progress, allow_bin=allow_bin)
  if keep_blocks and path.suffix != ".gguf":
    raise ValueError(f"dtype={dtype!r} keeps a GGUF file's quantized blocks; {path} is not a "
                     f".gguf file: choose float32, bfloat16 or int8")
  placement = (lambda cfg: sharding.param_shardings(cfg, mesh)) if mesh is not None else None
  narrow_on_cpu = not keep_blocks and not int4 and (
      (jax.default_backend() == "cpu" and jnp.dtype(dtype) != jnp.float32)
      or jnp.dtype(dtype) == jnp.int8)
  # the float tensors (norms, biases) of a GGUF file kept as blocks load as f32
  out_dtype, dtype = dtype, (jnp.float32 if narrow_on_cpu or keep_blocks or int4 else dtype)
  tokenizer = None
  if path.is_dir():
    config, params, raw = load_hf(path, dtype=dtype, allow_bin=allow_bin, placement=placement)
    gen = {}
    if (path / "generation_config.json").exists():
      gen = json.loads((path / "generation_config.json").read_text())
    if load_tokenizer and any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
      from transformers import AutoTokenizer

      tokenizer = AutoTokenizer.from_pretrained(path)
    eos = eos_ids(gen.get("eos_token_id"), raw.get("eos_token_id"),
                   getattr(tokenizer, "eos_token_id", None))
  elif path.suffix == ".gguf":
    config, params, meta = load_gguf(path, dtype=dtype, placement=placement,
                                     keep_blocks=keep_blocks)
    tokenizer = (load_gguf_tokenizer(path, key=meta[TOKENIZER_KEY]) if load_tokenizer
                 else None)
    eos = eos_ids(meta.get("tokenizer.ggml.eos_token_id"),
                  getattr(tokenizer, "eos_token_id", None))
    if config.arch == "gemma3":
      eos = eos_ids(eos, gemma3_chat(tokenizer))
  else:
    raise ValueError(f"{path}: expected a Hugging Face directory or a .gguf file")
  check_finite(params, str(path))
  if keep_blocks and not has_blocks(params):  # a float GGUF file: nothing was kept as blocks
    out_dtype = jnp.float32
  elif q8:
    params = with_arith(params, "q8")
  if narrow_on_cpu:
    params = cast_weights(params, out_dtype)
    if mesh is not None and is_int8(params):  # each device quantized its share: placed anew
      params = sharding.shard_params(params, config, mesh)  # with the scales' shardings
  if int4 or grouped:
    params = _quantize_int4(params, str(path), progress, grouped=grouped)
  if grouped:
    if mesh is not None:  # each device quantized its share: placed anew, codes split as rows
      params = sharding.shard_params(params, config, mesh)
    out_dtype = INT4_DTYPE
  return Model(config=config, params=params, tokenizer=tokenizer, eos_token_ids=eos,
               source=str(path), dtype=out_dtype)


def _quantize_int4(params: dict, source: str, progress: bool, grouped: bool = False) -> dict:
  """`quantize_blocks` into INT4 blocks (`grouped`: `quantize_grouped`, on the devices), with a
  progress bar over the matrices."""
  from tqdm.auto import tqdm  # local: tqdm's import is only needed here

  n = (sum(1 for k in ("embed", "lm_head") if k in params)
       + len(LAYER_MATRICES) * len(params["layers"]))
  with tqdm(total=n, desc=f"int4 {Path(source).name}", unit="matrix", disable=not progress,
            leave=False) as bar:
    if grouped:
      return quantize_grouped(params, progress=lambda name: bar.update(1))
    return quantize_blocks(params, INT4, progress=lambda name: bar.update(1))


def load_tokenizer_and_vocab(name: str | os.PathLike):
  """(tokenizer, vocabulary size V of the model) without loading the weights: a registry
  name, an HF directory or a .gguf file."""
  path = zoo.resolve(name)
  if path.is_dir():
    from transformers import AutoTokenizer  # local: transformers' import costs seconds

    return AutoTokenizer.from_pretrained(path), int(read_hf_config(path)["vocab_size"])
  reader = open_gguf(path)
  emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
  if emb is None:
    raise CheckpointError(f"{path}: tensor token_embd.weight missing")
  tokenizer = load_gguf_tokenizer(path, key=tokenizer_key(reader))
  arch = reader.fields.get("general.architecture")
  if arch is not None and arch.contents() == "gemma3":
    gemma3_chat(tokenizer)
  return tokenizer, int(emb.shape[-1])
