"""Pure-functional llama-like decoder: Llama 2/3.x, Qwen2/2.5, Qwen3, Gemma 3 (text).

Letters: B batch, T query length, S cache slots, D model dim, F MLP width, V vocab,
H query heads, N key/value heads, Q = H / N query heads per KV head, hd head dim (e in einsum
strings), L layers (the package-wide legend: docs/engine.md, "Letters").

Params are a plain pytree: `layers` is a list of per-layer dicts and the layer loop is unrolled
at trace time (stacked weights under `lax.scan` copy each slice on XLA:CPU, slower in
memory-bound decoding), except for GGUF blocks on XLA:CPU, whose layers run as one loop body
with the layer an operand of the kernels (`loops_layers`, docs/engine.md "The layer loop");
linear weights are stored [out, in] as in PyTorch (`'BTD,FD->BTF'`), whose matvec is faster
there (docs/engine.md, 'Layout'). The embedding and the LM head are [V, D],
so a vocabulary policy can index LM-head rows directly. A traced program's
`vocabjax.lowering.Lowering` travels in the params under `lowering.KEY`: `forward` (which returns
the final *normed* hidden state) and `lm_head` lower their projections and cache writes as it
says. Gemma 3 (`config.arch == "gemma3"`) is the same loop with its switches on: (1 + w) norms in
f32, post-attention and post-MLP norms, GELU-tanh, the embedding scaled by sqrt(D), scores by
`query_pre_attn_scalar ** -0.5`, and sliding layers (`config.layer_types`) with RoPE on
`rope_local_theta`, kept in a ring past window + `models.cache.RING_SLACK` slots (`ring_mask`,
`write_block`) and masked below it (`window_mask`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.kernels.cpu_matmul import (attention, available, layer_linear, layer_weights_ok,
                                         linear, row_sum_squares, uses_attention)
from vocabjax.kernels.blocks import dequantize, grouped_int4, is_blocks, quantize
from vocabjax.kernels.gather import take_rows
from vocabjax.lowering import Lowering, lowering_of
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig

Params = dict


def init_params(key: jax.Array, config: LlamaLikeConfig, dtype=jnp.float32,
                scale: float = 0.02) -> Params:
  """Random params with the real shapes (tests, and speed work on random weights)."""
  c = config
  L, D, F = c.num_layers, c.hidden_size, c.intermediate_size
  counter = iter(range(1 << 30))

  def normal(shape):
    k = jax.random.fold_in(key, next(counter))
    return (scale * jax.random.normal(k, shape, jnp.float32)).astype(dtype)

  # Gemma's norms store w of a (1 + w) scale: zeros are the identity, as transformers inits them
  norm_init = jnp.zeros if c.norm_unit_offset else jnp.ones

  def layer():
    p = {
        "attn_norm": norm_init((D,), dtype),
        "wq": normal((c.q_dim, D)),
        "wk": normal((c.kv_dim, D)),
        "wv": normal((c.kv_dim, D)),
        "wo": normal((D, c.q_dim)),
        "mlp_norm": norm_init((D,), dtype),
        "w_gate": normal((F, D)),
        "w_up": normal((F, D)),
        "w_down": normal((D, F)),
    }
    if c.attention_bias:
      p.update(bq=normal((c.q_dim,)), bk=normal((c.kv_dim,)), bv=normal((c.kv_dim,)))
    if c.qk_norm:
      p.update(q_norm=norm_init((c.head_dim,), dtype), k_norm=norm_init((c.head_dim,), dtype))
    if c.sandwich_norms:
      p.update(post_attn_norm=norm_init((D,), dtype), post_mlp_norm=norm_init((D,), dtype))
    return p

  layers = [layer() for _ in range(L)]
  params = {"embed": normal((c.vocab_size, D)), "layers": layers,
            "final_norm": norm_init((D,), dtype)}
  if not c.tie_word_embeddings:
    params["lm_head"] = normal((c.vocab_size, D))
  return params


def param_shapes(config: LlamaLikeConfig) -> dict:
  """The expected shape of every param leaf (checkpoint loaders validate against it)."""
  return jax.tree.map(lambda x: tuple(x.shape),
                      jax.eval_shape(lambda: init_params(jax.random.key(0), config)))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float,
             lowering: Lowering | None = None) -> jax.Array:
  """RMSNorm computed in f32, scaled in the input dtype (as transformers' LlamaRMSNorm); the
  mean of squares by `mean_square` under `lowering`."""
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(mean_square(x32, lowering) + eps)
  return weight * x32.astype(x.dtype)


def mean_square(x32: jax.Array, lowering: Lowering | None = None) -> jax.Array:
  """mean(x^2) over the last axis, keepdims. XLA:CPU sums a row in an order that depends on
  how many rows the array has (a decoding step's one token against a verified block's four:
  1 ulp apart), so a block's hidden states would not be its one-token states bit for bit (the
  attention over the cache is the other such place: `cpu_matmul.attention`); where `lowering`
  runs the CPU kernel, each row's sum is the kernel's (its fixed order, whatever the number of
  rows: `cpu_matmul.row_sum_squares`)."""
  if lowering is not None and lowering.platform == "cpu" and lowering.cpu_kernel:
    total = row_sum_squares(x32)
    if total is not None:
      return total / x32.shape[-1]
  return jnp.mean(x32 * x32, axis=-1, keepdims=True)


def norm(x: jax.Array, weight: jax.Array, config: LlamaLikeConfig,
         lowering: Lowering | None = None) -> jax.Array:
  """The model's RMSNorm: `rms_norm`, or with `config.norm_unit_offset` Gemma's: x / rms(x)
  times (1 + w), all in f32, then cast to x's dtype (transformers' Gemma3RMSNorm).
  `lowering`: the program's (`mean_square`)."""
  if not config.norm_unit_offset:
    return rms_norm(x, weight, config.rms_norm_eps, lowering)
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(mean_square(x32, lowering) + config.rms_norm_eps)
  return (x32 * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def rope_cos_sin(positions: jax.Array, config: LlamaLikeConfig, local: bool = False
                 ) -> tuple[jax.Array, jax.Array]:
  """cos, sin [B, T, d] for integer positions [B, T] (half-split "neox" layout); `local`: a
  sliding layer's RoPE (`LlamaLikeConfig.inv_freq`); both scaled by `config.rope_scale`
  (yarn's attention factor) when it is not 1."""
  inv_freq = jnp.asarray(config.inv_freq(local), jnp.float32)
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  scale = config.rope_scale(local)
  if scale == 1.0:
    return jnp.cos(emb), jnp.sin(emb)
  return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x [B, T, heads, d] rotated by cos/sin [B, T, d]."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


def attention_mask(lengths: jax.Array, T: int, S: int, block_mask: jax.Array | None = None,
                   prefix_mask: jax.Array | None = None) -> jax.Array:
  """Which cache slots each new query may see: [B, T, S] bool.

  Slots before `lengths[b]` are visible (restricted to `prefix_mask[b, t, s]` when given: a
  drafter expanding a tree sees only its node's ancestors among the earlier tree slots). The T
  new entries sit at slots `lengths[b] + t`; among them query t sees t' where
  `block_mask[b, t, t']` holds (default: causal, t' <= t). Tree verification passes its
  ancestor mask as `block_mask`.
  """
  if block_mask is None:
    block_mask = jnp.tril(jnp.ones((T, T), jnp.bool_))[None]
  slots = jnp.arange(S)[None, None, :]  # [1, 1, S]
  start = lengths[:, None, None]  # [B, 1, 1]
  rel = slots - start  # [B, 1, S]
  in_block = (rel >= 0) & (rel < T)
  block_mask = jnp.broadcast_to(block_mask, (lengths.shape[0], T, T))
  seen = jnp.take_along_axis(block_mask, jnp.broadcast_to(jnp.clip(rel, 0, T - 1),
                                                          (lengths.shape[0], T, S)), axis=2)
  before = slots < start
  if prefix_mask is not None:
    before = before & prefix_mask
  return before | (in_block & seen)


PREFILL_CHUNK = 128  # query rows per attention chunk of a fresh prefill (`fresh_attention`)


def _within_window(slots: jax.Array, lengths: jax.Array, positions: jax.Array, window: int
                   ) -> jax.Array:
  """[B, T, X]: whether the key that each cache slot of `slots` [B, X] holds lies within
  `window - 1` positions before each query (at `positions` [B, T]). A committed slot
  s < lengths[b] holds position s (the cache is kept compact: accepted tree paths are
  compacted, rejected entries dropped); a slot of this call's block holds its token's
  position."""
  T = positions.shape[1]
  rel = slots - lengths[:, None]
  block_pos = jnp.take_along_axis(positions, jnp.clip(rel, 0, T - 1), axis=1)
  key_pos = jnp.where(rel >= 0, block_pos, slots)
  return positions[:, :, None] - key_pos[:, None, :] < window


def window_mask(mask: jax.Array, lengths: jax.Array, positions: jax.Array, window: int
                ) -> jax.Array:
  """`mask` [B, T, S] (`attention_mask`) restricted to a sliding window (`_within_window`;
  slots past the block are masked already). A drafter expanding a tree into slots past the
  committed ones (its `prefix_mask`) is read with slot = position, an overestimate of those
  nodes' positions by at most the tree's size: it can only keep a key that is up to that many
  positions too old, in a drafter's proposal, which verification corrects."""
  B, T, S = mask.shape
  slots = jnp.broadcast_to(jnp.arange(S)[None, :], (B, S))
  return mask & _within_window(slots, lengths, positions, window)


def ring_slots(lengths: jax.Array, T: int, ring: int) -> jax.Array:
  """[B, R]: the linear slot each ring slot holds after a call writes T entries at `lengths`:
  the latest slot s < lengths + T with s = r (mod R); negative where none was written yet."""
  top = (lengths + T - 1)[:, None]
  return top - (top - jnp.arange(ring)[None, :]) % ring


def ring_mask(mask: jax.Array, lengths: jax.Array, positions: jax.Array, window: int,
              ring: int) -> jax.Array:
  """`window_mask` over a sliding layer's ring (`models.cache`): [B, T, R], the linear mask
  [B, T, S] read at the slot each ring slot holds (`ring_slots`)."""
  B, T, S = mask.shape
  slots = ring_slots(lengths, T, ring)  # [B, R]
  seen = jnp.take_along_axis(mask, jnp.broadcast_to(jnp.clip(slots, 0, S - 1)[:, None, :],
                                                    (B, T, ring)), axis=2)
  near = _within_window(slots, lengths, positions, window)
  return seen & near & (slots >= 0)[:, None, :]


def fresh_attention(q: jax.Array, k: jax.Array, v: jax.Array, divisor: float | None = None,
                    window: int | None = None) -> jax.Array:
  """Causal attention of a block over itself alone, for a prefill into an empty cache:
  q [B, T, N, Q, hd], k and v [B, T, N, hd] -> [B, T, N, Q, hd] f32-accumulated scores.

  The same result as attending over all S cache slots with the causal mask, computed in chunks
  of `PREFILL_CHUNK` queries, each over the keys up to its own end (about half the score
  entries, none of the empty slots), with the operands laid out [B, N, ., hd] for batched GEMMs
  (docs/engine.md, 'CPU speed'). `divisor`: what scores are divided by (default sqrt(hd));
  `window`: a sliding layer's window (a query at t sees t - window < t' <= t).
  """
  B, T, N, Q, hd = q.shape
  divisor = np.sqrt(hd) if divisor is None else divisor
  qt = q.transpose(0, 2, 3, 1, 4)  # [B, N, Q, T, hd]
  kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, N, T, hd]
  outs = []
  for s in range(0, T, PREFILL_CHUNK):
    end = min(s + PREFILL_CHUNK, T)
    lo = 0 if window is None else max(0, s - window + 1)  # keys no query of the chunk sees
    scores = jnp.einsum("BNQTe,BNSe->BNQTS", qt[:, :, :, s:end], kt[:, :, lo:end],
                        preferred_element_type=jnp.float32) / divisor
    keys, queries = jnp.arange(lo, end)[None, :], jnp.arange(s, end)[:, None]
    causal = keys <= queries
    if window is not None:
      causal = causal & (queries - keys < window)
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    outs.append(jnp.einsum("BNQTS,BNSe->BNQTe", probs, vt[:, :, lo:end]))
  return jnp.concatenate(outs, axis=3).transpose(0, 3, 1, 2, 4)


