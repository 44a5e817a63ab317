"""The EAGLE-3 head's training step (`vocabjax.train.eagle`): its config and vocabulary
(`head_config`, `choose_vocab`, `starting_head`), the training-time-test outputs and loss
(`ttt_outputs`, `ttt_loss`, the module doc of `vocabjax.train.eagle`), one optimizer step and
the held-out evaluation (`evaluate_heldout`)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.calibrate.counts import Counts
from vocabjax.checkpoints.eagle3 import load_eagle3
from vocabjax.lowering import Lowering, with_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import EagleConfig, eagle_forward, fuse_features
from vocabjax.models.llamalike import rms_norm
from vocabjax.train.eagle_data import EagleData, make_batch
from vocabjax.train.eagle_job import EagleJob
from vocabjax.train.loop import TrainError, apply_grads, optimizer_of
from vocabjax.train.losses import (blocked_probs_cross_entropy, soft_cross_entropy,
                                   teacher_prob_blocks, vocab_cross_entropy)
from vocabjax.vocab.subset import VocabSubset

# soft labels: the teacher's probabilities at every slot of a batch are computed once and held
# (f32, [B, T + J, Vd]) when they take at most this many bytes (~0.6 GB for 4 x 260 slots of the
# 1.5B target's 151,936 tokens); past it each depth recomputes them block by block (3x the products)
TEACHER_PROBS_BYTES = 2 << 30


# --- the head and its vocabulary ---------------------------------------------------------------

def head_config(target: LlamaLikeConfig, layers, draft_vocab_size: int,
                intermediate_size: int | None = None) -> EagleConfig:
  """A one-layer llama head of the target's width, heads and RoPE (EAGLE-3's choice). A Gemma 3
  target's head is a llama layer too: SwiGLU, plain RMSNorm, global attention with the
  target's global RoPE (its local layers' window and base are the target's own business)."""
  layer = dataclasses.replace(target, arch="llama", num_layers=1, attention_bias=False,
                              qk_norm=False, tie_word_embeddings=False,
                              intermediate_size=intermediate_size or target.intermediate_size,
                              hidden_act="silu", norm_unit_offset=False, sandwich_norms=False,
                              scale_embeddings=False, query_pre_attn_scalar=None,
                              sliding_window=None, layer_types=None, rope_local_theta=None)
  return EagleConfig(layer=layer, target_hidden_size=target.hidden_size,
                     feature_layers=tuple(layers), draft_vocab_size=draft_vocab_size)


def choose_vocab(job: EagleJob, data: EagleData, train_recs: set, V: int) -> np.ndarray:
  """Ascending target ids of the head's vocabulary (module doc)."""
  if job.vocab_subset:
    sub = VocabSubset.load(job.vocab_subset)
    if sub.vocab_size != V:
      raise TrainError(f"{job.vocab_subset} is a subset of a V={sub.vocab_size} vocabulary, "
                       f"the target has V={V}")
    return np.asarray(sub.ids, np.int64)
  if job.draft_vocab_size is None:
    return np.arange(V)
  K = job.draft_vocab_size
  if not 1 <= K <= V:
    raise TrainError(f"draft_vocab_size={K} must be in [1, V={V}]")
  counts = np.zeros(V, np.int64)
  for (rec, _, first), lab in zip(data.seqs, data.labels):
    if rec in train_recs:
      np.add.at(counts, lab[first:], 1)
  if not counts.any():
    raise TrainError("no training labels to count the head's vocabulary from")
  freq = counts / counts.sum()
  for path in job.vocab_counts:  # each source weighs as one frequency distribution
    c = Counts.load(path, vocab_size=V).counts
    if not c.any():
      raise TrainError(f"{path} counts no tokens (empty calibration set?)")
    freq = freq + c / c.sum()
  order = np.lexsort((np.arange(V), -freq))  # most frequent first, ties by id
  return np.sort(order[:K])


def starting_head(job: EagleJob, target, layers) -> dict | None:
  """The params of `job.init_head` (None without one), checked against the target (its shapes
  and LM-head fingerprint) and against the job: same feature layers, MLP width and vocabulary
  size (TrainError naming both values)."""
  if not job.init_head:
    return None
  tc = target.config
  try:
    hc, params, _ = load_eagle3(job.init_head, target_config=tc, target_params=target.params)
  except (ValueError, OSError) as e:  # CheckpointError is a ValueError
    raise TrainError(f"init_head={job.init_head!r}: {e}") from None
  Vd = job.draft_vocab_size if job.draft_vocab_size is not None else tc.vocab_size
  width = job.intermediate_size or tc.intermediate_size
  for what, head, want in (("feature_layers", list(hc.feature_layers), list(layers)),
                           ("draft_vocab_size", hc.draft_vocab_size, Vd),
                           ("intermediate_size", hc.layer.intermediate_size, width)):
    if head != want:
      raise TrainError(f"init_head={job.init_head!r} has {what}={head}, this job {want}: set "
                       f"the job's {what} to the head's")
  return params


