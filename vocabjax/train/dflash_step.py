"""A DFlash drafter's training batches, loss and held-out evaluation (`vocabjax.train.dflash`).

Letters: B windows per step, T window tokens, n anchors (blocks) per window, bs block size,
G = bs - 1 drafted positions, D the drafter's width, V the target's vocabulary.

A window is the last T tokens of a record (its completion and the end of its prompt). An anchor
is a completion position p whose next token is in the completion too (SpecForge's rule); its
block [x_p, mask, ...] predicts x_{p+k} at position k = 1 .. G, weighted exp(-(k - 1) / gamma)
where p + k is a completion position of the window (the DFlash paper's decay), and the loss is
the weighted mean cross-entropy through the target's LM head (frozen, the whole vocabulary,
`losses.vocab_cross_entropy`; or, with `loss_vocab`, a softmax over the head's rows of the
training labels' most frequent tokens: a sampled-softmax shortcut for small compute budgets,
whose held-out figures are still read through the whole head). Held out: every `eval_stride`-th anchor of each record; per
position the top-1 accuracy, and per block the accepted length a greedy chain would get against
the text (the target's own greedy answer): 1 + the drafted prefix that matches it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.lowering import Lowering, with_lowering
from vocabjax.models.dflash import DFlashConfig, scale_logits, training_forward
from vocabjax.train.eagle_data import EagleData
from vocabjax.train.loop import apply_grads, optimizer_of
from vocabjax.train.losses import vocab_cross_entropy


def window(data: EagleData, r: int, T: int) -> tuple[int, int]:
  """(start, length) of record r's window: its last T tokens."""
  L = len(data.seqs[r][1])
  s = max(0, L - T)
  return s, L - s


def valid_anchors(data: EagleData, r: int, T: int) -> np.ndarray:
  """Window indices p of record r whose token and the next are completion tokens."""
  _, toks, first = data.seqs[r]
  s, m = window(data, r, T)
  p = np.arange(m - 1)
  return p[(s + p) > first]  # completion tokens sit at first + 1 .. ; p + 1 < m by the range


def empty_batch(data: EagleData, B: int, T: int, n: int) -> dict:
  F = data.feats[0].shape[1]
  return {"tokens": np.zeros((B, T), np.int32), "feats": np.zeros((B, T, F), np.float16),
          "positions": np.zeros((B, T), np.int32), "completion": np.zeros((B, T), np.float32),
          "anchors": np.zeros((B, n), np.int32), "keep": np.zeros((B, n), np.float32)}


def put_record(out: dict, data: EagleData, b: int, r: int, anchors: np.ndarray) -> None:
  """Row b: record r's window and up to n of `anchors` (window indices)."""
  _, toks, first = data.seqs[r]
  T = out["tokens"].shape[1]
  s, m = window(data, r, T)
  out["tokens"][b, :m] = toks[s:s + m]
  out["feats"][b, :m] = data.feats[r][s:s + m]
  out["positions"][b] = s + np.arange(T)
  out["completion"][b, :m] = (s + np.arange(m)) > first
  k = len(anchors)
  out["anchors"][b, :k] = anchors
  out["keep"][b, :k] = 1.0


def make_batch(data: EagleData, train_idx, rs: np.random.RandomState, *, batch_size: int,
               seq_len: int, anchors: int) -> dict:
  """B random training records, each with up to `anchors` random valid anchors (sorted)."""
  out = empty_batch(data, batch_size, seq_len, anchors)
  for b in range(batch_size):
    while True:  # a record with at least one anchor (a one-token completion has none)
      r = train_idx[rs.randint(0, len(train_idx))]
      valid = valid_anchors(data, r, seq_len)
      if len(valid):
        break
    pick = np.sort(rs.choice(valid, size=min(anchors, len(valid)), replace=False))
    put_record(out, data, b, r, pick)
  return out


def block_labels(batch, config: DFlashConfig, gamma_decay: float | None):
  """(labels [B, n, G], valid [B, n, G] 0/1, weights [B, n, G]) of each block's positions."""
  T, G = batch["tokens"].shape[1], config.gamma
  idx = batch["anchors"][..., None] + jnp.arange(1, G + 1)  # [B, n, G] window indices
  inside = idx < T
  idx = jnp.minimum(idx, T - 1)
  take = jax.vmap(lambda a, i: a[i])
  labels = take(batch["tokens"], idx)
  valid = batch["keep"][..., None] * inside * take(batch["completion"], idx)
  weights = valid
  if gamma_decay:
    weights = valid * jnp.exp(-jnp.arange(G, dtype=jnp.float32) / gamma_decay)
  return labels, valid, weights


def hidden_of(params, embed, batch, config: DFlashConfig):
  """The drafted positions' final hidden states [B, n, G, D]."""
  h = training_forward(params, embed, batch["tokens"], batch["feats"].astype(jnp.float32),
                       batch["positions"], batch["anchors"], config=config)
  return h[:, :, 1:]


def row_map(ids, vocab_size: int) -> jax.Array:
  """t2d [V] int32 of a head over the target ids `ids`: each id's row, -1 for ids it lacks."""
  ids = jnp.asarray(ids)
  return jnp.full((vocab_size,), -1, jnp.int32).at[ids].set(
      jnp.arange(ids.shape[0], dtype=jnp.int32))


