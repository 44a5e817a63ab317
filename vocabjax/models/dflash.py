"""DFlash (Chen et al. 2026, arXiv 2602.06036): a block-diffusion drafter that drafts a whole
block of positions in one pass, conditioned on several of the target's layers. This module:
its params and forward, computed as z-lab's `dflash` 0.1.0 (`DFlashDraftModel`) does; the
proposer is `vocabjax.decoding.dflash`, checkpoints `vocabjax.checkpoints.dflash`.

Letters: B batch, bs block size, P pending context entries, D width (= the target's hidden
size), Lf fused target layers, S cache slots, V target vocabulary.

A step's block is [last, mask, ..., mask] at positions N .. N + bs - 1, embedded by the target
times `input_embedding_scale`; position i predicts the token at N + i (bs - 1 drafts a pass):

    c   = hidden_norm(fc(concat of the Lf target features))   [B, P, D] committed positions
    per layer: q = q_norm(wq(norm(x))); k, v = k_norm(wk(.)), wv(.) over [c_cache; norm(x)];
               attention over the context and the whole block (bidirectional; sliding layers
               causal within their window), then the MLP, residuals
    logits = target_lm_head(final_norm(x[:, 1:])) * output_multiplier, soft-capped

The draft cache keeps the context's keys and values (one entry per committed position); the
block's own are attended to, never written. DFlash 2 adds a grouped dynamic causal convolution
around each attention and MLP (`conv_prepare`, `dynamic_conv`) and a candidate selector
(`selector_scores`): conv(x)[t] = sum_{j<K} x[t - j] * (base[j] + delta[t, j, group]);
score(c | prev, h_t) = unary_logit(c) + <pred_code[prev] * (W_sel h_t), succ_code[c]>.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vocabjax.kernels.cpu_matmul import linear
from vocabjax.kernels.gather import take_rows
from vocabjax.lowering import Lowering, lowering_of
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import _proj, apply_rope, norm, rope_cos_sin, write_block


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
  layer: LlamaLikeConfig  # the drafter's decoder (Qwen3 layers: q/k norms); vocab = target V
  target_hidden_size: int  # Dt
  target_layer_ids: tuple[int, ...]  # target layers fused (0-based outputs, as SGLang / z-lab)
  block_size: int = 16  # bs: positions per pass (bs - 1 drafts)
  mask_token_id: int = 0  # the token the block's undrafted positions embed
  input_embedding_scale: float = 1.0
  output_multiplier: float = 1.0
  final_logit_softcapping: float | None = None
  causal: bool | None = None  # None: causal only on sliding layers (the reference's default)
  # DFlash 2: both set (convolutions in every layer, a candidate selector), or neither (DFlash)
  conv_kernel_size: int | None = None  # K causal taps of each dynamic convolution
  conv_group_size: int = 16  # channels sharing one dynamic kernel entry
  selector_rank: int | None = None  # R of the selector's codebooks
  selector_top_k: int = 16  # candidates the selector rescores per position
  # a head of its own over Vd < V rows (`speculators`' draft_vocab_size, with d2t); None: the
  # target's LM head
  draft_vocab_size: int | None = None

  def __post_init__(self):
    if self.block_size < 2:
      raise ValueError(f"block_size={self.block_size}: a DFlash block drafts block_size - 1 "
                       f"tokens and needs at least 2 positions")
    if not self.target_layer_ids:
      raise ValueError("target_layer_ids is empty: name the target layers the drafter reads")
    if not 0 <= self.mask_token_id < self.layer.vocab_size:
      raise ValueError(f"mask_token_id={self.mask_token_id} lies outside the vocabulary of "
                       f"V={self.layer.vocab_size} tokens")
    if self.layer.hidden_size != self.target_hidden_size:
      raise ValueError(f"the drafter's width D={self.layer.hidden_size} differs from the "
                       f"target's hidden size {self.target_hidden_size}: it embeds with the "
                       f"target's embedding")
    if (self.conv_kernel_size is None) != (self.selector_rank is None):
      raise ValueError(f"conv_kernel_size={self.conv_kernel_size}, "
                       f"selector_rank={self.selector_rank}: a DFlash 2 drafter has both its "
                       f"convolutions and its candidate selector, DFlash neither")
    if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size < self.layer.vocab_size:
      raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must lie in 1 .. "
                       f"V - 1 = {self.layer.vocab_size - 1} (V: the target's whole head)")
    if self.dflash2 and self.draft_vocab_size is not None:
      raise ValueError(f"draft_vocab_size={self.draft_vocab_size}: a DFlash 2 drafter's "
                       f"selector ranks the target's whole vocabulary (as speculators defines "
                       f"it); a head of its own is DFlash only")
    if self.dflash2:
      K, g, D = self.conv_kernel_size, self.conv_group_size, self.layer.hidden_size
      if not 1 <= K <= self.block_size:
        raise ValueError(f"conv_kernel_size={K} must lie in 1 .. block_size={self.block_size}")
      if g < 1 or D % g:
        raise ValueError(f"conv_group_size={g} must divide the drafter's width D={D}")
      if self.selector_rank < 1:
        raise ValueError(f"selector_rank={self.selector_rank} must be at least 1")
      if not 1 <= self.selector_top_k <= self.layer.vocab_size:
        raise ValueError(f"selector_top_k={self.selector_top_k} must lie in 1 .. "
                         f"V={self.layer.vocab_size}")

  @property
  def dflash2(self) -> bool:
    return self.conv_kernel_size is not None

  @property
  def conv_groups(self) -> int:
    return self.layer.hidden_size // self.conv_group_size

  @property
  def gamma(self) -> int:
    return self.block_size - 1

  @property
  def fused_width(self) -> int:  # Lf * Dt
    return len(self.target_layer_ids) * self.target_hidden_size

  def is_causal(self, i: int) -> bool:
    return self.layer.is_sliding(i) if self.causal is None else self.causal

  def cache_config(self) -> LlamaLikeConfig:
    """The draft cache's layout: every layer in the linear buffer (a sliding layer's window is
    applied in the mask, `block_forward`)."""
    return self.layer.replace(layer_types=None, sliding_window=None)

  def num_params(self, head_rows: int | None = None) -> int:
    """Parameters read per pass (the shared embedding excluded): fc, the layers, the norms and
    `head_rows` LM-head rows (default V)."""
    c, D = self.layer, self.layer.hidden_size
    per_layer = (D * (c.q_dim + 2 * c.kv_dim) + c.q_dim * D + 3 * D * c.intermediate_size
                 + 2 * D + 2 * c.head_dim)
    if self.dflash2:  # two convolutions per layer; the selector's projection and its rows
      K = self.conv_kernel_size
      per_layer += 2 * (2 * K * D + 2 * K * self.conv_groups * D)
    rows = (head_rows if head_rows is not None else self.draft_vocab_size
            if self.draft_vocab_size is not None else c.vocab_size)
    selector = (self.selector_rank * D + self.gamma * (1 + self.selector_top_k)
                * self.selector_rank if self.dflash2 else 0)
    return D * self.fused_width + c.num_layers * per_layer + 2 * D + rows * D + selector

  def check_target(self, target: LlamaLikeConfig) -> None:
    """ValueError naming the mismatch when this drafter was not made for `target`."""
    if target.hidden_size != self.target_hidden_size:
      raise ValueError(f"the DFlash drafter reads target features of width "
                       f"{self.target_hidden_size}, the target's hidden size is "
                       f"{target.hidden_size}")
    if target.vocab_size != self.layer.vocab_size:
      raise ValueError(f"the DFlash drafter drafts over V={self.layer.vocab_size} tokens, the "
                       f"target has V={target.vocab_size}")
    bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
      raise ValueError(f"target_layer_ids={list(self.target_layer_ids)} name layers {bad} "
                       f"outside the target's {target.num_layers}")


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
  """z-lab's choice when a config names none: evenly from layer 1 to L - 3 (one draft layer:
  the middle one)."""
  if num_draft_layers == 1:
    return (num_target_layers // 2,)
  start, end = 1, num_target_layers - 3
  return tuple(round(start + i * (end - start) / (num_draft_layers - 1))
               for i in range(num_draft_layers))


def init_dflash(key: jax.Array, config: DFlashConfig, dtype=jnp.float32,
                scale: float = 0.02) -> dict:
  c, D = config.layer, config.layer.hidden_size
  keys = iter(jax.random.split(key, 12 * c.num_layers + 8))

  def normal(shape):
    return (scale * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

  layers = []
  for _ in range(c.num_layers):
    layer = {"attn_norm": jnp.ones((D,), dtype), "wq": normal((c.q_dim, D)),
             "wk": normal((c.kv_dim, D)), "wv": normal((c.kv_dim, D)),
             "wo": normal((D, c.q_dim)), "q_norm": jnp.ones((c.head_dim,), dtype),
             "k_norm": jnp.ones((c.head_dim,), dtype), "mlp_norm": jnp.ones((D,), dtype),
             "w_gate": normal((c.intermediate_size, D)), "w_up": normal((c.intermediate_size, D)),
             "w_down": normal((D, c.intermediate_size))}
    if c.attention_bias:
      layer.update(bq=normal((c.q_dim,)), bk=normal((c.kv_dim,)), bv=normal((c.kv_dim,)),
                   bo=normal((D,)))
    if config.dflash2:  # near the identity: tap 0 of each base kernel is one
      K = config.conv_kernel_size
      for name in CONVS:
        layer[f"{name}_base"] = (jnp.zeros((2, K, D), dtype).at[:, 0].set(1)
                                 + normal((2, K, D)))
        layer[f"{name}_proj"] = normal((2 * K * config.conv_groups, D))
    layers.append(layer)
  out = {"layers": layers, "fc": normal((D, config.fused_width)),
         "hidden_norm": jnp.ones((D,), dtype), "final_norm": jnp.ones((D,), dtype)}
  if config.draft_vocab_size is not None:  # its own head over the first Vd target ids
    out["lm_head"] = normal((config.draft_vocab_size, D))
    out["d2t"] = jnp.zeros((config.draft_vocab_size,), jnp.int32)
  if config.dflash2:
    R = config.selector_rank
    out["selector"] = {"pred": normal((c.vocab_size, R)), "succ": normal((c.vocab_size, R)),
                       "proj": normal((R, D))}
  return out


CONVS = ("attn_conv", "mlp_conv")  # DFlash 2's convolutions around the attention and the MLP


def dynamic_conv(x: jax.Array, delta: jax.Array, base: jax.Array, group_size: int
                 ) -> jax.Array:
  """DFlash 2's grouped dynamic causal convolution along the block: x [B, T, D], delta
  [B, T, K, Gr] (one entry per tap and group of `group_size` channels, from position t),
  base [K, D]; out[t] = sum_j x[t - j] * (base[j] + delta[t, j]), zero before the block."""
  K = base.shape[0]
  out = jnp.zeros(x.shape, jnp.float32)
  for j in range(K):
    shifted = x if j == 0 else jnp.pad(x[:, :-j], ((0, 0), (j, 0), (0, 0)))
    coef = (base[j].astype(jnp.float32)
            + jnp.repeat(delta[:, :, j].astype(jnp.float32), group_size, axis=-1))
    out = out + shifted.astype(jnp.float32) * coef
  return out.astype(x.dtype)


def conv_prepare(layer: dict, name: str, h: jax.Array, config: DFlashConfig, lw
                 ) -> tuple[jax.Array, jax.Array]:
  """A sublayer's input convolved with the first kernel, and the second kernel's dynamic part
  [B, T, K, Gr] (from the same input) for `conv_finish`."""
  B, T, _ = h.shape
  K, G = config.conv_kernel_size, config.conv_groups
  delta = linear(h, layer[f"{name}_proj"], lowering=lw).astype(jnp.float32)
  delta = delta.reshape(B, T, 2, K, G)
  return (dynamic_conv(h, delta[:, :, 0], layer[f"{name}_base"][0], config.conv_group_size),
          delta[:, :, 1])


def conv_finish(layer: dict, name: str, out: jax.Array, delta: jax.Array,
                config: DFlashConfig) -> jax.Array:
  return dynamic_conv(out, delta, layer[f"{name}_base"][1], config.conv_group_size)


def selector_context(selector: dict, h: jax.Array, lw: Lowering) -> jax.Array:
  """W_sel h: [..., D] -> [..., R] (f32), each position's part of the selector's scores."""
  return linear(h, selector["proj"], lowering=lw).astype(jnp.float32)


def selector_scores(selector: dict, context: jax.Array, prev: jax.Array, unary: jax.Array,
                    candidates: jax.Array) -> jax.Array:
  """DFlash 2's candidate scores at one position: `unary` [B, k] the head's (scaled) logits of
  `candidates` [B, k] (target ids), `prev` [B] the token drafted before (the block's anchor at
  the first position), `context` [B, R] from `selector_context`. [B, k] f32."""
  pred = take_rows(selector["pred"], prev).astype(jnp.float32) * context
  succ = take_rows(selector["succ"], candidates).astype(jnp.float32)
  return unary.astype(jnp.float32) + jnp.einsum("BR,BKR->BK", pred, succ)


def fuse_context(params: dict, features: jax.Array, config: DFlashConfig) -> jax.Array:
  """[B, T, Lf*Dt] target features -> [B, T, D]: hidden_norm(fc(features))."""
  c = linear(features, params["fc"], lowering=lowering_of(params)).astype(features.dtype)
  return norm(c, params["hidden_norm"], config.layer)


def _kv(layer, h, lw, c: LlamaLikeConfig, cos, sin):
  """Keys (k-normed, rotated) and values [B, T, N, hd] of h [B, T, D]."""
  B, T, _ = h.shape
  k, v = _proj(h, layer, "wk", lw), _proj(h, layer, "wv", lw)
  if c.attention_bias:
    k, v = (k + layer["bk"]).astype(h.dtype), (v + layer["bv"]).astype(h.dtype)
  k = norm(k.reshape(B, T, c.num_kv_heads, c.head_dim), layer["k_norm"], c)
  return apply_rope(k, cos, sin), v.reshape(B, T, c.num_kv_heads, c.head_dim)


def context_prefill(params: dict, features: jax.Array, cache: KVCache, *,
                    config: DFlashConfig) -> KVCache:
  """The context's keys and values of T positions 0 .. T - 1 ([B, T, Lf*Dt] features) written
  at the cache's slots from its lengths; lengths unchanged (the caller sets them)."""
  T = features.shape[1]
  positions = cache.lengths[:, None] + jnp.arange(T)[None]
  return _write_context(params, fuse_context(params, features, config), positions, cache, config)