def target_to_head(ids, V: int) -> np.ndarray:
  """[V] head-vocabulary id of each target id (-1 outside the head's vocabulary `ids`)."""
  t2d = np.full(V, -1, np.int32)
  t2d[np.asarray(ids)] = np.arange(len(ids))
  return t2d


# --- the loss ----------------------------------------------------------------------------------

def ttt_masks(n: int, steps: int):
  """Per step j: (block mask [E, E] among its own new entries, prefix mask [E, S] over the
  cache's earlier slots); step j' entries occupy slots j' n .. j' n + n - 1 (S = steps n)."""
  i = np.arange(n)
  out = []
  for j in range(steps):
    block = np.tril(np.ones((n, n), bool)) if j == 0 else np.eye(n, dtype=bool)
    prefix = np.zeros((n, steps * n), bool)
    if j:
      prefix[:, :n] = i[None, :] <= i[:, None]
      for jp in range(1, j):
        prefix[i, jp * n + i] = True
    out.append((jnp.asarray(block)[None], jnp.asarray(prefix)[None]))
  return out


def ttt_outputs(params, embed, batch, *, config: EagleConfig, steps: int):
  """The head's normed outputs per step: list of [B, E, D], and the label/weight [B, E] each
  predicts (module doc). batch: tokens [B, T], feats [B, T, Lf*Dt], dlabel [B, T] head-vocab ids
  (-1: none), weight [B, T]."""
  tokens, w, dl = batch["tokens"], batch["weight"], batch["dlabel"]
  B, T = tokens.shape
  n = T - 1
  c = config.layer
  h = fuse_features(params, batch["feats"][:, :n].astype(embed.dtype))
  cache = KVCache(k=jnp.zeros((1, B, steps * n, c.num_kv_heads, c.head_dim), embed.dtype),
                  v=jnp.zeros((1, B, steps * n, c.num_kv_heads, c.head_dim), embed.dtype),
                  lengths=jnp.zeros((B,), jnp.int32))
  pad = lambda x: jnp.pad(x, ((0, 0), (0, steps)))  # noqa: E731
  tok_p, w_p, dl_p = pad(tokens), pad(w), jnp.pad(dl, ((0, 0), (0, steps)), constant_values=-1)
  seg = batch.get("segment")  # packed windows (`make_packed_batch`)
  if seg is None:
    base = jnp.broadcast_to(jnp.arange(n), (B, n))
  else:
    # a query sees only its own segment's positions, starts RoPE at its segment's window start,
    # and a label past its segment's end (the next segment's token) counts nothing
    base = batch["position"][:, :n]
    same = seg[:, :n, None] == seg[:, None, :n]  # [B, n, n]
    same_all = jnp.tile(same, (1, 1, steps))  # [B, n, steps n]: every step's slots of a query
    seg_p = jnp.pad(seg, ((0, 0), (0, steps)), constant_values=-1)
  outs = []
  for j, (block, prefix) in enumerate(ttt_masks(n, steps)):
    sl = slice(1 + j, 1 + j + n)
    if seg is not None:
      block, prefix = block & same, prefix & same_all
    x, cache = eagle_forward(params, embed, tok_p[:, sl], h, base + j,
                             cache.with_lengths(jnp.full((B,), j * n, jnp.int32)), block,
                             config=config, prefix_mask=prefix)
    label = dl_p[:, sl]
    weight = w_p[:, sl] * (label >= 0)
    if seg is not None:
      weight = weight * (seg_p[:, sl] == seg[:, :n])
    outs.append((rms_norm(x, params["final_norm"], c.rms_norm_eps), label, weight))
    h = x
  return outs


def ttt_loss(trainable, frozen, batch, *, config: EagleConfig, steps: int, decay: float,
             block: int, teacher=None, lowering: Lowering = Lowering()):
  """sum_j decay^j CE_j (module doc); returns (loss, per-step CE [steps]). `teacher` [Vd, Dt]:
  the target's LM-head rows of the head's vocabulary; then each CE_j is against the target's
  distribution from batch["hidden"] [B, T, Dt] at the label's slot (`soft_labels`).
  `lowering`: `Lowering(bf16_dots=True)` for mixed precision (every product, losses included)."""
  params = with_lowering({**frozen, **trainable}, lowering)
  bf16 = lowering.bf16_dots
  ces = []
  shared = None
  if teacher is not None:
    hid = batch["hidden"]
    hid = jnp.pad(hid, ((0, 0), (0, steps), (0, 0))).astype(jnp.float32)
    B, Tp, Dt = hid.shape
    V = teacher.shape[0]
    if B * Tp * V * 4 <= TEACHER_PROBS_BYTES:
      # the target's distribution at every slot once (one product), shared by the depths'
      # slices: each depth then costs 3 products of its outputs with the head, not 9
      shared = teacher_prob_blocks(hid.reshape(B * Tp, Dt), teacher, block=block, bf16=bf16)
      shared = shared.reshape(shared.shape[0], B, Tp, shared.shape[-1])
  for j, (hn, label, weight) in enumerate(ttt_outputs(params, frozen["embed"], batch,
                                                      config=config, steps=steps)):
    B, n, D = hn.shape  # step j's labels sit at slots 1 + j .. n + j, as in ttt_outputs
    x, w = hn.reshape(-1, D), weight.reshape(-1)
    if teacher is None:
      ces.append(vocab_cross_entropy(x, params["lm_head"], jnp.maximum(label, 0).reshape(-1),
                                     w, block=block, bf16=bf16))
    elif shared is not None:
      pb = shared[:, :, 1 + j:1 + j + n].reshape(shared.shape[0], B * n, -1)
      ces.append(blocked_probs_cross_entropy(x, params["lm_head"], pb, w, bf16=bf16))
    else:  # too large to hold: one [X, block] tile of the teacher at a time, per depth
      h = hid[:, 1 + j:1 + j + n].reshape(B * n, -1)
      ces.append(soft_cross_entropy(x, params["lm_head"], h, teacher, w, block=block,
                                    bf16=bf16))
  ces = jnp.stack(ces)
  return jnp.sum(ces * decay ** jnp.arange(steps)), ces


