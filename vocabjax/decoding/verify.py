"""Chain verification (Leviathan et al. 2023), greedy and stochastic kept apart, and
`verify_chain`: the one target forward + verification + commit that every chain method (a
drafter model's chain, prompt lookup, cross-vocabulary drafting) runs; trees have
`vocabjax.decoding.tree.verify_tree`.

Letters: B batch, G gamma (draft length), n tree nodes besides the root, V vocabulary. Pure functions, jit-friendly.

Both return `(num_accepted[B], next_token[B])`: the first `num_accepted[b]` drafts of row b are
kept and `next_token[b]` follows them (the correction on a rejection, the bonus token when all G
drafts were accepted), so every verification emits `num_accepted + 1` tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import forward, forward_features, lm_head
from vocabjax.sampling import SamplingParams, flag_nonfinite, probs, sample


def _leading_true(x: jax.Array) -> jax.Array:
  """Length of the all-True prefix along the last axis: [B, G] bool -> [B] int32."""
  return jnp.sum(jnp.cumprod(x.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def _valid(G: int, n_valid: jax.Array | None) -> jax.Array:
  """[B, G] or [1, G] bool: which drafts are real (a run shorter than G pads the rest)."""
  if n_valid is None:
    return jnp.ones((1, G), jnp.bool_)
  return jnp.arange(G)[None] < jnp.reshape(n_valid, (-1, 1))


def verify_chain_greedy(drafts: jax.Array, target_logits: jax.Array,
                        n_valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Greedy: accept the longest prefix equal to the target argmax, then the target's argmax.

  drafts [B, G] int; target_logits [B, G + 1, V] (position i predicts the token after draft i-1);
  n_valid [B] (optional): only the first n_valid drafts are real, the rest padding.
  """
  target_ids = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [B, G + 1]
  n = _leading_true((drafts == target_ids[:, :-1]) & _valid(drafts.shape[1], n_valid))
  return n, flag_nonfinite(jnp.take_along_axis(target_ids, n[:, None], axis=1)[:, 0],
                           target_logits)


