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
    "qwen3_qknorm": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
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
                      vocab_size: int = 128, with_tokenizer: bool = False) -> Path:
  """Build a TINY_VARIANTS model and `save_pretrained` it (safetensors, and a tokenizer if asked)."""
  model_type, overrides = TINY_VARIANTS[variant]
  if with_tokenizer:
    vocab_size = max(vocab_size, 320)  # byte-level BPE needs 256 bytes + specials + merges
  model = tiny_hf_model(model_type, seed=seed, vocab_size=vocab_size, **overrides)
  directory = Path(directory)
  model.save_pretrained(directory, safe_serialization=True)
  if with_tokenizer:
    tiny_tokenizer(vocab_size).save_pretrained(directory)
  return directory


TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TINY_SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(vocab_size: int = 128, corpus: list[str] | None = None):
  """A byte-level BPE tokenizer trained offline on a few sentences (ids 0-2: pad, bos, eos)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  corpus = corpus or [
      "def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.",
      "Speculative decoding drafts tokens and verifies them in one pass.",
      "for i in range(10):\n    print(i)\n", "Hello world! How are you today?"] * 20
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=TINY_SPECIAL_TOKENS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(corpus, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                 eos_token="</s>")
  fast.chat_template = TINY_CHAT_TEMPLATE
  return fast