# --- evaluation --------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("config", "steps"))
def _heldout_sums(trainable, frozen, batch, *, config, steps):
  """Per TTT step: summed held-out cross-entropy, hits and label weight of one batch (one
  program per head config and steps, shared by every run of the process)."""
  p = {**frozen, **trainable}
  rows = []
  for hn, label, weight in ttt_outputs(p, frozen["embed"], batch, config=config, steps=steps):
    logits = jnp.einsum("BND,VD->BNV", hn, p["lm_head"], preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, -1)
    own = jnp.take_along_axis(logits, jnp.maximum(label, 0)[..., None], -1)[..., 0]
    hit = (jnp.argmax(logits, -1) == label)
    rows.append(jnp.stack([jnp.sum((lse - own) * weight), jnp.sum(hit * weight),
                           jnp.sum(weight)]))
  return jnp.stack(rows)


@functools.partial(jax.jit, static_argnames=("config", "steps", "decay", "block", "lowering"))
def train_step(st, batch, embed, teacher, hyper, *, config, steps, decay, block, lowering):
  """One optimizer step of the TTT loss. Module level, its settings static: every run of the
  process with the same head config and settings shares its traced and compiled program (the
  embedding, the teacher's rows and the optimizer's numbers are arguments, never constants)."""
  (loss, ces), grads = jax.value_and_grad(
      lambda p: ttt_loss(p, {"embed": embed, **st.aux}, batch, config=config, steps=steps,
                         decay=decay, block=block, teacher=teacher, lowering=lowering),
      has_aux=True)(st.params)
  return apply_grads(st, grads, optimizer_of(hyper)), loss


def evaluate_heldout(params, frozen, data: EagleData, held_idx, job: EagleJob, t2d, config,
                     fn_cache: dict, *, all_windows: bool = False) -> dict:
  """Held-out per-step loss and top-1 accuracy (whole records, windows of seq_len, batch_size
  windows per call). Windows that end inside the prompt hold no scored label and are skipped
  (the chat-task records' long passages are most of their tokens); `all_windows`: score them
  too, the same figures slower (a test compares)."""
  if "fn" not in fn_cache:
    fn_cache["fn"] = functools.partial(_heldout_sums, config=config, steps=job.ttt_steps)
  tot = np.zeros((job.ttt_steps, 3))
  skipped = total = 0
  windows = []
  for r in held_idx:
    _, toks, first = data.seqs[r]
    lab = data.labels[r][first:]
    total += len(lab)
    skipped += int(np.sum(t2d[lab] < 0))
    # windows of seq_len tokens that share one position, so each label is scored once at
    # step 0 (deeper steps lose the j positions past a window's end)
    windows += [(r, s) for s in range(0, max(1, len(toks) - 1), job.seq_len - 1)
                if all_windows or s + job.seq_len > first]  # else every slot is < first
  # batch_size windows per call (one program: the last batch is padded with weightless rows)
  B = job.batch_size
  for i in range(0, len(windows), B):
    part = windows[i:i + B]
    b = make_batch(data, [r for r, _ in part], None, job, t2d,
                   window_start=[s for _, s in part])
    if len(part) < B:
      b = {k: np.concatenate([v, np.zeros((B - len(part),) + v.shape[1:], v.dtype)])
           for k, v in b.items()}
      b["dlabel"][len(part):] = -1
    tot += np.asarray(fn_cache["fn"](params, frozen, {k: jnp.asarray(v) for k, v in b.items()}))
  n = np.maximum(tot[:, 2], 1)
  ce = tot[:, 0] / n
  out = {"heldout_loss": float(np.sum(ce * job.step_decay ** np.arange(job.ttt_steps)))}
  for j in range(job.ttt_steps):
    out[f"ce_{j}"] = float(ce[j])
    out[f"acc_{j}"] = float(tot[j, 1] / n[j])
  out["labels_outside_vocab"] = skipped / max(total, 1)
  return out
