"""The same checkpoint through PyTorch / transformers (the comparison runs and torch-computed
training features): a registry name resolves to its cached GGUF, read by transformers' GGUF
loader (dequantized like vocabjax's own loader); an HF directory is read directly."""

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
        path.parent, gguf_file=path.name, dtype=tdtype).eval()
  return transformers.AutoModelForCausalLM.from_pretrained(Path(path), dtype=tdtype).eval()