def _write_context(params, ctx, positions, cache: KVCache, config: DFlashConfig) -> KVCache:
  c, lw = config.layer, lowering_of(params)
  cos, sin = rope_cos_sin(positions, c)
  k_all, v_all = cache.k, cache.v
  for i, layer in enumerate(params["layers"]):
    k, v = _kv(layer, ctx, lw, c, cos, sin)
    k_all = write_block(k_all, i, k, positions[:, 0], per_row=lw.row_writes)
    v_all = write_block(v_all, i, v, positions[:, 0], per_row=lw.row_writes)
  return cache.replace(k=k_all, v=v_all)


def block_masks(config: DFlashConfig, i: int, N: jax.Array, bs: int, S: int
                ) -> tuple[jax.Array, jax.Array]:
  """Which keys block query t (position N + t) sees in layer i: ([B, bs, S] the cache's slots:
  every committed one, < N; [bs, bs] the block's own positions: all of them, causal layers up
  to t), sliding layers within their window (both ways where not causal), as the reference's
  mask."""
  q = N[:, None, None] + jnp.arange(bs)[None, :, None]  # [B, bs, 1] query positions
  s = jnp.arange(S)[None, None, :]
  in_cache = s < N[:, None, None]
  t, u = jnp.arange(bs)[:, None], jnp.arange(bs)[None, :]
  in_block = jnp.ones((bs, bs), jnp.bool_)
  if config.is_causal(i):
    in_block &= u <= t
  if config.layer.is_sliding(i):
    W = config.layer.sliding_window
    in_cache &= q - s < W
    in_block &= t - u < W
    if not config.is_causal(i):
      in_block &= u - t < W
  return in_cache, in_block


