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
import io
import json
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.io import atomic_write_bytes
from vocabjax.kernels.blocks import is_blocks
from vocabjax.kernels.cpu_matmul import linear
from vocabjax.kernels.indexed_lm_head import indexed_lm_head
from vocabjax.lowering import lowering_of
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head_rows, lm_head_weight
from vocabjax.sampling import top_k
from vocabjax.vocab.policy import (RowVocab, bound_policy, policy_impl, policy_rows,
                                   policy_state, require_float_head, with_policy_state)
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
  successors: np.ndarray | None = None  # [V, n] a statistical index (EvoSpec): each token's
  #   most frequent next tokens, -1 none; a seen token brings its successors into the slots

  def __post_init__(self):
    if self.successors is not None:
      succ = np.asarray(self.successors)
      if succ.ndim != 2 or succ.shape[0] != self.vocab_size or succ.shape[1] < 1:
        raise InContextError(f"a successor index is [V={self.vocab_size}, n >= 1], got shape "
                             f"{succ.shape}: made for another vocabulary?")
      if succ.max() >= self.vocab_size or succ.min() < -1:
        raise InContextError(f"successor ids must lie in [-1, {self.vocab_size}), got "
                             f"{succ.min()}..{succ.max()}")
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
    require_float_head(params, InContextError,
                       "the in-context vocabulary gathers rows of a float LM head")
    try:
      params = attach_subset(params, config, self.core)
    except SubsetError as e:
      raise InContextError(str(e)) from None
    mask = np.zeros(self.vocab_size, bool)
    mask[np.asarray(self.core.ids)] = True
    state = {**policy_state(params), "core_mask": jnp.asarray(mask)}
    n = 0
    if self.successors is not None:
      state["successors"] = jnp.asarray(np.asarray(self.successors), jnp.int32)
      n = int(np.shape(self.successors)[1])
    impl = policy_impl(self.impl, mesh)
    # the window and the successors' width shape the engine's prefill and update programs too:
    # policy settings, so that they key them
    return (with_policy_state(params, state),
            bound_policy(in_context_policy, config=config, impl=impl, window=self.window,
                         successors=n))

  def init_rows(self, state, tokens, lengths, first):
    seq, valid = expand(*prompt_sequence(tokens, lengths, first), state)
    return context_rows(seq, valid, window=self.window, vocab_size=self.vocab_size)

  def observe(self, state, rows, emitted):
    seq, valid = expand(emitted.astype(jnp.int32), emitted >= 0, state)
    return observe_rows(rows, jnp.where(valid, seq, -1))


def prompt_sequence(tokens: jax.Array, lengths: jax.Array, first: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
  """(seq [B, T + 1], valid [B, T + 1]): the prompt `tokens` [B, T] (right-padded, `lengths`
  [B]) followed by the first token `first` [B]."""
  B, T = tokens.shape
  pos = jnp.arange(T + 1, dtype=jnp.int32)[None]
  seq = jnp.concatenate([tokens.astype(jnp.int32), jnp.zeros((B, 1), jnp.int32)], axis=1)
  seq = jnp.where(pos == lengths[:, None], first[:, None].astype(jnp.int32), seq)
  return seq, pos <= lengths[:, None]


def context_rows(seq: jax.Array, valid: jax.Array, *, window: int, vocab_size: int) -> dict:
  """The rows' in-context vocabulary after the tokens `seq` [B, L] where `valid` [B, L]: the
  `window` most recently seen distinct tokens (a token's position: its index in `seq`)."""
  B, L = seq.shape
  pos = jnp.arange(L, dtype=jnp.int32)[None]
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
          "slot_of": slot_of, "clock": jnp.full((B,), L, jnp.int32)}


