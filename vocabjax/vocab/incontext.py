"""In-context vocabulary (MicroSpec, Chen et al. 2026, arXiv 2605.26444): per step, the drafter's
LM head computes only a small frequent core plus the tokens the request's own context holds.

Letters: B rows, N hidden rows per batch row (a tree's frontier, a block's positions), D drafter
hidden size, V vocabulary, Kc core tokens, C in-context slots per row, W tokens a step emits.

MicroSpec's observation is temporal locality: a generation reuses the tokens its context holds
(names, code identifiers, the prompt's words), so a per-step vocabulary of under 3,000 tokens (a
40x smaller head than a 128K vocabulary) keeps most of the drafter's acceptance, with no trained
parameters. vocabjax keeps, per request row:

    ids      [B, C]  the context's distinct tokens (prompt and emitted), least recently used
                     evicted once C are held
    last_use [B, C]  the position each was last seen at (-1: an empty slot)
    slot_of  [B, V]  where each token sits in `ids` (-1: absent)
    clock    [B]     the next position

built from the prompt by `init_rows` and updated with each step's emitted tokens by `observe`
(the engine carries them, `vocabjax.vocab.policy.RowVocab`). The policy's candidates are the
core's Kc ids (a frequency-ranked subset, as VocabTrim's, with EOS and the special tokens) and the
row's C slots; slots that are empty or duplicate a core id get logit -inf (q = 0), so the law
drafted from is over distinct tokens. Logits: the core's rows as a trimmed head, the slots by the
indexed LM head (`vocabjax.kernels.indexed_lm_head`): (Kc + C) * D multiply-adds per row against
V * D. Verification keeps the full vocabulary, so output is exactly the target's: a token the
set misses is never drafted and keeps its full probability through the residual.

What the paper's system adds and vocabjax does not: its asynchronous gathering of the active rows
on the GPU (here, the indexed head's gather is the step's own). The abstract, not the paper's
text, was the source for the rule above (the recency window and the core size are this module's
settings: `window`, the core subset's K).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.kernels.blocks import is_blocks
from vocabjax.kernels.cpu_matmul import linear
from vocabjax.kernels.indexed_lm_head import indexed_lm_head
from vocabjax.lowering import lowering_of
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import is_int8, lm_head_rows, lm_head_weight
from vocabjax.sampling import top_k
from vocabjax.vocab.policy import (RowVocab, bound_policy, policy_rows, policy_state,
                                   with_policy_state)
from vocabjax.vocab.subset import SubsetError, VocabSubset, attach_subset


class InContextError(ValueError):
  """In-context vocabulary settings that cannot work; the message names the value."""


@dataclasses.dataclass(frozen=True, eq=False)
class InContextVocab(RowVocab):
  """A drafter vocabulary policy: `core` (a static subset) plus the last `window` distinct tokens
  of each request's context (module doc)."""

  core: VocabSubset
  window: int  # C: in-context slots per row
  impl: str = "auto"  # the indexed LM head's implementation

  def __post_init__(self):
    if self.window < 1:
      raise InContextError(f"window={self.window}: the in-context vocabulary needs at least one "
                           f"slot per row (an empty in-context vocabulary is the core alone: "
                           f"use vocabtrim with the core's counts)")
    if self.window > self.vocab_size:
      raise InContextError(f"window={self.window} exceeds the vocabulary of "
                           f"V={self.vocab_size} tokens")

  @property
  def vocab_size(self) -> int:
    return self.core.vocab_size

  @property
  def size(self) -> int:  # candidates per row (what a tree's top_k must not exceed)
    return self.core.size + self.window

  @property
  def head_rows(self) -> int:
    return self.size

  def attach(self, params: dict, config: LlamaLikeConfig, mesh=None):
    """(params with the core's head rows and the core's mask beside them, the policy)."""
    if is_int8(params):
      raise InContextError("the in-context vocabulary gathers rows of a float LM head: load "
                           "the drafter in float32 or bfloat16, not int8")
    try:
      params = attach_subset(params, config, self.core)
    except SubsetError as e:
      raise InContextError(str(e)) from None
    mask = np.zeros(self.vocab_size, bool)
    mask[np.asarray(self.core.ids)] = True
    state = {**policy_state(params), "core_mask": jnp.asarray(mask)}
    impl = "reference" if mesh is not None and mesh.size > 1 else self.impl
    return (with_policy_state(params, state),
            bound_policy(in_context_policy, config=config, impl=impl, window=self.window))

  def init_rows(self, state, tokens, lengths, first):
    del state
    return context_rows(tokens, lengths, first, window=self.window, vocab_size=self.vocab_size)

  def observe(self, state, rows, emitted):
    del state
    return observe_rows(rows, emitted)


