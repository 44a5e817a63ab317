"""The same checkpoint through PyTorch / transformers (the comparison runs and torch-computed
training features): a registry name resolves to its cached GGUF, read by transformers' GGUF
loader (dequantized into dense weights like vocabjax's own loader, `dequantized_gguf`); an HF
directory is read directly."""

from __future__ import annotations

from pathlib import Path

from vocabjax.checkpoints.zoo import resolve

TORCH_DTYPES = ("float32", "bfloat16", "float16")


def load_torch_model(source: str, dtype: str = "float32"):
  """A transformers causal LM of `source` in `dtype` (one of TORCH_DTYPES), in eval mode."""
  import torch
  import transformers

  if dtype not in TORCH_DTYPES:
    raise ValueError(f"transformers models load as float32, bfloat16 or float16, not {dtype=} "
                     f"(vocabjax's weight-only int8 has no transformers counterpart here)")
  tdtype = getattr(torch, dtype)
  path = resolve(source)
  if path.is_file() and path.suffix == ".gguf":
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=tdtype, **dequantized_gguf(path)).eval()
  return transformers.AutoModelForCausalLM.from_pretrained(Path(path), dtype=tdtype).eval()


def dequantized_gguf(path) -> dict:
  """`from_pretrained` arguments that unpack a GGUF file's weights into a dense model of the
  asked dtype. transformers >= 5.24 otherwise keeps the quantized blocks packed and multiplies
  them with its GGUF kernels in f32 (casting bf16 inputs and outputs at every matmul), another
  computation than vocabjax's dequantized model and than the dense bf16 one that the recorded
  torch-backend speeds and feature comparisons measured. Older releases always dequantize and
  have no `GgufConfig`."""
  import transformers

  config = getattr(transformers, "GgufConfig", None)
  if config is None:
    return {}
  return {"quantization_config": config(gguf_file=Path(path).name, dequantize=True)}
