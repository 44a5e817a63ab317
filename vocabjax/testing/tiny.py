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
    # YaRN RoPE (Qwen2.5's long-context recipe) over an original context of 16 positions
    "qwen2_yarn": ("qwen2", dict(
        num_attention_heads=4, num_key_value_heads=2,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=16))),
    # Mistral: every layer over a window of 8 (Mistral 7B v0.1's 4,096, scaled down)
    "mistral_sliding": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2,
                                        sliding_window=8)),
    # Qwen2 with `use_sliding_window`: layers from `max_window_layers` on slide (window 8)
    "qwen2_sliding": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2,
                                    use_sliding_window=True, sliding_window=8,
                                    max_window_layers=1)),
    # Gemma 3: a sliding layer (window 8, local RoPE base) and a global one (linear-scaled
    # RoPE, as the 4B and up), query_pre_attn_scalar apart from head_dim, tied head.
    "gemma3_sliding": ("gemma3_text", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0,
                                            "factor": 2.0}},
        tie_word_embeddings=True)),
}


def tiny_hf_config(model_type: str, vocab_size: int = 128, **overrides):
  import transformers

  cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
         "qwen2": transformers.Qwen2Config,
         "qwen3": transformers.Qwen3Config,
         "gemma3_text": transformers.Gemma3TextConfig}[model_type]
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
  # Gemma's norms scale by 1 + w: w near 0 is a scale near 1, as the others' w near 1
  norm_base = 0.0 if model_type.startswith("gemma") else 1.0
  with torch.no_grad():  # non-trivial norms and biases, so parity really checks them
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(norm_base + 0.1 * torch.randn_like(p))
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