def block_forward(params: dict, embed, block: jax.Array, pend_feats: jax.Array,
                  pend_count: jax.Array, cache: KVCache, *, config: DFlashConfig
                  ) -> tuple[jax.Array, KVCache]:
  """One drafting pass. `block` [B, bs] (last, then mask tokens) at positions N .. N + bs - 1,
  N = cache.lengths + pend_count; `pend_feats` [B, P, Lf*Dt] the features of the pending
  committed positions (the first pend_count of each row real). Returns the block's final
  normed hidden states [B, bs, D] and the cache holding the context up to N (lengths N): the
  block's own keys and values are attended to but never written."""
  c, lw = config.layer, lowering_of(params)
  B, bs = block.shape
  L0 = cache.lengths
  N = L0 + pend_count
  S = cache.k.shape[2]
  ctx_pos = L0[:, None] + jnp.arange(pend_feats.shape[1])[None]
  cache = _write_context(params, fuse_context(params, pend_feats, config), ctx_pos, cache,
                         config)
  x = (take_rows(embed, block).astype(pend_feats.dtype)
       * jnp.asarray(config.input_embedding_scale, pend_feats.dtype))
  cos, sin = rope_cos_sin(N[:, None] + jnp.arange(bs)[None], c)
  low = jnp.finfo(jnp.float32).min
  for i, layer in enumerate(params["layers"]):
    h = norm(x, layer["attn_norm"], c)
    if config.dflash2:
      h, delta = conv_prepare(layer, "attn_conv", h, config, lw)
    q = _proj(h, layer, "wq", lw)
    if c.attention_bias:
      q = (q + layer["bq"]).astype(x.dtype)
    q = apply_rope(norm(q.reshape(B, bs, c.num_heads, c.head_dim), layer["q_norm"], c), cos, sin)
    k, v = _kv(layer, h, lw, c, cos, sin)
    qg = q.reshape(B, bs, c.num_kv_heads, c.num_groups, c.head_dim)
    in_cache, in_block = block_masks(config, i, N, bs, S)
    s_cache = jnp.einsum("BTNQe,BSNe->BNQTS", qg, cache.k[i].astype(q.dtype),
                         preferred_element_type=jnp.float32) / c.attn_divisor
    s_block = jnp.einsum("BTNQe,BSNe->BNQTS", qg, k.astype(q.dtype),
                         preferred_element_type=jnp.float32) / c.attn_divisor
    scores = jnp.concatenate([jnp.where(in_cache[:, None, None], s_cache, low),
                              jnp.where(in_block, s_block, low)], axis=-1)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    attn = (jnp.einsum("BNQTS,BSNe->BTNQe", probs[..., :S], cache.v[i].astype(x.dtype))
            + jnp.einsum("BNQTS,BSNe->BTNQe", probs[..., S:], v.astype(x.dtype)))
    out = _proj(attn.reshape(B, bs, c.q_dim), layer, "wo", lw)
    if "bo" in layer:
      out = out + layer["bo"]
    if config.dflash2:
      out = conv_finish(layer, "attn_conv", out, delta, config)
    x = x + out
    h = norm(x, layer["mlp_norm"], c)
    if config.dflash2:
      h, delta = conv_prepare(layer, "mlp_conv", h, config, lw)
    gate, up = _proj(h, layer, "w_gate", lw), _proj(h, layer, "w_up", lw)
    out = _proj(jax.nn.silu(gate) * up, layer, "w_down", lw)
    if config.dflash2:
      out = conv_finish(layer, "mlp_conv", out, delta, config)
    x = x + out
  return norm(x, params["final_norm"], c), cache.with_lengths(N)


