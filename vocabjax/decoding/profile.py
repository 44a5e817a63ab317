"""Where a speculative step's time goes: drafter body, drafter LM head, target verification.

A speculative step is one compiled program, so its parts cannot be timed from inside. This
module compiles each part on its own with the shapes the step uses (the drafter forwards of
one step, the drafter LM head on the same rows, the target forward + LM head over the verified
block), times them (median of `repeats` calls after a warm-up), and scales by the number of
steps a run took. What the split does not cover (acceptance, cache rollback, host loop,
dispatch) is reported as the measured remainder of the run's decode time, never hidden.

    split = step_split(decoder, batch_size=1, max_len=512)      # seconds per step, by part
    run = run_split(split, res.steps, res.decode_s, **skipped_drafting(res.stats))  # per run
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax import sharding
from vocabjax.decoding.drafter import model_body
from vocabjax.lowering import step_lowering, with_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.llamalike import compute_dtype, lm_head
from vocabjax.vocab.policy import row_vocab_of, with_rows


@dataclasses.dataclass(frozen=True)
class StepSplit:
  """Seconds per speculative step, by part (each part timed as its own compiled program)."""

  drafter_s: float  # drafter forwards of one step, LM head excluded
  drafter_head_s: float  # the drafter LM head calls of one step
  verification_s: float  # target forward + full LM head over the verified block
  target_step_s: float  # a T=1 target forward + head with the decoder's target params (their
  #   layout: on CPU the block layout, ~10% slower at T=1 than the AR decoder's), for reference
  drafter_calls: tuple  # ((T, head_rows), ...) the drafter calls of one step, per row
  #   (chain counts its conditional catch-up call in every step: an upper bound)
  verify_tokens: int  # target positions verified per step, per row

  @property
  def step_s(self) -> float:
    return self.drafter_s + self.drafter_head_s + self.verification_s

  @property
  def drafter_head_share(self) -> float:
    """LM head's share of the drafter's time in a step."""
    d = self.drafter_s + self.drafter_head_s
    return self.drafter_head_s / d if d else float("nan")

  @classmethod
  def from_dict(cls, d: dict) -> "StepSplit":
    """Inverse of `as_dict` (a split saved to JSON)."""
    names = [f.name for f in dataclasses.fields(cls)]
    kw = {k: d[k] for k in names}
    kw["drafter_calls"] = tuple(tuple(c) for c in kw["drafter_calls"])
    return cls(**kw)

  def as_dict(self) -> dict:
    out = dataclasses.asdict(self)
    out.update(step_s=self.step_s, drafter_head_share=self.drafter_head_share)
    out["drafter_calls"] = [list(c) for c in self.drafter_calls]
    return out


def median_s(fn, *args, repeats: int) -> float:
  """Median wall time of `fn(*args)` over `repeats` calls after one warm-up (compile) call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _time_body(body, params, config, B: int, T: int, S: int, context: int,
               repeats: int, mesh=None) -> float:
  """`body(params, tokens, positions, cache)` over T tokens after `context` cached ones (the
  cache placed on `mesh` as the decoders place theirs). A body that returns (output, cache)
  has its cache donated and passed on call to call, as a step's is (a cache that is neither
  donated nor returned is copied whole each call: a 1.5B model's 2,048-slot cache made its
  one-token body time 75 ms against 44); one that returns its output alone is timed as is."""
  cache = KVCache.init(config, B, S, compute_dtype(params)).with_lengths(
      jnp.full((B,), context, jnp.int32))
  if mesh is not None:
    cache = sharding.shard_cache(cache, config, mesh)
  tokens = jnp.zeros((B, T), jnp.int32)

  def run(p, t, c):
    return body(p, t, context + jnp.broadcast_to(jnp.arange(T), (B, T)), c)

  shape = jax.eval_shape(run, params, tokens, cache)
  if not (isinstance(shape, tuple) and len(shape) == 2 and isinstance(shape[1], KVCache)):
    return median_s(jax.jit(run), params, tokens, cache, repeats=repeats)
  f = jax.jit(run, donate_argnums=(2,))
  held = [cache]

  def call(p, t, first):  # `first`: the cache before the first call (then the one returned)
    del first
    out, c = f(p, t, held[0])
    held[0] = c.with_lengths(jnp.full((B,), context, jnp.int32))  # the same context each call
    return out

  return median_s(call, params, tokens, cache, repeats=repeats)


def _time_head(params, head, B: int, rows: int, D: int, repeats: int) -> float:
  f = jax.jit(head)
  return median_s(f, params, jnp.ones((B, rows, D), compute_dtype(params)), repeats=repeats)