def context_rows(tokens: jax.Array, lengths: jax.Array, first: jax.Array, *, window: int,
                 vocab_size: int) -> dict:
  """The rows' in-context vocabulary after the prompt `tokens` [B, T] (right-padded, `lengths`
  [B]) and the first token `first` [B]: the `window` most recently seen distinct tokens."""
  B, T = tokens.shape
  L = T + 1
  pos = jnp.arange(L, dtype=jnp.int32)[None]
  seq = jnp.concatenate([tokens.astype(jnp.int32), jnp.zeros((B, 1), jnp.int32)], axis=1)
  seq = jnp.where(pos == lengths[:, None], first[:, None].astype(jnp.int32), seq)
  valid = pos <= lengths[:, None]
  # sort by (token, position), padding last: a token's last occurrence ends its run
  posb = jnp.broadcast_to(pos, (B, L))
  order = jnp.lexsort((posb, jnp.where(valid, seq, vocab_size)), axis=-1)
  tok_s = jnp.take_along_axis(seq, order, axis=1)
  pos_s = jnp.take_along_axis(posb, order, axis=1)
  val_s = jnp.take_along_axis(valid, order, axis=1)
  nxt_tok = jnp.concatenate([tok_s[:, 1:], jnp.full((B, 1), -1, jnp.int32)], axis=1)
  nxt_val = jnp.concatenate([val_s[:, 1:], jnp.zeros((B, 1), bool)], axis=1)
  last = val_s & ~(nxt_val & (nxt_tok == tok_s))
  score = jnp.where(last, pos_s, -1)
  if score.shape[1] < window:
    score = jnp.pad(score, ((0, 0), (0, window - score.shape[1])), constant_values=-1)
    tok_s = jnp.pad(tok_s, ((0, 0), (0, window - tok_s.shape[1])))
  when, at = top_k(score, window)  # the most recent distinct tokens, newest first
  ids = jnp.where(when >= 0, jnp.take_along_axis(tok_s, at, axis=1), 0)
  rows = jnp.arange(B)[:, None]
  slot_of = jnp.full((B, vocab_size), -1, jnp.int32)
  slot_of = slot_of.at[rows, jnp.where(when >= 0, ids, vocab_size)].set(
      jnp.broadcast_to(jnp.arange(window, dtype=jnp.int32), (B, window)), mode="drop")
  return {"ids": ids.astype(jnp.int32), "last_use": when.astype(jnp.int32),
          "slot_of": slot_of, "clock": (lengths + 1).astype(jnp.int32)}


def observe_rows(rows: dict, emitted: jax.Array) -> dict:
  """`rows` after tokens `emitted` [B, W] (-1: none) were committed, in order: a held token's
  slot is marked used now, a new one takes the least recently used slot (an empty one first)."""
  B = emitted.shape[0]
  b = jnp.arange(B)

  def one(st, t):
    ok = t >= 0
    t = jnp.where(ok, t, 0)
    ids, last_use, slot_of, clock = st["ids"], st["last_use"], st["slot_of"], st["clock"]
    held = slot_of[b, t]
    free = jnp.argmin(last_use, axis=1).astype(jnp.int32)
    s = jnp.where(held >= 0, held, free)
    new = ok & (held < 0)
    old = ids[b, s]
    evict = new & (last_use[b, s] >= 0)
    slot_of = slot_of.at[b, jnp.where(evict, old, slot_of.shape[1])].set(-1, mode="drop")
    slot_of = slot_of.at[b, jnp.where(new, t, slot_of.shape[1])].set(s, mode="drop")
    ids = ids.at[b, s].set(jnp.where(new, t, old))
    last_use = last_use.at[b, s].set(jnp.where(ok, clock, last_use[b, s]))
    clock = clock + ok.astype(jnp.int32)
    return {"ids": ids, "last_use": last_use, "slot_of": slot_of, "clock": clock}, None

  out, _ = jax.lax.scan(one, rows, emitted.T.astype(jnp.int32))
  return out


def in_context_policy(params: dict, h: jax.Array, *, config: LlamaLikeConfig, window: int,
                      impl: str = "auto") -> tuple[jax.Array, jax.Array]:
  """(candidate target ids [B, ..., Kc + C], logits [B, ..., Kc + C]): the core's rows and the
  row's C = `window` in-context slots; empty slots and slots duplicating a core id get -inf.
  (`window` is a setting, not only a shape: the engine's programs of two windows differ in
  their prefill and update too, and a policy's settings are what key them.)"""
  st = policy_state(params)
  rows = policy_rows(params, "the in-context vocabulary (microspec)")
  if rows["ids"].shape[1] != window:
    raise ValueError(f"in-context rows hold {rows['ids'].shape[1]} slots, the policy "
                     f"{window=}")
  B, D = h.shape[0], h.shape[-1]
  lead = h.shape[:-1]
  flat = h.reshape(B, -1, D)
  N = flat.shape[1]
  lw = lowering_of(params)
  core_z = linear(flat, st["head"], st.get("scale"), lowering=lw).astype(jnp.float32)
  C = rows["ids"].shape[1]
  idx = jnp.broadcast_to(rows["ids"][:, None], (B, N, C)).reshape(B * N, C)
  U = lm_head_rows(params, config)[0]
  ctx_z = indexed_lm_head(flat.reshape(B * N, D), U if is_blocks(U) else
                          lm_head_weight(params, config), idx, impl=impl).reshape(B, N, C)
  ok = (rows["last_use"] >= 0) & ~st["core_mask"][rows["ids"]]
  ctx_z = jnp.where(ok[:, None], ctx_z, -jnp.inf)
  Kc = st["ids"].shape[0]
  ids = jnp.concatenate([jnp.broadcast_to(st["ids"], (B, N, Kc)),
                         jnp.broadcast_to(rows["ids"][:, None], (B, N, C))], axis=-1)
  z = jnp.concatenate([core_z, ctx_z], axis=-1)
  return ids.reshape(lead + (Kc + C,)), z.reshape(lead + (Kc + C,))