def training_forward(params: dict, embed, tokens: jax.Array, features: jax.Array,
                     positions: jax.Array, anchors: jax.Array, *, config: DFlashConfig
                     ) -> jax.Array:
  """Many blocks of a window in one pass, as DFlash is trained (SpecForge's
  `OnlineDFlashModel`): `tokens` [B, T] a window of text at `positions` [B, T] (absolute),
  `features` [B, T, Lf*Dt] the target's at each, `anchors` [B, n] window indices. Block j of row
  b is [tokens[a], mask, ..., mask] at positions positions[a] .. + bs - 1 (a = anchors[b, j]):
  it sees the context entries of the window before a (as at decoding, where the anchor is the
  last committed token and its own features are not computed yet) and its own positions, with
  `block_forward`'s masks. Returns each block's final normed hidden states [B, n, bs, D]: the
  same as `block_forward` over a cache holding the window's entries before a."""
  if config.dflash2:
    raise ValueError("training_forward covers DFlash drafters; DFlash 2's convolutions and "
                     "selector are not trained here")
  c, lw = config.layer, lowering_of(params)
  B, T = tokens.shape
  n, bs = anchors.shape[1], config.block_size
  ctx = fuse_context(params, features, config)
  cos_c, sin_c = rope_cos_sin(positions, c)
  anchor_tok = jnp.take_along_axis(tokens, anchors, axis=1)  # [B, n]
  anchor_pos = jnp.take_along_axis(positions, anchors, axis=1)
  block = jnp.concatenate([anchor_tok[..., None],
                           jnp.full((B, n, bs - 1), config.mask_token_id, jnp.int32)], -1)
  x = (take_rows(embed, block.reshape(B, n * bs)).astype(features.dtype)
       * jnp.asarray(config.input_embedding_scale, features.dtype))
  qpos = (anchor_pos[..., None] + jnp.arange(bs)).reshape(B, n * bs)
  cos, sin = rope_cos_sin(qpos, c)
  # context slot s is visible to block j when s < anchors[b, j] (its position below the block's)
  before = jnp.arange(T)[None, None, :] < anchors[..., None]  # [B, n, T]
  t, u = jnp.arange(bs)[:, None], jnp.arange(bs)[None, :]
  low = jnp.finfo(jnp.float32).min
  for i, layer in enumerate(params["layers"]):
    in_cache = jnp.broadcast_to(before[:, :, None, :], (B, n, bs, T))
    in_block = jnp.ones((bs, bs), jnp.bool_)
    if config.is_causal(i):
      in_block &= u <= t
    if c.is_sliding(i):
      W = c.sliding_window
      qp = qpos.reshape(B, n, bs)[..., None]  # [B, n, bs, 1]
      in_cache &= qp - positions[:, None, None, :] < W
      in_block &= t - u < W
      if not config.is_causal(i):
        in_block &= u - t < W
    ck, cv = _kv(layer, ctx, lw, c, cos_c, sin_c)  # [B, T, N, hd]
    h = norm(x, layer["attn_norm"], c)
    q = _proj(h, layer, "wq", lw)
    if c.attention_bias:
      q = (q + layer["bq"]).astype(x.dtype)
    q = apply_rope(norm(q.reshape(B, n * bs, c.num_heads, c.head_dim), layer["q_norm"], c),
                   cos, sin)
    k, v = _kv(layer, h, lw, c, cos, sin)
    qg = q.reshape(B, n, bs, c.num_kv_heads, c.num_groups, c.head_dim)
    kb = k.reshape(B, n, bs, c.num_kv_heads, c.head_dim)
    vb = v.reshape(B, n, bs, c.num_kv_heads, c.head_dim)
    s_ctx = jnp.einsum("BJTNQe,BSNe->BJNQTS", qg, ck.astype(q.dtype),
                       preferred_element_type=jnp.float32) / c.attn_divisor
    s_blk = jnp.einsum("BJTNQe,BJSNe->BJNQTS", qg, kb.astype(q.dtype),
                       preferred_element_type=jnp.float32) / c.attn_divisor
    scores = jnp.concatenate([jnp.where(in_cache[:, :, None, None], s_ctx, low),
                              jnp.where(in_block, s_blk, low)], axis=-1)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    attn = (jnp.einsum("BJNQTS,BSNe->BJTNQe", probs[..., :T], cv.astype(x.dtype))
            + jnp.einsum("BJNQTS,BJSNe->BJTNQe", probs[..., T:], vb.astype(x.dtype)))
    out = _proj(attn.reshape(B, n * bs, c.q_dim), layer, "wo", lw)
    if "bo" in layer:
      out = out + layer["bo"]
    x = x + out
    h = norm(x, layer["mlp_norm"], c)
    gate, up = _proj(h, layer, "w_gate", lw), _proj(h, layer, "w_up", lw)
    x = x + _proj(jax.nn.silu(gate) * up, layer, "w_down", lw)
  return norm(x, params["final_norm"], c).reshape(B, n, bs, -1)


def scale_logits(logits: jax.Array, config: DFlashConfig) -> jax.Array:
  """The LM head's logits as the drafter's law reads them: times `output_multiplier`, then
  soft-capped (`final_logit_softcapping`), in f32."""
  logits = logits.astype(jnp.float32)
  if config.output_multiplier != 1.0:
    logits = logits * config.output_multiplier
  cap = config.final_logit_softcapping
  if cap is not None and cap > 0:
    logits = jnp.tanh(logits / cap) * cap
  return logits
