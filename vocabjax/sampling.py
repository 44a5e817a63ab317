"""Logit processing: the one place logits become a sampling distribution.

The same `SamplingParams` and `log_probs` are applied to the target's p and the drafter's q, so
speculative sampling compares like with like. Letters: B batch, V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static sampling settings; temperature 0 means greedy (argmax)."""

  temperature: float = 0.0
  top_k: int = 0  # 0: off
  top_p: float = 1.0  # 1.0: off
  draft_in_set: bool = True  # drafters sample within the request's top-k / top-p set (their
  #   own law processed as the target's is); False: from their temperature-only law, as
  #   engines that sample drafts unprocessed do (the verifier, and so the output, is the same)

  def __post_init__(self):
    import numbers

    for name in ("temperature", "top_p"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{name} must be a number, got {v!r}")
    if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
      raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
    if not isinstance(self.draft_in_set, bool):
      raise ValueError(f"draft_in_set must be true or false, got {self.draft_in_set!r}")
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature=}")
    if self.temperature == float("inf"):
      raise ValueError(f"temperature must be finite, got {self.temperature=} (a uniform "
                       f"draw is not a temperature; use a large finite value)")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p=}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k=}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  @property
  def draft_law(self) -> "SamplingParams":
    """What a drafter's logits are processed with: these settings, or with `draft_in_set`
    False the temperature alone (drafts may then fall outside the request's set, where the
    target's p is 0 and they are rejected)."""
    return self if self.draft_in_set else SamplingParams(self.temperature)

  def validate_for_vocab(self, vocab_size: int) -> None:
    if self.top_k > vocab_size:
      raise ValueError(f"top_k={self.top_k} exceeds the vocabulary size V={vocab_size}")


def log_probs(logits: jax.Array, sp: SamplingParams) -> jax.Array:
  """Log-probabilities [..., V] after temperature, top-k and top-p (f32; -inf outside the support).

  Greedy settings give a point mass on the argmax (ties to the lowest id), so a verifier can
  treat greedy as the temperature -> 0 limit.
  """
  logits = logits.astype(jnp.float32)
  if sp.greedy:
    hot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.bool_)
    return jnp.where(hot, 0.0, -jnp.inf)
  logits = logits / sp.temperature
  if sp.top_k:
    kth = jax.lax.top_k(logits, sp.top_k)[0][..., -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  if sp.top_p < 1.0:
    # Keep the smallest prefix of the sorted distribution whose mass reaches top_p (the token
    # that crosses the threshold is kept, as in transformers' TopPLogitsWarper).
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < sp.top_p
    keep = jnp.take_along_axis(keep_sorted, jnp.argsort(order, axis=-1), axis=-1)
    logits = jnp.where(keep, logits, -jnp.inf)
  return jax.nn.log_softmax(logits, axis=-1)


def probs(logits: jax.Array, sp: SamplingParams) -> jax.Array:
  """Probabilities [..., V]: `exp(log_probs(logits, sp))`, the p and q of verification."""
  return jnp.exp(log_probs(logits, sp))


def sample(key: jax.Array, logits: jax.Array, sp: SamplingParams) -> jax.Array:
  """Next token ids [B] from logits [B, V]; `NONFINITE` for a row whose logits hold a NaN or an
  infinity (`flag_nonfinite`)."""
  if sp.greedy:
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  else:
    tok = jax.random.categorical(key, log_probs(logits, sp), axis=-1).astype(jnp.int32)
  return flag_nonfinite(tok, logits)


NONFINITE = -2  # a token id no vocabulary has: this row's target logits held a NaN or an inf


def flag_nonfinite(tokens: jax.Array, x: jax.Array) -> jax.Array:
  """tokens [B] with `NONFINITE` where row b of x [B, ...] (the target's logits or
  probabilities of a step) holds a NaN or an infinity. A NaN in the weights or an overflow
  otherwise turns every argmax into token 0 and every sample into garbage, silently; the host
  loop (`OutputCollector`) raises `NonFiniteLogitsError` on the flag instead. One elementwise
  pass over logits the step has just written: cheap beside the LM head that wrote them."""
  ok = jnp.all(jnp.isfinite(x), axis=tuple(range(1, x.ndim)))
  return jnp.where(ok, tokens, NONFINITE).astype(tokens.dtype)


BLOCK_TOP_K_MAX_K = 64  # blocked top-k only for small k (`top_k`); a top-1 is a reduction
SPLIT_TOP_K_MAX = 16  # larger k keep XLA's top_k even on a mesh


def top_k(x: jax.Array, k: int, *, split: bool = False,
          block: int = 0) -> tuple[jax.Array, jax.Array]:
  """`jax.lax.top_k` over the last axis (values descending, ties: lower index first); with
  `split` (`Lowering.split_top_k`, set by decoders on a mesh) and k <= SPLIT_TOP_K_MAX computed
  as k rounds of argmax, each masking the index it chose: the same values and indices (while
  at least k entries are finite). XLA's TopK is not partitioned: over logits whose vocabulary
  axis a mesh splits it gathers the whole [.., V] row to every device (1.2 MB per row and tree
  level for a 152K vocabulary), while an argmax reduces each device's rows locally and gathers
  one (value, index) per device. With `block` (`Lowering.block_top_k`), a last axis longer
  than twice the block and k <= BLOCK_TOP_K_MAX_K: in two stages (`blocked_top_k`), the same
  values and indices, which compiles faster on a TPU for a drafting tree's small k (SpecVocab's
  candidate top-k keeps one top_k: docs/tpu.md, 'In CI')."""
  if split and k <= SPLIT_TOP_K_MAX:
    return _argmax_rounds(x, k)
  if block and x.shape[-1] > 2 * block and 1 < k <= min(block, BLOCK_TOP_K_MAX_K):
    return blocked_top_k(x, k, block)
  return jax.lax.top_k(x, k)


def blocked_top_k(x: jax.Array, k: int, block: int) -> tuple[jax.Array, jax.Array]:
  """`jax.lax.top_k` over the last axis as the top-k of each `block` of it (padded with -inf)
  and then of the blocks' winners: the same values and indices (a winner of the row is a
  winner of its block; the second stage sees the blocks in index order and top_k keeps lower
  positions first, so ties still go to the lower index; padding never wins over a finite
  value, and over -inf it ranks after every real entry)."""
  V = x.shape[-1]
  nb = -(-V // block)
  xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, nb * block - V)],
               constant_values=-jnp.inf)
  v1, i1 = jax.lax.top_k(xp.reshape(x.shape[:-1] + (nb, block)), k)
  i1 = i1 + (jnp.arange(nb, dtype=i1.dtype) * block)[:, None]
  v2, j = jax.lax.top_k(v1.reshape(x.shape[:-1] + (nb * k,)), k)
  return v2, jnp.take_along_axis(i1.reshape(x.shape[:-1] + (nb * k,)), j, axis=-1)


def _argmax_rounds(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  iota = jnp.arange(x.shape[-1], dtype=jnp.int32)
  vals, idxs = [], []
  for _ in range(k):
    i = jnp.argmax(x, axis=-1).astype(jnp.int32)
    vals.append(jnp.take_along_axis(x, i[..., None], axis=-1)[..., 0])
    idxs.append(i)
    x = jnp.where(iota == i[..., None], -jnp.inf, x)
  return jnp.stack(vals, -1), jnp.stack(idxs, -1)
