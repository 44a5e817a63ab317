"""Tiny random Hugging Face models built offline, for tests and notebooks (needs torch)."""

from __future__ import annotations

import os
from pathlib import Path

# name -> (model_type, config overrides). Sizes are tiny but every switch is exercised.
TINY_VARIANTS = {
    "llama_mha": ("llama", dict(num_attention_heads=4, num_key_value_heads=4)),
    "llama_gqa_llama3rope": ("llama", dict(
        num_attention_heads=8, num_key_value_heads=2,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=64))),
    "llama_mqa_tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=1,
                                     tie_word_embeddings=True)),
    "qwen2_bias": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen2_bias_tied": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2,
                                      tie_word_embeddings=True)),
    "qwen3_qknorm": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
}


def tiny_hf_config(model_type: str, vocab_size: int = 128, **overrides):
  import transformers

  cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
         "qwen3": transformers.Qwen3Config}[model_type]
  kwargs = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1,
                eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
  kwargs.update(overrides)
  return cls(**kwargs)


def tiny_hf_model(model_type: str, seed: int = 0, vocab_size: int = 128, **overrides):
  """A float32 transformers CausalLM with random weights (biases and norms randomized too)."""
  import torch
  import transformers

  torch.manual_seed(seed)
  config = tiny_hf_config(model_type, vocab_size=vocab_size, **overrides)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  with torch.no_grad():  # non-trivial norms and biases, so parity really checks them
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn_like(p))
  return model.eval()


def save_tiny_variant(variant: str, directory: str | os.PathLike, seed: int = 0,
                      vocab_size: int = 128) -> Path:
  """Build a TINY_VARIANTS model and `save_pretrained` it as safetensors; return the directory."""
  model_type, overrides = TINY_VARIANTS[variant]
  model = tiny_hf_model(model_type, seed=seed, vocab_size=vocab_size, **overrides)
  directory = Path(directory)
  model.save_pretrained(directory, safe_serialization=True)
  return directory