def llama_cpp_permute(w, n_head: int):
  """llama.cpp convert_hf_to_gguf's q/k row permutation (half-split -> interleaved RoPE pairs)."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def write_tiny_gguf(model, path: str | os.PathLike, qtype: str = "F32", tokenizer=None,
                    state: dict | None = None, sliding_pattern=None,
                    raw: dict | None = None) -> Path:
  """Write a transformers llama/qwen2/qwen3/gemma3_text model as GGUF the way llama.cpp's
  converter does.

  Linear weights are stored as `qtype` ("F32", "F16", "Q8_0", ...); norms and biases stay F32.
  For the llama architecture the q/k rows are permuted as llama.cpp does, so a loader that
  forgets to undo it produces wrong logits. Gemma 3's norms are stored as 1 + w and its four
  norms per layer under llama.cpp's names (`sliding_pattern`: its
  `attention.sliding_window_pattern`, an int or one bool per layer). `state` overrides the
  model's state dict (tests of broken files); `raw` maps GGUF tensor names to (bytes [rows,
  row bytes] uint8, type name) written instead (a type this writer cannot quantize).
  """
  import gguf
  import numpy as np

  cfg = model.config
  arch = {"gemma3_text": "gemma3"}.get(cfg.model_type, cfg.model_type)
  H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
  head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
  rope = getattr(cfg, "rope_parameters", None) or {}
  rope = rope.get("full_attention", rope)  # gemma3: per layer type
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_name("tiny")
  writer.add_block_count(cfg.num_hidden_layers)
  writer.add_context_length(cfg.max_position_embeddings)
  writer.add_embedding_length(cfg.hidden_size)
  writer.add_feed_forward_length(cfg.intermediate_size)
  writer.add_head_count(H)
  writer.add_head_count_kv(KV)
  writer.add_key_length(head_dim)
  writer.add_value_length(head_dim)
  writer.add_rope_dimension_count(head_dim)
  writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
  writer.add_vocab_size(cfg.vocab_size)
  if rope.get("rope_type") == "yarn":  # llama.cpp's converter writes these three
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
  if arch == "gemma3":
    writer.add_sliding_window(cfg.sliding_window)
    if sliding_pattern is not None:
      writer.add_sliding_window_pattern(sliding_pattern)
  if tokenizer is not None:
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    tokens += [f"[PAD{i}]" for i in range(cfg.vocab_size - len(tokens))]
    merges = [" ".join(m) if isinstance(m, (list, tuple)) else m for m in
              __import__("json").loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in tokenizer.all_special_tokens else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    if getattr(tokenizer, "chat_template", None):
      writer.add_chat_template(tokenizer.chat_template)
  names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
  per_layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
               "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
               "self_attn.q_norm.weight": "attn_q_norm.weight",
               "self_attn.k_norm.weight": "attn_k_norm.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
  if arch == "gemma3":
    per_layer.update({"post_attention_layernorm.weight": "post_attention_norm.weight",
                      "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                      "post_feedforward_layernorm.weight": "post_ffw_norm.weight"})
  qt = gguf.GGMLQuantizationType[qtype]
  state = dict(model.state_dict() if state is None else state)
  if cfg.tie_word_embeddings:
    state.pop("lm_head.weight", None)
  for name, tensor in state.items():
    w = tensor.detach().float().numpy()
    if name in names:
      gname = names[name]
    else:
      parts = name.split(".")
      gname = f"blk.{parts[2]}.{per_layer['.'.join(parts[3:])]}"
    if arch == "llama" and gname.endswith(("attn_q.weight", "attn_q.bias")):
      w = llama_cpp_permute(w, H)
    elif arch == "llama" and gname.endswith(("attn_k.weight", "attn_k.bias")):
      w = llama_cpp_permute(w, KV)
    elif arch == "gemma3" and gname.endswith("norm.weight"):
      w = w + 1.0  # llama.cpp's Gemma converter stores Gemma3RMSNorm's 1 + w
    if raw and gname in raw:
      data, raw_type = raw[gname]
      writer.add_tensor(gname, data, raw_dtype=gguf.GGMLQuantizationType[raw_type])
    elif w.ndim == 2 and qt != gguf.GGMLQuantizationType.F32:
      writer.add_tensor(gname, quantize_blocks(w, qtype), raw_dtype=qt)
    else:
      writer.add_tensor(gname, np.ascontiguousarray(w, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return Path(path)


def quantize_blocks(w, qtype: str):
  """[rows, cols] f32 -> GGUF blocks [rows, row bytes] uint8 of `qtype`: `gguf`'s quantizer
  where it has one (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), else a plain round-to-nearest encoder of the
  K types' layout (Q4_K, Q5_K, Q6_K; not llama.cpp's search for the best scales, which only
  changes how close the values come, not the format `gguf.quants.dequantize` reads)."""
  import gguf
  import numpy as np

  w = np.asarray(w, np.float32)
  if qtype not in ("Q4_K", "Q5_K", "Q6_K"):
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
  rows, cols = w.shape
  x = w.reshape(rows, cols // 256, 256)
  f16 = lambda v: np.asarray(v, np.float32).astype(np.float16)  # noqa: E731
  if qtype == "Q6_K":
    sub = x.reshape(*x.shape[:2], 16, 16)
    amax = np.abs(sub).max(-1)  # [r, b, 16]
    d = f16(amax.max(-1) / 32 / 127)
    df = d.astype(np.float32)[..., None]
    sc = np.clip(np.round(np.divide(amax / 32, df, out=np.zeros_like(amax), where=df > 0)),
                 -127, 127)
    step = (df * sc)[..., None]
    q = np.clip(np.round(np.divide(sub, step, out=np.zeros_like(sub), where=step > 0)) + 32,
                0, 63).astype(np.uint8).reshape(*x.shape[:2], 2, 4, 32)  # half, quarter, l
    ql = np.concatenate([(q[:, :, :, 0] & 15) | ((q[:, :, :, 2] & 15) << 4),
                         (q[:, :, :, 1] & 15) | ((q[:, :, :, 3] & 15) << 4)], axis=-1)
    qh = ((q[:, :, :, 0] >> 4) | ((q[:, :, :, 1] >> 4) << 2) | ((q[:, :, :, 2] >> 4) << 4)
          | ((q[:, :, :, 3] >> 4) << 6))
    blocks = np.concatenate([ql.reshape(*x.shape[:2], 128), qh.reshape(*x.shape[:2], 64),
                             sc.astype(np.int8).view(np.uint8), d[..., None].view(np.uint8)],
                            axis=-1)
    return blocks.reshape(rows, -1)
  levels = 15 if qtype == "Q4_K" else 31
  sub = x.reshape(*x.shape[:2], 8, 32)
  lo, hi = np.minimum(sub.min(-1), 0), np.maximum(sub.max(-1), 0)  # [r, b, 8]
  scale, mins = (hi - lo) / levels, -lo
  d, dmin = f16(scale.max(-1) / 63), f16(mins.max(-1) / 63)
  df, dmf = d.astype(np.float32)[..., None], dmin.astype(np.float32)[..., None]
  sc = np.clip(np.round(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 63)
  m = np.clip(np.round(np.divide(mins, dmf, out=np.zeros_like(mins), where=dmf > 0)), 0, 63)
  step, off = (df * sc)[..., None], (dmf * m)[..., None]
  q = np.clip(np.round(np.divide(sub + off, step, out=np.zeros_like(sub), where=step > 0)),
              0, levels).astype(np.uint8)  # [r, b, 8, 32]
  sc, m = sc.astype(np.uint8), m.astype(np.uint8)
  s12 = np.zeros((*x.shape[:2], 12), np.uint8)
  s12[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
  s12[..., 4:8] = (m[..., 0:4] & 63) | ((m[..., 4:8] >> 4) << 6)
  s12[..., 8:12] = (sc[..., 4:8] & 15) | ((m[..., 4:8] & 15) << 4)
  qs = ((q[:, :, 0::2] & 15) | ((q[:, :, 1::2] & 15) << 4)).reshape(*x.shape[:2], 128)
  parts = [d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), s12]
  if qtype == "Q5_K":
    bits = (q >> 4) & 1  # [r, b, 8, 32]: bit s of qh[l]
    parts.append((bits << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=-2, dtype=np.uint8))
  return np.concatenate(parts + [qs], axis=-1).reshape(rows, -1)