def expand(seq: jax.Array, valid: jax.Array, state: dict) -> tuple[jax.Array, jax.Array]:
  """(seq', valid') [B, L * (1 + n)]: each token followed by its n indexed successors
  (`state["successors"]` [V, n], -1 none; none attached: n = 0), and every token of the core
  (`state["core_mask"]`) made invalid: the core's tokens never take a slot."""
  succ = state.get("successors")
  if succ is not None:
    B, L = seq.shape
    n = succ.shape[1]
    nxt = succ[jnp.where(valid, seq, 0)]  # [B, L, n]
    seq = jnp.concatenate([seq[..., None], nxt], axis=-1).reshape(B, L * (1 + n))
    valid = jnp.concatenate([valid[..., None], valid[..., None] & (nxt >= 0)],
                            axis=-1).reshape(B, L * (1 + n))
    seq = jnp.maximum(seq, 0)
  return seq, valid & ~state["core_mask"][seq]


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
                      successors: int = 0, impl: str = "auto"
                      ) -> tuple[jax.Array, jax.Array]:
  """(candidate target ids [B, ..., Kc + C], logits [B, ..., Kc + C]): the core's rows and the
  row's C = `window` in-context slots; empty slots and slots duplicating a core id get -inf
  (`successors`: the index's width n, read by the row updates alone).
  (`window` is a setting, not only a shape: the engine's programs of two windows differ in
  their prefill and update too, and a policy's settings are what key them.)"""
  del successors
  st = policy_state(params)
  rows = policy_rows(params, "the in-context vocabulary (microspec, evospec)")
  if rows["ids"].shape[1] != window:
    raise ValueError(f"in-context rows hold {rows['ids'].shape[1]} slots, the policy "
                     f"{window=}")
  # the batch rows lead h (a DFlash block's [B * G, D] too: rows major)
  B, D = rows["ids"].shape[0], h.shape[-1]
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


def successor_index(sequences, vocab_size: int, n: int, *, exclude=None) -> np.ndarray:
  """EvoSpec's statistical index from token `sequences` (completions the target generated): for
  each token its `n` most frequent next tokens [V, n] (ties: the lower id; -1 where fewer
  followed it), leaving out `exclude` [V] bool (the core: those are always candidates)."""
  if n < 1:
    raise InContextError(f"n={n}: a successor index holds at least one successor per token")
  pairs = [np.stack([np.asarray(s[:-1]), np.asarray(s[1:])], 1) for s in sequences
           if len(s) > 1]
  if not pairs:
    raise InContextError("no token pairs to index: the sequences are empty (an empty "
                         "calibration set?)")
  p = np.concatenate(pairs).astype(np.int64)
  if p.min() < 0 or p.max() >= vocab_size:
    raise InContextError(f"token ids must lie in [0, {vocab_size}), got {p.min()}..{p.max()}")
  if exclude is not None:
    p = p[~np.asarray(exclude)[p[:, 1]]]
  key, count = np.unique(p[:, 0] * vocab_size + p[:, 1], return_counts=True)
  src, dst = np.divmod(key, vocab_size)
  order = np.lexsort((dst, -count, src))  # by source, then count descending, then id
  src, dst = src[order], dst[order]
  rank = np.arange(len(src)) - np.searchsorted(src, src)
  keep = rank < n
  out = np.full((vocab_size, n), -1, np.int32)
  out[src[keep], rank[keep]] = dst[keep]
  return out


INDEX_FORMAT = "vocabjax-successors/1"


def save_index(path, successors: np.ndarray, *, tokenizer_id: str, meta: dict) -> Path:
  """Write a successor index atomically as .npz with the tokenizer it was counted with."""
  buf = io.BytesIO()
  np.savez_compressed(buf, successors=np.asarray(successors, np.int32), meta=np.asarray(
      json.dumps({"format": INDEX_FORMAT, "tokenizer_id": tokenizer_id, **meta})))
  path = Path(path)
  atomic_write_bytes(path, buf.getvalue())
  return path


def load_index(path, *, tokenizer_id: str | None = None, vocab_size: int | None = None
               ) -> np.ndarray:
  """A saved successor index [V, n]; refused when made for another tokenizer or vocabulary,
  or when the file is not one."""
  path = Path(path)
  if not path.is_file():
    raise InContextError(f"no successor index at {path} (make one with `python -m "
                         f"vocabjax.calibrate index`)")
  try:
    with np.load(path) as z:
      succ, meta = z["successors"], json.loads(str(z["meta"]))
  except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
    raise InContextError(f"{path} is not a readable successor index ({e})") from None
  if meta.get("format") != INDEX_FORMAT:
    raise InContextError(f"{path} is not a vocabjax successor index "
                         f"(format {meta.get('format')!r})")
  if tokenizer_id is not None and meta.get("tokenizer_id") != tokenizer_id:
    raise InContextError(f"{path} was counted with tokenizer {meta.get('tokenizer_id')!r}, the "
                         f"model's is {tokenizer_id!r}")
  if vocab_size is not None and succ.shape[0] != vocab_size:
    raise InContextError(f"{path} indexes a vocabulary of {succ.shape[0]} tokens, the model "
                         f"has V={vocab_size}")
  return succ