def step_split(decoder, *, batch_size: int = 1, max_len: int = 512, context: int | None = None,
               repeats: int = 5) -> StepSplit:
  """Time the parts of one step of `decoder` (an engine whose proposer is `Profiled`: a drafter
  model's chain or tree, an EAGLE or Medusa head).

  `context`: committed tokens in the cache while timing (default: half of `max_len`). A
  decoder on a mesh has its parts timed on that mesh (its placed params, caches placed by the
  sharding rules, XLA's partitioned dot as its steps use).
  """
  return _step_split(decoder, batch_size, max_len, context, repeats, decoder.mesh)


def _step_split(decoder, batch_size, max_len, context, repeats, mesh) -> StepSplit:
  B, S = batch_size, max_len
  lw = step_lowering(decoder.lowering)  # the parts lowered as the decoder's steps are
  calls = tuple(decoder.drafter_calls())
  T_verify = decoder.verify_tokens
  context = S // 2 if context is None else context
  if context + T_verify + max(t for t, _ in calls) > S:
    raise ValueError(f"{context=} + one step does not fit the timing cache {max_len=}")
  tp, tc = with_lowering(decoder.target_params, lw), decoder.target_config
  dbody, dp, dcache_config = decoder.drafter_body()
  dp = with_lowering(dp, lw)
  dhead = decoder.draft_policy
  rv = row_vocab_of(decoder.proposer)
  if rv is not None:  # a row-state policy reads a request's vocabulary: one mid-request
    dp = with_rows(dp, rv.example_rows(dp, B))
  tbody = functools.partial(model_body, config=tc)
  thead = functools.partial(lm_head, config=tc)
  body_t, head_t = {}, {}
  for T, rows in calls:
    if T not in body_t:
      body_t[T] = _time_body(dbody, dp, dcache_config, B, T, S, context, repeats, mesh)
    if rows and rows not in head_t:
      head_t[rows] = _time_head(dp, dhead, B, rows, decoder.proposer.draft_width(), repeats)
  verify = (_time_body(tbody, tp, tc, B, T_verify, S, context, repeats, mesh)
            + _time_head(tp, thead, B, T_verify, tc.hidden_size, repeats))
  ar = (_time_body(tbody, tp, tc, B, 1, S, context, repeats, mesh)
        + _time_head(tp, thead, B, 1, tc.hidden_size, repeats))
  return StepSplit(drafter_s=sum(body_t[T] for T, _ in calls),
                   drafter_head_s=sum(head_t[r] for _, r in calls if r),
                   verification_s=verify, target_step_s=ar, drafter_calls=calls,
                   verify_tokens=T_verify)


def run_split(split: StepSplit, steps: int, decode_s: float, *, verified_steps: int | None = None,
              drafter_steps: int | None = None) -> dict:
  """A run's decode time split: per-step parts x the steps that ran them, and the measured
  remainder (acceptance, rollback, the host loop): `other_s`, never negative. Each part is
  timed as a program of its own, which the step fuses: where the parts add up to more than the
  run took, `other_s` is 0 and `parts_excess_s` says by how much they exceed it (the parts are
  then upper bounds, and the remainder is not measurable).

  A method whose steps may skip drafting (`skipped_drafting`: prompt lookup without a match, a
  gated EAGLE step whose head was unsure) passes `verified_steps` (steps that verified drafts;
  the others verified one token, counted at `target_step_s`) and `drafter_steps` (steps where
  the drafter ran); both default to every step. eagle_pld's steps with lookup nodes alone are
  counted at the full verification's cost (an upper bound: they verify the trie only)."""
  v = steps if verified_steps is None else verified_steps
  d = steps if drafter_steps is None else drafter_steps
  if not (0 <= d <= steps and 0 <= v <= steps):
    raise ValueError(f"verified_steps={verified_steps} and drafter_steps={drafter_steps} must "
                     f"lie in [0, steps={steps}]")
  parts = {"drafter_s": split.drafter_s * d, "drafter_head_s": split.drafter_head_s * d,
           "verification_s": split.verification_s * v + split.target_step_s * (steps - v)}
  rest = decode_s - sum(parts.values())
  parts["other_s"], parts["parts_excess_s"] = max(rest, 0.0), max(-rest, 0.0)
  parts["decode_s"] = decode_s
  return parts


def skipped_drafting(stats) -> dict:
  """`run_split`'s keywords for a run whose steps may skip drafting (a LookupStats: prompt
  lookup, gated EAGLE, eagle_pld), from its per-step counts; {} for a method that drafts in
  every step. A batched step drafts when any of its rows does."""
  if not getattr(stats, "active", None):  # no per-row activity recorded: drafts every step
    return {}
  verified = sum(1 for row in stats.drafted if any(row))
  head = getattr(stats, "head", None)  # eagle_pld: steps where its head drafted
  drafter = verified if head is None else sum(1 for row in head if any(row))
  return {"verified_steps": verified, "drafter_steps": drafter}
