"""Vocabulary policies: what the drafter's LM head computes (DESIGN "core contracts").

Letters: B batch, D drafter hidden size, K candidates, V target vocabulary.

A policy is a pure function of the drafter's params and final hidden state:

    policy(params, h[..., D]) -> (ids[..., K] int32 target ids, or None for "all V",
                                  logits[..., K or V] f32)

`full_policy(config)` is the plain LM head; `static_policy` VocabTrim / FR-Spec's trimmed head
(the same K ids for every row, `vocabjax.vocab.subset`); SpecVocab's ranker gives per-row ids
(`vocabjax.vocab.ranked`). (OmniDraft's drafter has its own vocabulary and translates instead,
`vocabjax.decoding.crossvocab`.) Drafting picks among the K candidates and maps the choice to a
target id (`to_target`), which the drafter embeds next; for stochastic verification q is
scattered into the full vocabulary with zeros elsewhere (`scatter_full`), so a token outside the
candidates keeps the target's probability through the residual max(p - q, 0). A policy's arrays
travel in the drafter's params under `POLICY_STATE` (arguments of the jitted programs, never
constants, sharded with the params), put there by `attach(params, config) -> (params, policy)`
and read back with `policy_state(params)`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from vocabjax.sampling import SamplingParams, log_probs
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head

Policy = Callable[[dict, jax.Array], tuple[Optional[jax.Array], jax.Array]]

POLICY_STATE = "vocab_policy"  # the params key of an attached policy's arrays


def with_policy_state(params: dict, state: dict) -> dict:
  """`params` plus a policy's arrays (one policy per drafter: attaching replaces)."""
  return {**params, POLICY_STATE: state}


def policy_state(params: dict) -> dict | None:
  """The arrays an attached policy stored, or None for the plain drafter."""
  return params.get(POLICY_STATE)


def _full(params, h, *, config):
  return None, lm_head(params, h, config=config)


@dataclasses.dataclass(frozen=True)
class BoundPolicy:
  """A policy function with its static settings bound, hashable and equal by value (a
  proposer's `key()` holds its policy: equal drafters share programs)."""

  fn: Callable
  settings: tuple  # ((name, value), ...) sorted by name

  def __call__(self, params, hidden):
    return self.fn(params, hidden, **dict(self.settings))


def bound_policy(fn: Callable, **settings) -> BoundPolicy:
  """`fn(params, hidden, **settings)` as a policy."""
  return BoundPolicy(fn, tuple(sorted(settings.items())))


def full_policy(config: LlamaLikeConfig) -> Policy:
  """The drafter's whole LM head: every target id is a candidate."""
  return bound_policy(_full, config=config)


def to_target(ids: jax.Array | None, j: jax.Array) -> jax.Array:
  """Target ids of candidate indices j[...] (j itself when every id is a candidate)."""
  if ids is None:
    return j.astype(jnp.int32)
  return jnp.take_along_axis(ids, j[..., None].astype(jnp.int32), axis=-1)[..., 0]


def to_target_many(ids: jax.Array | None, j: jax.Array) -> jax.Array:
  """Target ids of candidate indices j[..., n] (n picks per row, e.g. a tree's top-k)."""
  if ids is None:
    return j.astype(jnp.int32)
  return jnp.take_along_axis(ids, j.astype(jnp.int32), axis=-1)


def scatter_full(ids: jax.Array | None, values: jax.Array, vocab_size: int,
                 fill: float = 0.0) -> jax.Array:
  """values[..., K] at their target ids in a [..., V] array, `fill` elsewhere."""
  if ids is None:
    return values
  out = jnp.full(values.shape[:-1] + (vocab_size,), fill, values.dtype)
  return jnp.put_along_axis(out, ids, values, axis=-1, inplace=False)


def candidate_sampling(sp: SamplingParams, num_candidates: int) -> SamplingParams:
  """`sp` for a distribution over K candidates: a top-k of K or more keeps all of them."""
  if sp.top_k and sp.top_k >= num_candidates:
    return dataclasses.replace(sp, top_k=0)
  return sp


def draft_choice(policy: Policy, params, h, key, sampling: SamplingParams, vocab_size: int):
  """One drafted token per row: (target ids [...], q [..., V] or None when greedy).

  Greedy takes the argmax candidate (ties: the lowest candidate index, i.e. the lowest id for
  an ascending static subset); sampling draws from the processed candidate distribution and
  returns it scattered into the full vocabulary.
  """
  ids, logits = policy(params, h)
  if sampling.greedy:
    return to_target(ids, jnp.argmax(logits, axis=-1)), None
  lp = log_probs(logits, candidate_sampling(sampling, logits.shape[-1]))
  j = jax.random.categorical(key, lp, axis=-1)
  return to_target(ids, j), scatter_full(ids, jnp.exp(lp), vocab_size)