def verify_chain_sampling(key: jax.Array, drafts: jax.Array, p: jax.Array, q: jax.Array,
                          n_valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Speculative sampling: exact for any drafter q, the output follows p.

  drafts [B, G]: sampled from q; p [B, G + 1, V] target probabilities and q [B, G, V] drafter
  probabilities, both after the *same* logit processing, both over the full target vocabulary
  (a drafter over a vocabulary subset passes q with zeros outside it). Accept draft i with
  probability min(1, p_i(x) / q_i(x)); at the first rejection sample from
  norm(max(0, p_i - q_i)); when all G are accepted sample the bonus from p_G. n_valid [B]
  (optional): only the first n_valid drafts are real; after them the bonus comes from p.
  """
  B, G = drafts.shape
  valid = _valid(G, n_valid)
  q = jnp.where(valid[..., None], q, 0.0)
  k_accept, k_resample = jax.random.split(key)
  p_d = jnp.take_along_axis(p[:, :G], drafts[..., None], axis=-1)[..., 0]
  q_d = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
  u = jax.random.uniform(k_accept, (B, G))
  n = _leading_true((u * q_d < p_d) & valid)  # u < p/q without dividing by q
  # The residual at the stopping position; q is zero at the bonus position, so there it is p.
  q_ext = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)
  p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]
  q_n = jnp.take_along_axis(q_ext, n[:, None, None], axis=1)[:, 0]
  residual = jnp.maximum(p_n - q_n, 0.0)
  mass = residual.sum(-1, keepdims=True)
  # mass == 0 only when p == q at a rejection, which has probability 0; fall back to p.
  residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_n)
  nxt = jax.random.categorical(k_resample, jnp.log(residual), axis=-1).astype(jnp.int32)
  return n, flag_nonfinite(nxt, p)


@struct.dataclass
class ChainVerdict:
  """What one chain verification commits (every array per row)."""

  accepted: jax.Array  # [B] accepted drafts n
  next: jax.Array  # [B] int32, the token the target emits after them
  emitted: jax.Array  # [B, G + 1] the n accepted drafts and `next`, then -1
  target_cache: KVCache  # every committed token but `next`: lengths + n + 1
  features: jax.Array | None = None  # [B, G + 1, Lf*Dt] the target's features of [last,
  #   drafts] (when asked: a drafter conditioned on the target's layers reads them next)


def verify_chain(target_params, last, drafts, target_cache: KVCache, key, *,
                 target_config: LlamaLikeConfig, sampling: SamplingParams, q=None,
                 n_valid=None, feature_layers: tuple[int, ...] | None = None) -> ChainVerdict:
  """Score [last, drafts] (drafts [B, G]) in one target forward at the cache's next slots,
  verify the drafts and commit.

  `q` [B, G, V]: the drafter's probabilities of each draft position over the target's
  vocabulary, after the same logit processing as the target's (sampling only; None: the drafts
  are point masses, as prompt lookup's are). `n_valid` [B]: only the first n_valid drafts of a
  row are real, the rest padding. With G = 0 the step samples the target's next token.
  `feature_layers`: also return the target's features of those layers at [last, drafts]."""
  B, G = drafts.shape
  N = target_cache.lengths
  tokens = jnp.concatenate([last[:, None], drafts], axis=1)  # [B, G + 1]
  positions = N[:, None] + jnp.arange(G + 1)[None]
  feats = None
  if feature_layers:
    h, cache, feats = forward_features(target_params, tokens, positions, target_cache,
                                       config=target_config, layers=feature_layers)
  else:
    h, cache = forward(target_params, tokens, positions, target_cache, config=target_config)
  logits = lm_head(target_params, h, config=target_config)  # [B, G + 1, V]
  if G == 0:
    n, nxt = jnp.zeros((B,), jnp.int32), sample(key, logits[:, 0], sampling)
  elif sampling.greedy:
    n, nxt = verify_chain_greedy(drafts, logits, n_valid)
  else:
    if q is None:
      q = jax.nn.one_hot(drafts, target_config.vocab_size, dtype=jnp.float32)
    n, nxt = verify_chain_sampling(key, drafts, probs(logits, sampling), q, n_valid)
  slot = jnp.arange(G + 1)[None]
  emitted = jnp.where(slot < n[:, None], jnp.pad(drafts, ((0, 0), (0, 1))),
                      jnp.where(slot == n[:, None], nxt[:, None], -1))
  return ChainVerdict(accepted=n, next=nxt.astype(jnp.int32), emitted=emitted,
                      target_cache=cache.with_lengths(N + 1 + n), features=feats)


def _children(parent_full: jax.Array, cur: jax.Array) -> jax.Array:
  """[B, n+1] bool: which nodes are children of node cur[b] (the root is nobody's child)."""
  idx = jnp.arange(parent_full.shape[1])[None]
  return (parent_full == cur[:, None]) & (idx > 0)


def verify_tree_greedy(tokens: jax.Array, parent_full: jax.Array, target_logits: jax.Array,
                       depth: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Greedy tree walk: follow the child whose token is the target's argmax at each node.

  tokens [B, n+1] (root first), parent_full [B, n+1], target_logits [B, n+1, V].
  Returns (accepted [B], path [B, depth + 1] node indices, root first, 0-padded; next [B]).
  """
  target_ids = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
  B = tokens.shape[0]
  cur = jnp.zeros((B,), jnp.int32)
  n = jnp.zeros((B,), jnp.int32)
  active = jnp.ones((B,), jnp.bool_)
  path = [cur]
  for _ in range(depth):
    want = jnp.take_along_axis(target_ids, cur[:, None], 1)
    match = _children(parent_full, cur) & (tokens == want)
    found = active & match.any(-1)
    cur = jnp.where(found, jnp.argmax(match, -1).astype(jnp.int32), cur)
    n, active = n + found, found
    path.append(jnp.where(found, cur, 0))
  nxt = jnp.take_along_axis(target_ids, cur[:, None], 1)[:, 0]
  return n, jnp.stack(path, 1), flag_nonfinite(nxt, target_logits)


def verify_tree_sampling(key: jax.Array, tokens: jax.Array, parent_full: jax.Array,
                         p: jax.Array, top_k: int,
                         depth: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Lossless verification of deterministically chosen (top-k) tree drafts.

  The drafting distribution of a top-k child is a point mass, so child x is accepted with
  probability p'(x); on rejection p'(x) is zeroed and p' renormalized before the next sibling
  (EAGLE issues 110/183/221; SpecInfer's multi-draft rule with q = delta). When no child is
  accepted, or the node has none, the next token is sampled from the adjusted p'. The result
  is distributed exactly as p. p [B, n+1, V] are the target's processed probabilities.
  Returns (accepted [B], path [B, depth + 1], next [B]) as `verify_tree_greedy`.
  """
  B, n_nodes, V = p.shape
  rows = jnp.arange(B)
  keys = jax.random.split(key, depth * top_k + 1)
  cur = jnp.zeros((B,), jnp.int32)
  n = jnp.zeros((B,), jnp.int32)
  active = jnp.ones((B,), jnp.bool_)
  final = p[:, 0]
  path = [cur]
  idx = jnp.arange(n_nodes)[None]
  for level in range(depth):
    is_child = _children(parent_full, cur)
    # the (at most top_k) children in node order
    order = jnp.argsort(jnp.where(is_child, idx, n_nodes + idx), axis=1)[:, :top_k]
    valid_c = jnp.take_along_axis(is_child, order, 1)
    p_adj = p[rows, cur]
    accepted = jnp.zeros((B,), jnp.bool_)
    chosen = cur
    for c in range(top_k):
      j = order[:, c]
      x = tokens[rows, j]
      px = p_adj[rows, x]
      u = jax.random.uniform(keys[level * top_k + c], (B,))
      try_it = active & ~accepted & valid_c[:, c]
      acc = try_it & (u < px)
      rej = try_it & ~acc
      zeroed = p_adj.at[rows, x].set(0.0)
      mass = zeroed.sum(-1, keepdims=True)
      zeroed = zeroed / jnp.where(mass > 0, mass, 1.0)
      p_adj = jnp.where(rej[:, None], zeroed, p_adj)
      chosen = jnp.where(acc, j, chosen)
      accepted = accepted | acc
    stop = active & ~accepted
    final = jnp.where(stop[:, None], p_adj, final)
    cur = jnp.where(accepted, chosen, cur).astype(jnp.int32)
    n = n + accepted
    active = accepted
    path.append(jnp.where(accepted, cur, 0))
  final = jnp.where(active[:, None], p[rows, cur], final)  # reached full depth: bonus from p
  nxt = jax.random.categorical(keys[-1], jnp.log(final), axis=-1).astype(jnp.int32)
  return n, jnp.stack(path, 1), flag_nonfinite(nxt, p)
