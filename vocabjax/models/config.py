"""Frozen, hashable configuration of the llama-like decoder family.

One dataclass covers Llama 2/3.x (incl. llama3 RoPE scaling), Mistral (every layer over a
sliding window when its config sets one), Qwen2/2.5 (q/k/v bias), Qwen3 (q/k RMSNorm; both
with optional sliding-window layers) and Gemma 3 (text: GELU-tanh MLP, (1 + w) norms around
attention and MLP, a scaled embedding, `query_pre_attn_scalar`, sliding-window layers with
their own RoPE base), with MHA, GQA or MQA and tied or untied LM heads. It is a static argument
to `jax.jit`; derived sizes are properties. Conversion from a Hugging Face `config.json` lives
in `vocabjax.checkpoints.hf_config`, from GGUF metadata in `vocabjax.checkpoints.gguf_io`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ACTIVATIONS = ("silu", "gelu_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class LlamaLikeConfig:
  """Sizes and switches of one llama-like decoder."""

  arch: str  # one of ARCHITECTURES; only names the family, the switches below carry the math
  vocab_size: int  # V
  hidden_size: int  # D
  intermediate_size: int  # F (SwiGLU width)
  num_layers: int  # L
  num_heads: int  # H (query heads)
  num_kv_heads: int  # KV heads; H % KV == 0 (KV == H: MHA, KV == 1: MQA)
  head_dim: int  # per-head width (Qwen3 and Gemma decouple it from D / H)
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_type: str = "default"  # default | linear | llama3 | yarn
  rope_factor: float = 1.0  # linear, llama3 and yarn scaling factor
  rope_low_freq_factor: float = 1.0  # llama3 only
  rope_high_freq_factor: float = 4.0  # llama3 only
  rope_original_max_position: int = 8192  # llama3 and yarn: the pretraining context
  rope_beta_fast: float = 32.0  # yarn only: rotations bounding the extrapolated dimensions
  rope_beta_slow: float = 1.0  # yarn only: rotations bounding the interpolated dimensions
  rope_truncate: bool = True  # yarn only: the correction range rounded to whole dimensions
  rope_attention_factor: float = 1.0  # cos and sin scaled by it (yarn's mscale; else 1)
  rope_freq_factors: tuple[float, ...] | None = None  # GGUF `rope_freqs.weight`: inv_freq /= f
  attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
  qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
  tie_word_embeddings: bool = False  # LM head = token embedding
  max_position_embeddings: int = 4096
  # Gemma 3 (each off by default; `checkpoints.hf_config` sets them from a gemma3_text config):
  hidden_act: str = "silu"  # MLP gate activation: silu (SwiGLU) | gelu_tanh (GeGLU, Gemma)
  norm_unit_offset: bool = False  # RMSNorm scales by (1 + w), in f32 (Gemma's stored w)
  sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma 2/3)
  scale_embeddings: bool = False  # token embedding times sqrt(D), rounded to its dtype (Gemma)
  query_pre_attn_scalar: float | None = None  # scores scaled by this ** -0.5 (default head_dim)
  sliding_window: int | None = None  # W: a sliding layer's query at p sees keys p - W < p' <= p
  layer_types: tuple[str, ...] | None = None  # per layer, one of LAYER_TYPES (None: all full)
  rope_local_theta: float | None = None  # sliding layers' RoPE base (default RoPE; None: theta)

  def __post_init__(self):
    if self.arch not in ARCHITECTURES:
      raise ValueError(f"unknown architecture {self.arch=}; supported: {ARCHITECTURES}")
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"unsupported {self.rope_type=}; supported: {ROPE_TYPES}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
      if getattr(self, name) <= 0:
        raise ValueError(f"config field {name}={getattr(self, name)} must be positive")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"{self.num_heads=} is not a multiple of {self.num_kv_heads=}")
    if self.head_dim % 2:
      raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim=}")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"unsupported {self.hidden_act=}; supported: {ACTIVATIONS}")
    if self.layer_types is not None:
      if len(self.layer_types) != self.num_layers:
        raise ValueError(f"layer_types has {len(self.layer_types)} entries for "
                         f"{self.num_layers} layers")
      bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
      if bad:
        raise ValueError(f"unknown layer types {bad}; supported: {LAYER_TYPES}")
      if "sliding_attention" in self.layer_types and not (self.sliding_window or 0) > 0:
        raise ValueError(f"sliding layers need a positive sliding_window, got "
                         f"{self.sliding_window=}")
    if self.query_pre_attn_scalar is not None and not self.query_pre_attn_scalar > 0:
      raise ValueError(f"query_pre_attn_scalar must be positive, got "
                       f"{self.query_pre_attn_scalar=}")
    if not self.rope_attention_factor > 0:
      raise ValueError(f"rope_attention_factor must be positive, got {self.rope_attention_factor=}")
    if self.rope_type == "yarn" and not (self.rope_factor > 0
                                         and self.rope_original_max_position > 0):
      raise ValueError(f"yarn RoPE needs a positive factor and original context, got "
                       f"{self.rope_factor=} {self.rope_original_max_position=}")
    if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
      raise ValueError(f"rope_freq_factors has {len(self.rope_freq_factors)} entries, "
                       f"expected head_dim // 2 = {self.head_dim // 2}")

  @property
  def q_dim(self) -> int:
    return self.num_heads * self.head_dim

  @property
  def kv_dim(self) -> int:
    return self.num_kv_heads * self.head_dim

  @property
  def num_groups(self) -> int:
    """Query heads per KV head (G)."""
    return self.num_heads // self.num_kv_heads

  @property
  def attn_divisor(self) -> float:
    """What attention scores are divided by: sqrt(head_dim), or Gemma's
    sqrt(query_pre_attn_scalar)."""
    return float(np.sqrt(self.query_pre_attn_scalar or self.head_dim))

  def is_sliding(self, layer: int) -> bool:
    """Whether decoder layer `layer` attends over a sliding window."""
    return self.layer_types is not None and self.layer_types[layer] == "sliding_attention"

  @property
  def has_sliding_layers(self) -> bool:
    return self.layer_types is not None and "sliding_attention" in self.layer_types

  def replace(self, **changes) -> "LlamaLikeConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self, *, include_embedding: bool = True, head_rows: int | None = None) -> int:
    """Parameter count; `head_rows` counts a trimmed LM head of that many rows (VocabTrim MBSU)."""
    D, F, L = self.hidden_size, self.intermediate_size, self.num_layers
    per_layer = D * (self.q_dim + 2 * self.kv_dim) + self.q_dim * D + 3 * D * F + 2 * D
    if self.sandwich_norms:
      per_layer += 2 * D
    if self.attention_bias:
      per_layer += self.q_dim + 2 * self.kv_dim
    if self.qk_norm:
      per_layer += 2 * self.head_dim
    total = L * per_layer + D
    rows = self.vocab_size if head_rows is None else head_rows
    if include_embedding:
      total += self.vocab_size * D
    if not self.tie_word_embeddings or head_rows is not None:
      total += rows * D
    return total

  def rope_scale(self, local: bool = False) -> float:
    """What RoPE's cos and sin are multiplied by (yarn's attention factor; 1 otherwise; a
    sliding layer with its own `rope_local_theta` runs default RoPE, 1)."""
    return 1.0 if local and self.rope_local_theta is not None else self.rope_attention_factor

  def inv_freq(self, local: bool = False) -> np.ndarray:
    """RoPE inverse frequencies [head_dim // 2] in float64 (computed at trace time); `local`:
    a sliding layer's (default RoPE on `rope_local_theta`, Gemma 3's local base)."""
    hd = self.head_dim
    if local and self.rope_local_theta is not None:
      return 1.0 / (self.rope_local_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    inv = 1.0 / (self.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    if self.rope_type == "linear":
      inv = inv / self.rope_factor
    elif self.rope_type == "llama3":
      # Llama 3.1 "rope_type: llama3" (transformers `_compute_llama3_parameters`).
      old = self.rope_original_max_position
      lo, hi, factor = self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_factor
      wavelen = 2 * math.pi / inv
      scaled = np.where(wavelen > old / lo, inv / factor, inv)
      smooth = (old / wavelen - lo) / (hi - lo)
      smoothed = (1 - smooth) * scaled / factor + smooth * scaled
      medium = (wavelen >= old / hi) & (wavelen <= old / lo)
      inv = np.where(medium, smoothed, scaled)
    elif self.rope_type == "yarn":
      # YaRN (Peng et al. 2023; transformers `_compute_yarn_parameters`): dimensions that turn
      # more than beta_fast times over the pretraining context keep their frequency, those under
      # beta_slow are interpolated by the factor, a linear ramp between
      def dim_of(rotations):
        return (hd * math.log(self.rope_original_max_position / (rotations * 2 * math.pi))
                / (2 * math.log(self.rope_theta)))

      low, high = dim_of(self.rope_beta_fast), dim_of(self.rope_beta_slow)
      if self.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
      low, high = max(low, 0), min(high, hd - 1)
      if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
      ramp = np.clip((np.arange(hd // 2, dtype=np.float64) - low) / (high - low), 0, 1)
      inv = inv / self.rope_factor * ramp + inv * (1 - ramp)
    if self.rope_freq_factors is not None:
      inv = inv / np.asarray(self.rope_freq_factors, np.float64)
    return inv