def dflash_loss(params, embed, head, batch, *, config: DFlashConfig, gamma_decay: float | None,
                block: int, lowering: Lowering = Lowering(), t2d=None):
  """The weighted mean cross-entropy of the blocks' positions (module doc). `t2d` [V] int32:
  the softmax over the rows of `head` that `t2d` numbers (a `loss_vocab` subset: labels
  outside it, -1, weigh nothing). `head` None: the drafter's own head (`params["lm_head"]`,
  trained with the layers; `t2d` numbers its rows)."""
  params = with_lowering(params, lowering)
  if head is None:
    head = params["lm_head"]
  h = hidden_of(params, embed, batch, config)
  labels, _, weights = block_labels(batch, config, gamma_decay)
  if t2d is not None:
    labels = t2d[labels]
    weights = weights * (labels >= 0)
    labels = jnp.maximum(labels, 0)
  D = h.shape[-1]
  return vocab_cross_entropy(h.reshape(-1, D), head, labels.reshape(-1), weights.reshape(-1),
                             block=block, bf16=lowering.bf16_dots)


@functools.partial(jax.jit, static_argnames=("config", "gamma_decay", "block", "lowering"))
def train_step(st, batch, embed, head, hyper, t2d=None, *, config, gamma_decay, block,
               lowering):
  """One optimizer step (module level, its settings static: one program per drafter config).
  `head`: the target's LM head, or its `loss_vocab` rows with their `t2d`."""
  loss, grads = jax.value_and_grad(
      lambda p: dflash_loss(p, embed, head, batch, config=config, gamma_decay=gamma_decay,
                            block=block, lowering=lowering, t2d=t2d))(st.params)
  return apply_grads(st, grads, optimizer_of(hyper)), loss


@functools.partial(jax.jit, static_argnames=("config",))
def heldout_sums(params, embed, head, batch, t2d=None, *, config):
  """Per position: summed cross-entropy, hits, valid labels and valid labels the head has a
  row for [4, G]; per block the accepted length against the text [B, n] and whether it counts
  (its first label is valid) [B, n]. `head` None: the drafter's own (`params["lm_head"]`,
  its rows the target ids `t2d` [V] numbers, -1 for none; a label it has no row for is a
  miss, and its cross-entropy is left out)."""
  if head is None:
    head = params["lm_head"]
  h = hidden_of(params, embed, batch, config)
  labels, valid, _ = block_labels(batch, config, None)
  inside = valid
  if t2d is not None:
    labels = t2d[labels]
    inside = valid * (labels >= 0)
    labels = jnp.where(labels >= 0, labels, head.shape[0])  # no row: never the argmax
  logits = jnp.einsum("BJGD,VD->BJGV", h, head, preferred_element_type=jnp.float32)
  logits = scale_logits(logits, config)
  lse = jax.nn.logsumexp(logits, -1)
  own = jnp.take_along_axis(logits, jnp.minimum(labels, head.shape[0] - 1)[..., None],
                            -1)[..., 0]
  hit = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  sums = jnp.stack([jnp.sum((lse - own) * inside, (0, 1)), jnp.sum(hit * valid, (0, 1)),
                    jnp.sum(valid, (0, 1)), jnp.sum(inside, (0, 1))])
  # a chain accepts drafts while they match; a label past the completion ends the count
  matched = jnp.cumprod(hit * valid, axis=-1).sum(-1)
  return sums, 1.0 + matched, valid[..., 0]


def evaluate_heldout(params, embed, head, data: EagleData, held_idx, *, config: DFlashConfig,
                     batch_size: int, seq_len: int, anchors: int, stride: int,
                     t2d=None) -> dict:
  """Held-out cross-entropy and accuracy per position, and the mean accepted length `tau`
  (module doc), over every `stride`-th anchor of each held-out record. `head` None, `t2d`:
  the drafter's own head (`heldout_sums`; `coverage`: the share of labels it has a row
  for, the cross-entropy over those)."""
  G = config.gamma
  jobs = []  # (record, anchors) rows of at most `anchors` anchors
  for r in held_idx:
    valid = valid_anchors(data, r, seq_len)[::stride]
    jobs += [(r, valid[i:i + anchors]) for i in range(0, len(valid), anchors)]
  tot = np.zeros((4, G))
  taus = []
  for i in range(0, len(jobs), batch_size):
    part = jobs[i:i + batch_size]
    b = empty_batch(data, batch_size, seq_len, anchors)
    for j, (r, a) in enumerate(part):
      put_record(b, data, j, r, a)
    sums, tau, counts = heldout_sums(params, embed, head,
                                     {k: jnp.asarray(v) for k, v in b.items()}, t2d,
                                     config=config)
    tot += np.asarray(sums)
    taus.append(np.asarray(tau)[np.asarray(counts) > 0])
  n = np.maximum(tot[2], 1)
  out = {"heldout_loss": float(tot[0].sum() / max(tot[3].sum(), 1)),
         "tau": float(np.mean(np.concatenate(taus))) if taus else float("nan"),
         "blocks": int(sum(len(t) for t in taus))}
  if t2d is not None:
    out["coverage"] = float(tot[3].sum() / n.sum())
  for k in range(G):
    out[f"acc_{k + 1}"] = float(tot[1, k] / n[k])
  return out
