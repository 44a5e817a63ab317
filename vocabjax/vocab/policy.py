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

A policy may also read per-request state (`RowVocab`: MicroSpec's in-context vocabulary,
EvoSpec's evolving one): arrays with one row per sequence, built from the prompt by
`init_rows`, updated by `observe` with each step's emitted tokens, carried by the engine in its
loop state (`EngineState.vocab`) and handed to the policy under `POLICY_ROWS` in the params of
each step (`with_rows`, read back with `policy_rows`). A row-state policy's leading hidden axis
is the batch row: h [B, ..., D].
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from vocabjax.sampling import SamplingParams, log_probs
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import is_int8, lm_head

Policy = Callable[[dict, jax.Array], tuple[Optional[jax.Array], jax.Array]]

POLICY_STATE = "vocab_policy"  # the params key of an attached policy's arrays
POLICY_ROWS = "vocab_rows"  # the params key of a row-state policy's per-request arrays


def with_policy_state(params: dict, state: dict) -> dict:
  """`params` plus a policy's arrays (one policy per drafter: attaching replaces)."""
  return {**params, POLICY_STATE: state}


def policy_state(params: dict) -> dict | None:
  """The arrays an attached policy stored, or None for the plain drafter."""
  return params.get(POLICY_STATE)


def with_rows(params: dict, rows) -> dict:
  """`params` with a row-state policy's per-request arrays (`RowVocab`) for this step."""
  return {**params, POLICY_ROWS: rows}


def policy_rows(params: dict, who: str = "this vocabulary policy"):
  """The per-request arrays the engine handed a row-state policy (an error naming `who` when
  the params carry none: such a policy runs only inside the speculative engine's steps)."""
  rows = params.get(POLICY_ROWS)
  if rows is None:
    raise ValueError(f"{who} reads per-request state (the context's tokens) that the "
                     f"speculative engine carries; it was called without it (outside the "
                     f"engine's steps, or by a proposer that does not name it as its "
                     f"draft_vocab)")
  return rows


class RowVocab(abc.ABC):
  """A vocabulary policy with per-request state (module doc). Shapes: B rows, T prompt slots,
  W emitted tokens per step (-1 after each row's tokens)."""

  @abc.abstractmethod
  def init_rows(self, state: dict, tokens: jax.Array, lengths: jax.Array, first: jax.Array):
    """The rows' state after the prompt: `state` the attached policy arrays
    (`policy_state`), `tokens` [B, T] right-padded, `lengths` [B], `first` [B] the target's
    first token (traced in the engine's prefill)."""

  @abc.abstractmethod
  def observe(self, state: dict, rows, emitted: jax.Array):
    """The rows' state after a step that emitted `emitted` [B, W] (traced in the step)."""

  def example_rows(self, params: dict, B: int):
    """A state for B rows as in the middle of a request (what timing the head alone uses)."""
    T = 64
    tokens = (jnp.arange(B * T, dtype=jnp.int32).reshape(B, T) * 7919) % self.vocab_size
    return self.init_rows(policy_state(params), tokens, jnp.full((B,), T, jnp.int32),
                          tokens[:, 0])


def row_vocab_of(proposer) -> RowVocab | None:
  """The proposer's row-state policy (its `draft_vocab`, or a hybrid's device proposer's, when
  that is a `RowVocab`), or None."""
  dv = getattr(proposer, "draft_vocab", None)
  if dv is None and getattr(proposer, "device", None) is not None:
    dv = getattr(proposer.device, "draft_vocab", None)  # a hybrid (eagle_pld, tree_suffix)
  return dv if isinstance(dv, RowVocab) else None


def require_float_head(params: dict, error: type[Exception], why: str) -> None:
  """Raise `error` when the drafter's weights are int8 (`quantize_int8`): the policies whose
  state is matched to, or gathers rows of, a float LM head say `why` and what to load instead."""
  if is_int8(params):
    raise error(f"{why}: load the drafter in float32 or bfloat16, not int8")


def policy_impl(impl: str, mesh) -> str:
  """The head kernel a policy runs on `mesh`: its own `impl` on one device, "reference" (XLA's
  gather and dot, which the sharding rules split) on a mesh of several (a Pallas kernel is one
  device's program)."""
  return "reference" if mesh is not None and mesh.size > 1 else impl


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
  """values[..., K] at their target ids in a [..., V] array, `fill` elsewhere. Ids may repeat
  where all but one of a repeated id's values are 0 (a padded candidate slot: the values add)."""
  if ids is None:
    return values
  lead, K = values.shape[:-1], values.shape[-1]
  flat_ids = jnp.broadcast_to(ids, values.shape).reshape(-1, K)
  flat = jnp.full((flat_ids.shape[0], vocab_size), fill, values.dtype)
  rows = jnp.arange(flat_ids.shape[0])[:, None]
  if fill:
    return flat.at[rows, flat_ids].set(values.reshape(-1, K)).reshape(lead + (vocab_size,))
  return flat.at[rows, flat_ids].add(values.reshape(-1, K)).reshape(lead + (vocab_size,))


def candidate_sampling(sp: SamplingParams, num_candidates: int) -> SamplingParams:
  """What a drafter's law over K candidates is processed with: `sp.draft_law` (the request's
  top-k / top-p, or its temperature alone), where a top-k of K or more keeps all of them."""
  sp = sp.draft_law
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