def _summed_attention(q, k, v, mask, divisor, dtype):
  """`Lowering.sum_attention`: the einsum attention of `decoder_layer` as products summed, over
  the cache in its stored [B, S, N, hd] layout. q [B, T, N, Q, hd], k / v [B, S, N, hd], mask
  [B, T, S] -> [B, T, N, Q, hd]. Scores and the softmax in f32, probabilities cast to `dtype`
  before they weight the values, as the einsum path does."""
  qf = q.astype(jnp.float32)
  scores = (qf[:, :, None] * k.astype(jnp.float32)[:, None, :, :, None, :]).sum(-1)
  scores = scores / divisor  # [B, T, S, N, Q]
  scores = jnp.where(mask[:, :, :, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=2).astype(dtype)
  return (probs[..., None].astype(jnp.float32) * v.astype(dtype).astype(jnp.float32)[
      :, None, :, :, None, :]).sum(2).astype(dtype)


def decoder_layer(x, layer, i, k_all, v_all, write_b, write_s, mask, cos, sin, config,
                  attn_input=None, fresh=False, lowering: Lowering = Lowering(),
                  cache_index: int | None = None, ring: int | None = None,
                  valid: jax.Array | None = None):
  """Decoder layer i. x [B,T,D]; k_all/v_all [L,B,S,N,hd] get its T new entries written.

  `cache_index`: the layer's index in k_all/v_all (default i); `ring`: k_all/v_all are a
  sliding layer's ring of that many slots (`models.cache`), written at slot mod ring, and
  `mask` is over the ring's slots; `valid` [B]: the rows' real entries of a fresh prefill
  (`write_block`).

  `attn_input`: what the q/k/v projections read instead of norm(x) (an EAGLE head feeds its
  normed token embedding and target feature side by side, [B, T, 2D]); x stays the residual.
  `fresh`: the cache held nothing before this block (a prefill): attention runs over the
  block's own keys, causally (`fresh_attention`), and `mask` is not read.
  `lowering`: how its projections and cache writes lower (`vocabjax.lowering`).
  """
  c, lw = config, lowering
  B, T, _ = x.shape
  h = norm(x, layer["attn_norm"], c, lw) if attn_input is None else attn_input
  q, k, v = (_proj(h, layer, name, lw) for name in ("wq", "wk", "wv"))
  if c.attention_bias:
    q, k, v = (q + layer["bq"]).astype(x.dtype), (k + layer["bk"]).astype(x.dtype), (
        v + layer["bv"]).astype(x.dtype)
  q = q.reshape(B, T, c.num_heads, c.head_dim)
  k = k.reshape(B, T, c.num_kv_heads, c.head_dim)
  v = v.reshape(B, T, c.num_kv_heads, c.head_dim)
  if c.qk_norm:
    q = norm(q, layer["q_norm"], c, lw)
    k = norm(k, layer["k_norm"], c, lw)
  q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

  ci = i if cache_index is None else cache_index
  k_all = write_block(k_all, ci, k, write_s[:, 0], per_row=lw.row_writes, ring=ring,
                      valid=valid)
  v_all = write_block(v_all, ci, v, write_s[:, 0], per_row=lw.row_writes, ring=ring,
                      valid=valid)

  q = q.reshape(B, T, c.num_kv_heads, c.num_groups, c.head_dim)
  if fresh:  # the values the cache holds, as the general path reads them back
    attn = fresh_attention(q, k.astype(k_all.dtype).astype(q.dtype),
                           v.astype(v_all.dtype).astype(x.dtype), c.attn_divisor,
                           c.sliding_window if c.is_sliding(i) else None)
  elif lw.sum_attention:
    attn = _summed_attention(q, k_all[ci], v_all[ci], mask, c.attn_divisor, x.dtype)
    # this layer's reads of the caches happen before the next layer's writes (no copies)
    k_all, v_all, attn = jax.lax.optimization_barrier((k_all, v_all, attn))
  elif uses_attention(q.dtype, k_all.dtype, lw):  # the same bits at any block size
    attn = attention(q, k_all, v_all, mask, c.attn_divisor, layer=ci).astype(x.dtype)
  else:
    scores = jnp.einsum("BTNQe,BSNe->BNQTS", q, k_all[ci].astype(q.dtype),
                        preferred_element_type=jnp.float32) / c.attn_divisor
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    attn = jnp.einsum("BNQTS,BSNe->BTNQe", probs, v_all[ci].astype(x.dtype))
  out = _proj(attn.reshape(B, T, c.q_dim), layer, "wo", lw)
  if c.sandwich_norms:
    out = norm(out, layer["post_attn_norm"], c, lw)
  x = x + out

  h = norm(x, layer["mlp_norm"], c, lw)
  # up's weights widened (a prefill above the kernel's rows) only once gate's product exists:
  # one widened MLP matrix at a time in the program's buffers, not two
  gate = _proj(h, layer, "w_gate", lw)
  up = _proj(h, layer, "w_up", lw, after=gate)
  act = jax.nn.silu(gate) if c.hidden_act == "silu" else jax.nn.gelu(gate, approximate=True)
  out = _proj(act * up, layer, "w_down", lw)
  if c.sandwich_norms:
    out = norm(out, layer["post_mlp_norm"], c, lw)
  return x + out, k_all, v_all


def write_block(buf: jax.Array, i: int, new: jax.Array, start: jax.Array, *,
                per_row: bool = False, ring: int | None = None,
                valid: jax.Array | None = None) -> jax.Array:
  """buf [L, B, S, N, hd] with layer i's row b given new[b] [T, N, hd] at slots start[b] ..
  start[b] + T - 1 (the caller guarantees start + T <= S). Batch 1: a dynamic-update-slice
  (in place); a batch: an indexed scatter, or with `per_row` (`Lowering.row_writes`, set by
  decoders on a mesh) one dynamic-update-slice per row (vmapped): XLA partitions those along
  a "data" axis that splits the batch, where the indexed scatter made every step gather all
  rows' indices and entries and permute them between devices. Off a mesh the indexed scatter
  stays: on one CPU device the vmapped form (a scatter with batching dimensions) is not
  updated in place and made a batch-4 cross-vocabulary step several times slower.
  `ring`: buf is a ring of that many slots (`models.cache`): slot s goes to s mod ring, by an
  indexed scatter (with `per_row`, one per row, vmapped: partitioned along "data" as above,
  where the batch's scatter gathered every row's slots and entries). `valid` [B] (a
  right-padded prefill's prompt lengths): row b writes only its entries t in
  [valid[b] - ring, valid[b]), so neither padding nor a prompt longer than
  the ring overwrites what its last `ring` real entries left (without it every entry is
  written, the later ones last: a verification block, whose rejected tail the window never
  shows, `models.cache`)."""
  new = new.astype(buf.dtype)
  B, T = new.shape[:2]
  if ring is not None:
    t = jnp.arange(T)[None]
    end = jnp.full((B, 1), T) if valid is None else valid[:, None]
    keep = (t < end) & (t >= end - ring)
    slots = jnp.where(keep, (start[:, None] + t) % ring, ring)  # ring: dropped
    if per_row:
      def ring_row(b_buf, b_new, s):  # b_buf [L, R, N, hd], b_new [T, N, hd], s [T]
        return b_buf.at[i, s].set(b_new, mode="drop")

      return jax.vmap(ring_row, in_axes=(1, 0, 0), out_axes=1)(buf, new, slots)
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
    return buf.at[i, rows, slots].set(new, mode="drop")
  if B == 1:
    return jax.lax.dynamic_update_slice(buf, new[None], (i, 0, start[0], 0, 0))
  if not per_row:
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
    return buf.at[i, rows, start[:, None] + jnp.arange(T)[None]].set(new)

  def row(b_buf, b_new, s):  # b_buf [L, S, N, hd], b_new [T, N, hd]
    return jax.lax.dynamic_update_slice(b_buf, b_new[None], (i, s, 0, 0))

  return jax.vmap(row, in_axes=(1, 0, 0), out_axes=1)(buf, new, start)


def _proj(x, layer, name, lowering: Lowering, after=None):
  """x [B, T, in] through weight `name`: stored [out, in] (the CPU kernel's or XLA's dot, see
  `vocabjax.kernels.cpu_matmul.linear`), or (MLP, as `name_t`) [in, out] for XLA's GEMM. The
  result has x's dtype (f32 activations with bf16 weights stay f32). `after`: what a widening
  of blocks waits for (`linear`'s)."""
  if name + "_t" in layer:
    return jnp.einsum("BTI,IO->BTO", x, layer[name + "_t"]).astype(x.dtype)
  if isinstance(layer[name], _LayerOf):
    return layer_linear(x, layer[name].weights, layer[name].layer, lowering,
                        after).astype(x.dtype)
  return linear(x, layer[name], layer.get(name + SCALE), lowering=lowering,
                after=after).astype(x.dtype)



MLP_LAYOUTS = ("out_in", "in_out")
_MLP = ("w_gate", "w_up", "w_down")


def with_mlp_layout(params: Params, layout: str) -> Params:
  """The same model with its MLP weights stored `layout` (`params` itself when they already
  are, else a transposed copy).

  `out_in` ([out, in], PyTorch's) is what checkpoints load as and is fastest for one-token
  decode steps on XLA:CPU (a matvec). For blocks of T > 1 tokens (verification, tree drafting)
  XLA:CPU's GEMM repacks an [out, in] weight on every call, so with the CPU kernel off `in_out`
  is faster there (docs/engine.md, 'Layout'). Other backends choose layouts themselves; keep
  `out_in` there.
  """
  if layout not in MLP_LAYOUTS:
    raise ValueError(f"unknown MLP layout {layout=}; choose one of {MLP_LAYOUTS}")
  if mlp_layout(params) == layout or (layout == "in_out" and is_quantized(params)):
    return params  # quantized weights stay [out, in] rows (int8 with their scales, GGUF blocks)
  layers = []
  for layer in params["layers"]:
    layer = dict(layer)
    for name in _MLP:
      if layout == "in_out" and name in layer:
        layer[name + "_t"] = jnp.asarray(layer.pop(name).T)
      elif layout == "out_in" and name + "_t" in layer:
        layer[name] = jnp.asarray(layer.pop(name + "_t").T)
    layers.append(layer)
  return {**params, "layers": layers}


def mlp_layout(params: Params) -> str:
  return "in_out" if "w_gate_t" in params["layers"][0] else "out_in"


def forward(params: Params, tokens: jax.Array, positions: jax.Array, cache: KVCache,
            mask: jax.Array | None = None, *, config: LlamaLikeConfig,
            prefix_mask: jax.Array | None = None, fresh: bool = False,
            valid_lengths: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
  """Run T new tokens per row through the decoder and append their keys/values to the cache.

  Args:
    params: the model pytree (`init_params` layout).
    tokens: [B, T] int token ids.
    positions: [B, T] int RoPE positions (a tree passes depth-based positions).
    cache: KVCache whose rows hold `cache.lengths[b]` committed entries; the new entries are
      written at slots `lengths[b] + t`. The caller guarantees `lengths + T <= S`.
    mask: optional [B, T, T] (or [1, T, T]) bool attention among the new tokens; causal if None.
    config: static model config.
    prefix_mask: optional [B, T, S] bool restricting which of the `lengths[b]` earlier slots
      each new token sees (default: all of them).
    fresh: the caller guarantees every row's cache is empty (`lengths` 0: a prompt's
      prefill); attention then runs causally over the block alone (`fresh_attention`, several
      times faster than over the S slots). Needs mask and prefix_mask None.
    valid_lengths: [B] int, with `fresh`: each row's real tokens of the right-padded block
      (its prompt length). Required when the cache keeps sliding layers in a ring
      (`models.cache`), where padding must not overwrite a row's entries; ignored otherwise.

  Returns:
    hidden [B, T, D], final-normed; and the cache with `lengths + T`.
  """
  hidden, cache, _ = _run(params, tokens, positions, cache, mask, prefix_mask, config, (),
                          fresh, valid_lengths)
  return hidden, cache


def forward_features(params: Params, tokens: jax.Array, positions: jax.Array, cache: KVCache,
                     mask: jax.Array | None = None, *, config: LlamaLikeConfig,
                     layers: tuple[int, ...], fresh: bool = False,
                     valid_lengths: jax.Array | None = None
                     ) -> tuple[jax.Array, KVCache, jax.Array]:
  """`forward` that also returns the outputs of decoder `layers` (0-based; the residual stream
  after layer i, what EAGLE-3 fuses), concatenated: [B, T, len(layers) * D]. `FINAL_NORMED`
  (-1) among them is the final normed hidden state (what EAGLE-1/2 heads read)."""
  if (not layers or max(layers) >= config.num_layers
      or any(i < 0 and i != FINAL_NORMED for i in layers)):
    raise ValueError(f"layers={layers} must name decoder layers in [0, {config.num_layers}) "
                     f"or {FINAL_NORMED} (the final normed hidden state)")
  hidden, cache, feats = _run(params, tokens, positions, cache, mask, None, config,
                              tuple(i for i in layers if i >= 0), fresh, valid_lengths)
  feats[FINAL_NORMED] = hidden
  return hidden, cache, jnp.concatenate([feats[i] for i in layers], axis=-1)


FINAL_NORMED = -1  # forward_features: the final normed hidden state instead of a layer's output


def step_inputs(tokens, positions, cache: KVCache, mask, prefix_mask, config: LlamaLikeConfig):
  """What every layer of one call over tokens [B, T] shares: RoPE (cos, sin), the [B, T, S]
  attention mask, and the cache slots (write_b, write_s) the T new entries go to."""
  B, T = tokens.shape
  cos, sin = rope_cos_sin(positions, config)
  full_mask = attention_mask(cache.lengths, T, cache.max_len, mask, prefix_mask)
  write_b = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
  write_s = cache.lengths[:, None] + jnp.arange(T)[None, :]
  return cos, sin, full_mask, write_b, write_s


def compute_dtype(params: Params):
  """The activations' and the KV cache's dtype: the final norm weight's (`cast_weights` narrows
  only the matrices, so such a model computes in f32 with bf16 weights); the embedding's for a
  params dict without one (an EAGLE drafter's)."""
  if "final_norm" in params:
    return params["final_norm"].dtype
  if "embed" in params:
    if is_blocks(params["embed"]) or params["embed"].dtype == jnp.int8:
      return jnp.float32
    return params["embed"].dtype
  # heads on a target's hidden state (Medusa's): their first floating array's dtype
  floats = [x.dtype for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)]
  return floats[0] if floats else jnp.float32


SCALE = "_scale"  # suffix of an int8 matrix's per-row scales: w ~ q * scale[:, None]
LAYER_MATRICES = (  # a decoder layer's weight matrices (what quantization quantizes)
    "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@jax.jit
def quantize_rows(w) -> tuple[jax.Array, jax.Array]:
  """Symmetric per-row int8: (q [F, D] int8, scale [F] f32) with w ~ q * scale[:, None] and
  |q| <= 127; a row of zeros gets scale 1. One compiled program per shape (op by op, a
  drafter's 170 matrices cost seconds of dispatch)."""
  w = jnp.asarray(w, jnp.float32)
  amax = jnp.max(jnp.abs(w), axis=1)
  scale = jnp.where(amax > 0, amax / 127.0, 1.0)
  q = jnp.clip(jnp.round(w / scale[:, None]), -127, 127).astype(jnp.int8)
  return q, scale.astype(jnp.float32)


def quantize_int8(params: Params) -> Params:
  """Weight-only int8: every projection, the embedding and the LM head as int8 rows with f32
  per-row scales (`name` and `name + "_scale"`); norms, biases, activations and the KV cache
  stay f32. The CPU kernel streams the int8 rows (a quarter of f32's bytes) and widens them
  in registers; elsewhere `linear` dequantizes (prefill, GPU/TPU). Meant for drafters, whose
  precision does not touch losslessness (the target verifies), and for a target whose user
  accepts a quantized model's outputs. Tied embeddings stay tied (one int8 matrix)."""
  if is_int8(params):
    return params
  params = dict(params)
  for name in ("embed", "lm_head"):
    if name in params:
      params[name], params[name + SCALE] = quantize_rows(params[name])
  layers = []
  for layer in params["layers"]:
    layer = dict(with_mlp_layout({"layers": [layer]}, "out_in")["layers"][0])
    for name in LAYER_MATRICES:
      layer[name], layer[name + SCALE] = quantize_rows(layer[name])
    layers.append(layer)
  params["layers"] = layers
  return params


INT4 = "Q4_0"  # the block type of weight-only int4 (`quantize_blocks`, dtype "int4")


def quantize_blocks(params: Params, qtype: str = INT4, progress=None) -> Params:
  """Weight-only grouped quantization of a float model into GGUF blocks of `qtype`
  (`kernels.blocks.quantize`, `gguf`'s own quantizer; Q4_0, the default and dtype "int4": 4-bit
  codes in groups of 32 weights with one float16 scale each, 4.5 bits a weight): every
  projection, the embedding and the LM head; norms and biases keep their dtype (and with the
  final norm's, the activations and the KV cache theirs: f32 from a float32 load). The result
  runs on the GGUF blocks path as a GGUF file's own weights do (the CPU kernel dequantizes in
  registers; elsewhere XLA dequantizes before the dot). Tied embeddings stay tied. `progress(name)`: called before each matrix (a progress bar's hook)."""
  if has_blocks(params):
    raise ValueError("these weights are GGUF blocks already: load the model again in float32 "
                     "to quantize it to another type")
  if is_int8(params):
    raise ValueError("cannot quantize int8 weights again: load the model in float32")
  return _each_matrix(params, lambda w, name: quantize(w, qtype, name), progress)


def _each_matrix(params: Params, fn, progress=None) -> Params:
  """`params` with every projection, the embedding and the LM head replaced by fn(w, name)
  (MLP weights [out, in]); `progress(name)` called before each."""
  step = progress or (lambda name: None)
  params = dict(with_mlp_layout(params, "out_in"))
  for name in ("embed", "lm_head"):
    if name in params:
      step(name)
      params[name] = fn(params[name], name)
  layers = []
  for i, layer in enumerate(params["layers"]):
    layer = dict(layer)
    for name in LAYER_MATRICES:
      step(f"layers.{i}.{name}")
      layer[name] = fn(layer[name], f"layers.{i}.{name}")
    layers.append(layer)
  params["layers"] = layers
  return params


def quantize_grouped(params: Params, progress=None) -> Params:
  """Weight-only int4 for an accelerator or a mesh: every projection, the embedding and the LM
  head as `kernels.blocks.GroupedInt4` (Q4_0's values, computed on the device by
  `blocks.grouped_int4`: the same numbers `quantize_blocks(params)` gives, laid out for XLA's
  dot); norms and biases keep their dtype, and with the final norm's the activations and the
  KV cache theirs (bf16 on TPU/GPU). Traceable (`jax.eval_shape` of it gives the weights'
  shapes). `progress(name)`: called before each matrix."""
  if has_blocks(params):
    raise ValueError("these weights are quantized blocks already: load the model again in a "
                     "float dtype to quantize it")
  if is_int8(params):
    raise ValueError("cannot quantize int8 weights again: load the model in a float dtype")
  return _each_matrix(params, grouped_int4, progress)


def is_int8(params: Params) -> bool:
  """Whether `params` hold int8 weights (`quantize_int8`)."""
  return "embed" + SCALE in params


def has_blocks(params: Params) -> bool:
  """Whether `params` hold GGUF blocks (`kernels.blocks.BlockWeight`, a GGUF file's own
  quantization kept at load)."""
  return any(is_blocks(x) for x in jax.tree.leaves(params, is_leaf=is_blocks))


def is_quantized(params: Params) -> bool:
  """Whether `params` hold quantized weights: int8 rows or GGUF blocks."""
  return is_int8(params) or has_blocks(params)


def embed_tokens(params: Params, tokens: jax.Array, config: LlamaLikeConfig | None = None
                 ) -> jax.Array:
  """The embedding rows of `tokens` in `compute_dtype(params)` (dequantized for int8); with
  `config.scale_embeddings` (Gemma) times sqrt(D) rounded to the embedding's dtype and
  multiplied in it, as transformers' Gemma3TextScaledWordEmbedding does."""
  x = take_rows(params["embed"], tokens, shards=lowering_of(params).model_shards)
  if is_int8(params):
    x = x.astype(jnp.float32) * jnp.take(params["embed" + SCALE], tokens, axis=0)[..., None]
  if config is not None and config.scale_embeddings:
    x = x * jnp.asarray(np.sqrt(config.hidden_size), x.dtype)
  return x.astype(jnp.float32 if is_int8(params) else compute_dtype(params))


def cast_weights(params: Params, dtype) -> Params:
  """The model with its weight matrices (embedding, projections, MLP, LM head: every 2-D leaf)
  stored in `dtype`; norms and biases keep theirs, and with them `compute_dtype`. On XLA:CPU
  this is what bf16 means (`checkpoints.loader.load_model`): bf16 weights halve the bytes a
  step reads and the CPU kernel widens them in registers, while XLA:CPU's bf16 arithmetic
  elsewhere (attention, softmax, cache writes) is slower than f32 activations (docs/engine.md,
  'CPU speed')."""
  if jnp.dtype(dtype) == jnp.int8 and not has_blocks(params):
    return quantize_int8(params)
  if has_blocks(params):
    raise ValueError(f"cannot cast a GGUF file's quantized blocks to {jnp.dtype(dtype).name}: "
                     f"load the model again with that dtype (dtype='gguf' keeps the blocks)")
  if is_int8(params):
    raise ValueError(f"cannot cast int8 weights to {jnp.dtype(dtype).name}: load the model "
                     f"again in that dtype")
  dtype = jnp.dtype(dtype)
  return jax.tree.map(lambda a: a.astype(dtype) if a.ndim == 2 and a.dtype != dtype else a,
                      params)


def _run(params, tokens, positions, cache, mask, prefix_mask, config, capture, fresh=False,
         valid_lengths=None):
  T = tokens.shape[1]
  if fresh and (mask is not None or prefix_mask is not None):
    raise ValueError("a fresh prefill (fresh=True) attends causally: pass no mask/prefix_mask")
  x = embed_tokens(params, tokens, config)
  cos, sin, full_mask, write_b, write_s = step_inputs(tokens, positions, cache, mask,
                                                      prefix_mask, config)
  per_type = {False: (full_mask, cos, sin)}
  R = cache.ring
  if R is not None and fresh and valid_lengths is None:
    raise ValueError("a fresh prefill into a cache that keeps sliding layers in a ring "
                     "(models.cache) needs the rows' prompt lengths: pass valid_lengths")
  if config.has_sliding_layers:  # Gemma 3's local layers: their window and RoPE base
    W = config.sliding_window
    if R is not None and not fresh and W + T - 1 > R:
      raise ValueError(f"a block of T={T} tokens needs {W + T - 1} ring slots for the "
                       f"sliding window W={W}; the cache's ring has {R} (raise "
                       f"vocabjax.models.cache.RING_SLACK)")
    local_mask = (window_mask(full_mask, cache.lengths, positions, W) if R is None else
                  ring_mask(full_mask, cache.lengths, positions, W, R))
    per_type[True] = (local_mask, *rope_cos_sin(positions, config, local=True))
  bufs = {"global": [cache.k, cache.v], "local": [cache.k_local, cache.v_local]}
  feats = {}
  lowering = lowering_of(params)
  if loops_layers(params["layers"], config, lowering, cache):
    x, k, v, feats = _layer_loop(params["layers"], x, cache, write_b, write_s, full_mask, cos,
                                 sin, config, lowering, capture, fresh, valid_lengths)
    hidden = norm(x, params["final_norm"], config, lowering)
    return hidden, cache.replace(k=k, v=v, lengths=cache.lengths + T), feats
  for i, layer in enumerate(params["layers"]):
    layer_mask, layer_cos, layer_sin = per_type[config.is_sliding(i)]
    where, j = cache.buffers(config, i)
    kv = bufs[where]
    x, kv[0], kv[1] = decoder_layer(x, layer, i, kv[0], kv[1], write_b, write_s, layer_mask,
                                    layer_cos, layer_sin, config, fresh=fresh,
                                    lowering=lowering, cache_index=j,
                                    ring=R if where == "local" else None,
                                    valid=valid_lengths if fresh else None)
    if i in capture:
      feats[i] = x
  hidden = norm(x, params["final_norm"], config, lowering)
  return hidden, cache.replace(k=bufs["global"][0], v=bufs["global"][1],
                               k_local=bufs["local"][0], v_local=bufs["local"][1],
                               lengths=cache.lengths + T), feats


class _LayerOf:
  """A projection's weights of every layer, read at the layer loop's (traced) layer
  (`_proj` hands it to `cpu_matmul.layer_linear`)."""

  def __init__(self, weights: tuple, layer: jax.Array):
    self.weights, self.layer = weights, layer


def loops_layers(layers: list, config: LlamaLikeConfig, lowering: Lowering,
                 cache: KVCache) -> bool:
  """Whether `forward` runs `layers` as one loop body (`Lowering.layer_loop`): on XLA:CPU with
  the kernel, every projection GGUF blocks of one shape per name (`layer_weights_ok`; the
  block types may differ from layer to layer, as a Q4_K_M file's do), every other leaf a
  vector of one shape, no sliding layers, one device (no mesh). Otherwise the layers are
  unrolled."""
  if not (lowering.layer_loop and lowering.platform == "cpu" and lowering.cpu_kernel
          and lowering.mesh is None and len(layers) > 1 and cache.k_local is None
          and not config.has_sliding_layers and available()):
    return False
  names = set(layers[0])
  if not set(LAYER_MATRICES) <= names or any(set(layer) != names for layer in layers):
    return False
  for name in names:
    got = [layer[name] for layer in layers]
    if name in LAYER_MATRICES:
      if not layer_weights_ok(got):
        return False
    elif not all(isinstance(a, (jax.Array, np.ndarray)) and a.ndim <= 1
                 and a.shape == got[0].shape and a.dtype == got[0].dtype for a in got):
      return False
  return True


def _layer_loop(layers, x, cache, write_b, write_s, mask, cos, sin, config, lowering, capture,
                fresh, valid_lengths):
  """`_run`'s layers as one `fori_loop` body (`loops_layers`): the projections through
  `layer_linear` (each layer's blocks read in place, the layer an operand), the attention
  kernel and the cache writes at the traced layer, the norms' and biases' vectors stacked (a
  few KB a layer). Returns (x, k, v, {layer: output} for `capture`)."""
  L = len(layers)
  mats = {n: tuple(layer[n] for layer in layers) for n in LAYER_MATRICES}
  small = {n: jnp.stack([layer[n] for layer in layers]) for n in layers[0] if n not in mats}
  slot = jnp.asarray([capture.index(i) if i in capture else len(capture) for i in range(L)],
                     jnp.int32)
  outs = jnp.zeros((len(capture) + 1, *x.shape), x.dtype) if capture else None

  def body(i, carry):
    x, k, v, outs = carry
    layer = {n: _LayerOf(w, i) for n, w in mats.items()}
    layer.update({n: a[i] for n, a in small.items()})
    x, k, v = decoder_layer(x, layer, 0, k, v, write_b, write_s, mask, cos, sin, config,
                            fresh=fresh, lowering=lowering, cache_index=i,
                            valid=valid_lengths if fresh else None)
    if outs is not None:
      outs = jax.lax.dynamic_update_index_in_dim(outs, x, slot[i], 0)
    return x, k, v, outs

  x, k, v, outs = jax.lax.fori_loop(0, L, body, (x, cache.k, cache.v, outs))
  return x, k, v, {i: outs[j] for j, i in enumerate(capture)}


def lm_head_rows(params: Params, config: LlamaLikeConfig) -> tuple[jax.Array, jax.Array | None]:
  """(U [V, D] as stored, its per-row scale [V] for int8 weights else None): the LM head rows
  (the embedding when tied), what `linear` and row gathers (trimmed heads) take."""
  name = "embed" if config.tie_word_embeddings else "lm_head"
  return params[name], params.get(name + SCALE)


def lm_head_weight(params: Params, config: LlamaLikeConfig) -> jax.Array:
  """U [V, D]: the LM head rows (the embedding when tied); f32 dequantized rows for int8
  weights (decoding paths use `lm_head_rows` and never materialize them)."""
  U, scale = lm_head_rows(params, config)
  if is_blocks(U):
    return dequantize(U)
  return U if scale is None else U.astype(jnp.float32) * scale[:, None]


def lm_head_matrix(params: Params, config: LlamaLikeConfig):
  """The LM head rows as a head that multiplies them with `linear` takes them: GGUF blocks as
  stored (the kernel widens them in registers; no f32 copy of a [V, D] table), others as
  `lm_head_weight` gives them."""
  U = lm_head_rows(params, config)[0]
  return U if is_blocks(U) else lm_head_weight(params, config)


def float_dtype(w) -> jnp.dtype:
  """The dtype a weight's values compute in: f32 for GGUF blocks (stored as bytes), else its
  own."""
  return jnp.dtype(jnp.float32) if is_blocks(w) else jnp.dtype(w.dtype)


def lm_head(params: Params, hidden: jax.Array, *, config: LlamaLikeConfig) -> jax.Array:
  """Full-vocabulary logits [..., V] from hidden [..., D], accumulated in f32."""
  return linear(hidden, *lm_head_rows(params, config),
                lowering=lowering_of(params)).astype(jnp.float32)
