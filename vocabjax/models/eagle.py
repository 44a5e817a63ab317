"""EAGLE-style drafter head (EAGLE-3, Li et al. 2025): one decoder layer that drafts from the
target's own features. This module: the head's params, forward and logits; tree drafting and
the feature hand-over `vocabjax.decoding.eagle`, training `vocabjax.train.eagle`, checkpoints
`vocabjax.checkpoints.eagle3`.

Letters: B batch, T tokens, D head width (= Dt, the target's hidden size), Lf fused target
layers (EAGLE-3: 3; EAGLE-1: 1), V target vocabulary, Vd the head's own vocabulary, H*hd =
query heads x head dim.

    h   = fc(concat of the Lf target features)        [B, T, D]   (skipped when Lf*Dt == D)
    a   = concat(norm_e(embed[token]), norm_h(h))     [B, T, 2D]  q/k/v read this
    x   = decoder layer with residual h               [B, T, D]   fed back as h next step
    logits = lm_head(norm(x))                          [B, T, Vd]  target id = id + d2t[id]

The token embedding is the target's (frozen, never stored with the head). EAGLE-1/2 heads
(`kind="eagle2"`, `vocabjax.checkpoints.eagle2`) fuse embed[token] with the target's final
normed state (or their own output) by `input_fc` at every step, have no input or final norm, and
use the target's LM head. P-EAGLE heads (`mask_token_id` set) add `mask_hidden` [Lf*Dt], the
feature of positions past the newest, so one pass drafts K tokens (`vocabjax.decoding.peagle`);
they may embed with their own trained `embed_tokens`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vocabjax.kernels.cpu_matmul import linear
from vocabjax.kernels.gather import take_rows
from vocabjax.lowering import lowering_of
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import FINAL_NORMED, decoder_layer, rms_norm, step_inputs

KINDS = ("eagle3", "eagle2")


@dataclasses.dataclass(frozen=True)
class EagleConfig:
  layer: LlamaLikeConfig  # the decoder layer's sizes: num_layers 1, vocab_size = target V
  target_hidden_size: int  # Dt
  feature_layers: tuple[int, ...]  # target layers fused (EAGLE-3: low, mid, high)
  draft_vocab_size: int  # Vd
  kind: str = "eagle3"  # or "eagle2": an EAGLE-1/2 head (module doc)
  mask_token_id: int | None = None  # P-EAGLE: the token of the parallel positions (module doc)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind={self.kind!r}: choose one of {KINDS}")
    if self.layer.num_layers != 1:
      raise ValueError(f"an EAGLE head has one decoder layer, got {self.layer.num_layers}")
    if self.kind == "eagle2" and (self.feature_layers != (FINAL_NORMED,)
                                  or self.draft_vocab_size != self.layer.vocab_size):
      raise ValueError("an EAGLE-1/2 head reads the target's final normed hidden state "
                       f"(feature_layers=({FINAL_NORMED},)) and drafts over the target's whole "
                       "LM head (draft_vocab_size = V)")
    if not 1 <= self.draft_vocab_size <= self.layer.vocab_size:
      raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must be in [1, "
                       f"V={self.layer.vocab_size}]")
    if not self.feature_layers:
      raise ValueError("feature_layers is empty: name the target layers the head reads")
    if self.mask_token_id is not None and (self.kind != "eagle3" or not 0 <= self.mask_token_id
                                           < self.layer.vocab_size):
      raise ValueError(f"mask_token_id={self.mask_token_id}: a P-EAGLE head is an EAGLE-3 head "
                       f"whose mask token lies in the vocabulary of V={self.layer.vocab_size}")

  @property
  def parallel(self) -> bool:
    """A P-EAGLE head (module doc)."""
    return self.mask_token_id is not None

  @property
  def hidden_size(self) -> int:
    return self.layer.hidden_size

  @property
  def fused_width(self) -> int:  # Lf * Dt
    return len(self.feature_layers) * self.target_hidden_size

  @property
  def has_fc(self) -> bool:
    """An fc fusing the target's features once (EAGLE-3; EAGLE-1/2's `input_fc` runs in the
    forward at every step instead)."""
    return self.kind == "eagle3" and self.fused_width != self.hidden_size

  def num_params(self, head_rows: int | None = None) -> int:
    """Parameters read per drafted token (the shared embedding excluded): fc, the layer (q/k/v
    read 2D inputs), the norms and `head_rows` LM-head rows (default: its Vd)."""
    c, D = self.layer, self.hidden_size
    width = D if self.kind == "eagle2" else 2 * D  # what q/k/v read
    layer = (width * (c.q_dim + 2 * c.kv_dim) + c.q_dim * D + 3 * D * c.intermediate_size
             + 3 * D)
    fc = D * self.fused_width if self.has_fc else (2 * D * D if self.kind == "eagle2" else 0)
    return fc + layer + D + (self.draft_vocab_size if head_rows is None else head_rows) * D

  def check_target(self, target: LlamaLikeConfig) -> None:
    """ValueError naming the mismatch when this head was not made for `target`."""
    if target.hidden_size != self.target_hidden_size:
      raise ValueError(f"the head reads target features of width {self.target_hidden_size}, "
                       f"the target's hidden size is {target.hidden_size}")
    if target.hidden_size != self.hidden_size:
      raise ValueError(f"the head's width D={self.hidden_size} differs from the target's "
                       f"hidden size {target.hidden_size}: it embeds tokens with the target's "
                       f"embedding")
    if target.vocab_size != self.layer.vocab_size:
      raise ValueError(f"the head maps into a vocabulary of {self.layer.vocab_size} tokens, "
                       f"the target has V={target.vocab_size}")
    if self.kind == "eagle3" and min(self.feature_layers) < 0:
      raise ValueError("the head names no target layers (feature_layers)")
    if max(self.feature_layers) >= target.num_layers:
      raise ValueError(f"the head reads target layers {self.feature_layers}, the target has "
                       f"{target.num_layers} layers")


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
  """EAGLE-3's low / middle / high choice (SpecForge / vLLM default: 1, L/2 - 1, L - 4): what a
  head whose config names no layers was trained on, on any target (below 7 layers it repeats
  or reverses layers, as the authors' code does)."""
  return (1, num_layers // 2 - 1, num_layers - 4)


def training_feature_layers(num_layers: int) -> tuple[int, ...]:
  """The layers a head trained here reads when the job names none: the authors' choice where
  it is three distinct increasing layers (7 layers and more), else low / middle / last of a
  shallow target, each once and in order ((1, 2, 3) on 4 layers, not the authors' (1, 1, 0))."""
  authors = default_feature_layers(num_layers)
  if 0 <= authors[0] < authors[1] < authors[2] < num_layers:
    return authors
  if num_layers <= 3:
    return tuple(range(num_layers))
  return (1, num_layers // 2, num_layers - 1)


def init_eagle(key: jax.Array, config: EagleConfig, dtype=jnp.float32,
               scale: float = 0.02) -> dict:
  c, D = config.layer, config.hidden_size
  keys = iter(jax.random.split(key, 16))

  def normal(shape):
    return (scale * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

  if config.kind == "eagle2":  # no input norm on its layer, no final norm, no LM head
    layer = {"wq": normal((c.q_dim, D)), "wk": normal((c.kv_dim, D)),
             "wv": normal((c.kv_dim, D)), "wo": normal((D, c.q_dim)),
             "mlp_norm": jnp.ones((D,), dtype), "w_gate": normal((c.intermediate_size, D)),
             "w_up": normal((c.intermediate_size, D)), "w_down": normal((D, c.intermediate_size))}
    return {"layer": layer, "input_fc": normal((D, 2 * D)),
            "d2t": jnp.zeros((config.draft_vocab_size,), jnp.int32)}

  layer = {"attn_norm": jnp.ones((D,), dtype), "hidden_norm": jnp.ones((D,), dtype),
           "wq": normal((c.q_dim, 2 * D)), "wk": normal((c.kv_dim, 2 * D)),
           "wv": normal((c.kv_dim, 2 * D)), "wo": normal((D, c.q_dim)),
           "mlp_norm": jnp.ones((D,), dtype), "w_gate": normal((c.intermediate_size, D)),
           "w_up": normal((c.intermediate_size, D)), "w_down": normal((D, c.intermediate_size))}
  params = {"layer": layer, "final_norm": jnp.ones((D,), dtype),
            "lm_head": normal((config.draft_vocab_size, D)),
            "d2t": jnp.zeros((config.draft_vocab_size,), jnp.int32)}
  if config.has_fc:
    params["fc"] = normal((D, config.fused_width))
  if config.parallel:
    params["mask_hidden"] = normal((config.fused_width,))
  return params


def fuse_features(params: dict, features: jax.Array) -> jax.Array:
  """[B, T, Lf*Dt] target features -> [B, T, D] (the fc layer, when there is one)."""
  if "fc" not in params:
    return features
  return linear(features, params["fc"], lowering=lowering_of(params)).astype(features.dtype)


def eagle_forward(params: dict, embed: jax.Array, tokens: jax.Array, hidden: jax.Array,
                  positions: jax.Array, cache: KVCache, mask: jax.Array | None = None, *,
                  config: EagleConfig, prefix_mask: jax.Array | None = None
                  ) -> tuple[jax.Array, KVCache]:
  """One head step over T tokens: `hidden` [B, T, D] is the fused target feature (or the
  head's own previous output); returns the layer output [B, T, D] (pre-norm, the next step's
  `hidden`) and the cache with `lengths + T`. `mask` and `prefix_mask` as in
  `llamalike.forward` (a tree's frontier sees only its ancestors)."""
  c = config.layer
  T = tokens.shape[1]
  e = take_rows(embed, tokens)
  layer = params["layer"]
  if config.kind == "eagle2":  # fc([embedding; feature]) each step, no input norm
    hidden = linear(jnp.concatenate([e.astype(hidden.dtype), hidden], axis=-1),
                    params["input_fc"], lowering=lowering_of(params))
    if "input_fc_bias" in params:
      hidden = hidden + params["input_fc_bias"]
    hidden = hidden.astype(e.dtype)
    attn_in = hidden
  else:
    attn_in = jnp.concatenate([rms_norm(e, layer["attn_norm"], c.rms_norm_eps),
                               rms_norm(hidden, layer["hidden_norm"], c.rms_norm_eps)], axis=-1)
  cos, sin, full_mask, write_b, write_s = step_inputs(tokens, positions, cache, mask,
                                                      prefix_mask, c)
  x, k_all, v_all = decoder_layer(hidden, layer, 0, cache.k, cache.v, write_b, write_s,
                                  full_mask, cos, sin, c, attn_input=attn_in,
                                  lowering=lowering_of(params))
  return x, KVCache(k=k_all, v=v_all, lengths=cache.lengths + T)


def head_output(params: dict, x: jax.Array, *, config: EagleConfig) -> jax.Array:
  """What the LM head reads of the layer output x: its final norm (EAGLE-3), x itself
  (EAGLE-1/2)."""
  if config.kind == "eagle2":
    return x
  return rms_norm(x, params["final_norm"], config.layer.rms_norm_eps)


def eagle_logits(params: dict, x: jax.Array, *, config: EagleConfig,
                 lm_head: jax.Array | None = None) -> jax.Array:
  """[..., Vd] logits over the head's vocabulary (f32); `draft_to_target` maps their ids.
  `lm_head`: the rows to use instead of the head's own (an EAGLE-1/2 head's: the target's)."""
  w = params["lm_head"] if lm_head is None else lm_head
  return linear(head_output(params, x, config=config), w, lowering=lowering_of(params))


def draft_to_target(params: dict, ids: jax.Array) -> jax.Array:
  """Target ids of head-vocabulary ids (EAGLE-3's d2t offsets: target = id + d2t[id])."""
  return ids + jnp.take(params["d2t"], ids)
