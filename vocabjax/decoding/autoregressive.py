"""Plain autoregressive decoding: the baseline every speculative method must reproduce.

Letters: B batch, T prompt length (padded), S cache slots, V vocab.

Prompts of different lengths are right-padded into one [B, T] block; each row's cache length is
then reset to its own prompt length, so padding is never attended and positions are exact
(row b of a batch gives the same tokens as that prompt alone). Prefill and the decode step are
compiled ahead of time once per (config, B, T, S, sampling); the Python loop only checks
EOS/stop conditions, so no token ever triggers a recompilation.

`Decoder.generate_continuous` decodes many prompts with a fixed number of rows (continuous
batching): a row whose prompt finishes takes the next prompt, prefilled alone into a fresh
one-row cache that replaces the row's; for bulk generation (training data) where a batch's
rows would otherwise idle until its longest answer ends.
"""

from __future__ import annotations

import collections.abc
import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax import sharding
from vocabjax.backends import available_memory_bytes
from vocabjax.decoding.base import DecodingMethod, GenerationResult
from vocabjax.decoding.engine import (KEY, ProgramCache, ProgramKey, Request, abstract_arg,
                                      fold_in, host_loop, placed_like)
from vocabjax.sampling import NONFINITE, SamplingParams, sample
from vocabjax.lowering import Lowering, decoding_lowering, lowered, step_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import compute_dtype, forward, lm_head


class NonFiniteLogitsError(ValueError):
  """A decoding step's target logits held a NaN or an infinity (flagged in the compiled step
  as `sampling.NONFINITE`): without this, argmax would emit token 0 forever."""


def nonfinite_error(row: int, position: int, step: int | None = None) -> NonFiniteLogitsError:
  """The error for row `row`'s generated token `position` whose target logits held NaN or inf
  (step 0 is the prefill); the caller raises it where it sees the `NONFINITE` flag."""
  where = "the prefill" if step == 0 else (f"decoding step {step}" if step is not None
                                            else "a decoding step")
  return NonFiniteLogitsError(
      f"the target's logits in {where} hold NaN or inf (row {row}, generated token "
      f"{position}): the weights hold non-finite values or the activations overflowed "
      f"their dtype; nothing after this point would be a real token (load_model checks "
      f"weights with check_finite=True; try float32 weights)")


class OutputCollector:
  """Appends each row's emitted tokens and decides when the row is finished.

  A row finishes at an EOS token (kept), at a stop string (checked on the detokenized tail) or
  at `max_new_tokens`; tokens a step emits past that point are dropped. A `NONFINITE` token
  (the step's target logits held NaN or inf) raises `NonFiniteLogitsError`.

  `streamer`: an object with transformers' streamer methods (`put(ids)`, `end()`:
  `transformers.TextStreamer`, `TextIteratorStreamer`, or one's own), for one row: it gets the
  prompt (`begin`), then each call's kept tokens as they are kept (a speculative step's
  accepted block at once), then `end()` (`finish`).
  """

  def __init__(self, batch_size: int, max_new_tokens: int, eos_token_ids: Sequence[int] = (),
               stop_strings: Sequence[str] = (), tokenizer=None, streamer=None):
    if stop_strings and tokenizer is None:
      raise ValueError("stop strings need a tokenizer to detokenize with")
    if streamer is not None and batch_size != 1:
      raise ValueError(f"a streamer takes one row (as transformers' streamers do); this "
                       f"request has {batch_size} rows")
    self.streamer = streamer
    self.max_new_tokens, self.stop_strings, self.tokenizer = (max_new_tokens, stop_strings,
                                                              tokenizer)
    self.eos = set(int(e) for e in eos_token_ids)
    self.tokens: list[list[int]] = [[] for _ in range(batch_size)]
    self.reasons = ["length"] * batch_size
    self.done = np.zeros(batch_size, bool)
    self.calls = 0  # add() calls so far: the prefill's token, then one per step

  def begin(self, prompts: Sequence[Sequence[int]]) -> None:
    """The streamer (if any) gets the prompt first, as transformers' `generate` gives it
    (`TextStreamer(skip_prompt=True)` skips that first call)."""
    if self.streamer is not None:
      self.streamer.put(np.asarray([prompts[0]], np.int64))

  def finish(self) -> None:
    """Every row is done: the streamer's `end()`."""
    if self.streamer is not None:
      self.streamer.end()

  def add(self, emitted: np.ndarray) -> None:
    """emitted [B] or [B, W]: each row's new tokens in order; -1 ends a row's block early."""
    emitted = np.asarray(emitted).reshape(len(self.tokens), -1)
    self.calls += 1
    for b in np.flatnonzero(~self.done):
      self.add_row(b, emitted[b], step=self.calls - 1)

  def add_row(self, b: int, emitted, step: int | None = None) -> None:
    """Row b's new tokens in order (-1 ends them early); nothing once the row is done."""
    row = self.tokens[b]
    before = len(row)
    self._extend(b, row, emitted, step)
    if self.streamer is not None and len(row) > before:
      self.streamer.put(np.asarray(row[before:], np.int64))

  def _extend(self, b: int, row: list, emitted, step) -> None:
    for tok in emitted:
      if tok == NONFINITE and not self.done[b]:
        raise nonfinite_error(b, len(row), step)
      if self.done[b] or tok < 0:
        break
      row.append(int(tok))
      if tok in self.eos:
        self.done[b], self.reasons[b] = True, "eos"
      elif self.stop_strings and _hits_stop(self.tokenizer, row, self.stop_strings):
        self.done[b], self.reasons[b] = True, "stop"
      elif len(row) >= self.max_new_tokens:
        self.done[b] = True


def bucket(n: int, minimum: int = 16) -> int:
  """Round up to a power of two (few distinct compiled shapes across prompts)."""
  return max(minimum, 1 << (max(n, 1) - 1).bit_length())


PROMPT_STEP = 128  # prompt blocks above this many tokens grow by this many


def cache_slots(longest: int, room: int, max_len: int | None = None) -> int:
  """Cache slots S of a request: `max_len`, else the longest prompt + `room` (new tokens +
  the slots one step may write past them) rounded up to a bucket. The one formula every
  decoder (and `cache_len`) uses."""
  return max_len or bucket(longest + room)


def prompt_bucket(n: int, step: int = PROMPT_STEP) -> int:
  """The prompt block T for an n-token prompt: a power of two up to `step`, then the next
  multiple of it. Prefill is compute bound (every padded position costs a full token's
  FLOPs), so a 709-token prompt runs as 768 tokens, not 1024 (a 1.5B f32 prefill: ~25% less
  time), at the price of a few more compiled shapes."""
  if n <= step:
    return bucket(n)
  return -(-n // step) * step


def _prefill(params, tokens, prompt_lengths, cache, key, *, config, sampling):
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  hidden, cache = forward(params, tokens, positions, cache, config=config, fresh=True,
                          valid_lengths=prompt_lengths)
  cache = cache.with_lengths(prompt_lengths)
  last = jnp.take_along_axis(hidden, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]
  logits = lm_head(params, last, config=config)
  return sample(key, logits, sampling), cache


def abstract_cache(config: LlamaLikeConfig, B: int, S: int, dtype, mesh=None) -> KVCache:
  """The cache's shapes (and shardings on a mesh) for lowering, without allocating it."""
  shapes = jax.eval_shape(lambda: KVCache.init(config, B, S, dtype))
  if mesh is None:
    return shapes
  specs = sharding.cache_specs(config, B, mesh, ring=shapes.k_local is not None)
  return jax.tree.map(lambda x, spec: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=jax.sharding.NamedSharding(mesh, spec)), shapes, specs)


def prefill_in_bf16(params) -> bool:
  """Whether a model's prompt prefill runs the CPU's bf16 GEMM (`Lowering.bf16_blocks`):
  when its weight matrices are stored bf16. Such a prefill rounds its activations to bf16 before
  each projection, as PyTorch's and every bf16 framework's GEMM does, at twice XLA:CPU's f32
  rate (the decoding steps keep f32 activations). f32 and int8 models prefill in exact f32.
  Every decoder of one model compiles its prefill the same way, so speculative outputs stay
  identical to plain decoding's."""
  layers = params.get("layers") or [{}]
  w = layers[0].get("wq")
  return w is not None and w.dtype == jnp.bfloat16


def compile_prefill(params, config: LlamaLikeConfig, sampling: SamplingParams, B: int, T: int,
                    cache: KVCache, lowering: Lowering = Lowering()):
  """AOT-compiled `_prefill` for a [B, T] prompt block (the cache argument is donated), lowered
  as `lowering` says; bf16 weights prefill with the bf16 GEMM (`prefill_in_bf16`)."""
  i32 = jax.ShapeDtypeStruct
  lowering = lowering.replace(bf16_blocks=prefill_in_bf16(params))
  return jax.jit(lowered(functools.partial(_prefill, config=config, sampling=sampling),
                         lowering), donate_argnums=(3,)).lower(
      params, i32((B, T), jnp.int32), i32((B,), jnp.int32), cache, jax.random.key(0)).compile()


def _step(params, tokens, cache, key, *, config, sampling):
  positions = cache.lengths[:, None]
  hidden, cache = forward(params, tokens[:, None], positions, cache, config=config)
  logits = lm_head(params, hidden[:, 0], config=config)
  return sample(key, logits, sampling), cache


class Decoder(DecodingMethod):
  """Compiles and runs prefill + decode steps for one model (reused across calls)."""

  method = "ar"

  def __init__(self, params: dict, config: LlamaLikeConfig, mesh=None):
    """`mesh`: optional ("data", "model") mesh; params and cache are then placed SPMD on it."""
    self.config, self.mesh = config, mesh
    # what every program of this decoder lowers with (`vocabjax.lowering`): on a mesh XLA's dot
    # is partitioned with the weights; the CPU kernel is one device's custom call (GSPMD would
    # gather the weights to it), so sharded programs do without it
    self.lowering = decoding_lowering(mesh=mesh)
    self.params = params if mesh is None else sharding.shard_params(params, config, mesh)
    self._programs = ProgramCache()

  def _new_cache(self, B: int, S: int, dtype) -> KVCache:
    cache = KVCache.init(self.config, B, S, dtype)
    return cache if self.mesh is None else sharding.shard_cache(cache, self.config, self.mesh)

  step_programs = ("step",)  # the programs one decoding step runs (`lower`'s names)
  prefill_programs = ("prefill",)

  def programs(self, sampling: SamplingParams, B: int, T: int, S: int, cache_dtype):
    """(prefill, step, compile seconds) for these shapes, compiled once."""
    prefill, c1 = self.prefill_program(sampling, B, T, S, cache_dtype)
    step, c2 = self.step_program(sampling, B, S, cache_dtype)
    return prefill, step, c1 + c2

  def abstract_caches(self, B: int, S: int, dtype) -> list:
    """The step's KV cache, abstract and placed (with the params, or on the mesh)."""
    cache = abstract_cache(self.config, B, S, dtype, self.mesh)
    return [cache if self.mesh is not None else placed_like(cache, self.params)]

  def lower(self, sampling: SamplingParams, B: int, T: int, S: int, dtype, *,
            programs=("prefill", "step")) -> dict:
    """The decoder's programs for these shapes, LOWERED (not compiled): "prefill" (a [B, T]
    prompt block into S slots) and "step" (`programs`: which). What `programs()` compiles, and
    what bench and the deviceless TPU/GPU builds compile."""
    i32 = lambda *shape: abstract_arg(shape, jnp.int32, B=B, mesh=self.mesh,  # noqa: E731
                                      like=self.params)
    key = abstract_arg(KEY.shape, KEY.dtype, B=B, mesh=self.mesh, like=self.params, rows=False)
    cache, = self.abstract_caches(B, S, dtype)
    out = {}
    if "prefill" in programs:
      lw = self.lowering.replace(bf16_blocks=prefill_in_bf16(self.params))
      out["prefill"] = jax.jit(lowered(functools.partial(_prefill, config=self.config,
                                                         sampling=sampling), lw),
                               donate_argnums=(3,)).lower(self.params, i32(B, T), i32(B),
                                                          cache, key)
    if "step" in programs:
      out["step"] = jax.jit(lowered(functools.partial(_step, config=self.config,
                                                      sampling=sampling),
                                    step_lowering(self.lowering)), donate_argnums=(2,)).lower(
          self.params, i32(B), cache, key)
    return out

  def _compile(self, name: str, sampling, shapes: tuple, build):
    """(program, compile seconds): `build()` once per `ProgramKey`."""
    key = ProgramKey(name, ("ar", self.config), sampling, shapes, self.lowering)
    return self._programs.get(key, build)

  def prefill_program(self, sampling: SamplingParams, B: int, T: int, S: int, cache_dtype):
    """(compiled `_prefill` of a [B, T] prompt block into an S-slot cache, compile seconds)."""
    return self._compile("prefill", sampling, (B, T, S, jnp.dtype(cache_dtype).name),
                         lambda: self.lower(sampling, B, T, S, cache_dtype,
                                            programs=("prefill",))["prefill"].compile())

  def step_program(self, sampling: SamplingParams, B: int, S: int, cache_dtype):
    """(compiled decode step of B rows over an S-slot cache, compile seconds)."""
    return self._compile("step", sampling, (B, S, jnp.dtype(cache_dtype).name),
                         lambda: self.lower(sampling, B, 1, S, cache_dtype,
                                            programs=("step",))["step"].compile())

  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               eos_token_ids: Sequence[int] = (), max_len: int | None = None,
               stop_strings: Sequence[str] = (), tokenizer=None,
               cache_dtype=None, streamer=None) -> GenerationResult:
    """Generate up to `max_new_tokens` per prompt; rows stop at EOS or a stop string.
    `streamer`: see `DecodingMethod.generate`."""
    cfg = self.config
    prompts = token_ids(prompts)
    validate_request(prompts, max_new_tokens, sampling, cfg, max_len)
    B = len(prompts)
    out = OutputCollector(B, max_new_tokens, eos_token_ids, stop_strings, tokenizer, streamer)
    lengths = np.array([len(p) for p in prompts], np.int32)
    longest = int(lengths.max())
    S = cache_slots(longest, max_new_tokens, max_len)
    T = min(prompt_bucket(longest), S)  # validate_request guarantees longest <= T <= S
    cache_dtype = cache_dtype or compute_dtype(self.params)
    prefill, step, compile_s = self.programs(sampling, B, T, S, cache_dtype)

    tokens = np.zeros((B, T), np.int32)
    for b, p in enumerate(prompts):
      tokens[b, :len(p)] = p
    req = Request(prompts, lengths, S, T, tokens, jax.random.key(seed), out)

    def start():
      new, cache = prefill(self.params, jnp.asarray(tokens), jnp.asarray(lengths),
                           self._new_cache(B, S, cache_dtype), fold_in(req.key, 0))
      return new, (new, cache)

    def advance(carry, i, key, active):
      new, cache = step(self.params, *carry, key)
      return (new, cache), new, 0.0

    return host_loop(req, start, advance, compile_s=compile_s)

  def generate_continuous(self, prompts: Sequence[Sequence[int]], *, rows: int,
                          max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                          seed: int = 0, eos_token_ids: Sequence[int] = (),
                          max_len: int | None = None, stop_strings: Sequence[str] = (),
                          tokenizer=None, cache_dtype=None) -> GenerationResult:
    """Continuous batching: `rows` cache rows decode the prompts, and a row whose prompt is
    finished takes the next one (prefilled alone, the row's cache replaced), so prompts with
    answers of different lengths keep every row busy instead of waiting for a batch's longest.
    Rows and outputs are in prompt order; each prompt's output is what `generate` gives it
    (a batch-1 prefill and `rows`-row decode steps, whose rows never see each other).
    `steps` counts the decode steps, `prefill_s` the prompts' prefills (one at a time).
    Sampling draws other random numbers than `generate` (per prompt and step). One device."""
    if self.mesh is not None:
      raise ValueError("continuous batching runs on one device; use generate() on a mesh")
    if rows < 1:
      raise ValueError(f"rows={rows} must be >= 1")
    cfg = self.config
    prompts = token_ids(prompts)
    validate_request(prompts, max_new_tokens, sampling, cfg, max_len)
    N, B = len(prompts), min(rows, len(prompts))
    out = OutputCollector(N, max_new_tokens, eos_token_ids, stop_strings, tokenizer)
    lengths = [len(p) for p in prompts]
    S = cache_slots(max(lengths), max_new_tokens, max_len)
    cache_dtype = cache_dtype or compute_dtype(self.params)
    step, compile_s = self.step_program(sampling, B, S, cache_dtype)
    key_prefill, key_step = jax.random.split(jax.random.key(seed))
    cache = self._new_cache(B, S, cache_dtype)
    new = np.zeros(B, np.int32)
    occupant = [-1] * B  # the prompt each row decodes (-1: idle)
    pending = iter(range(N))
    timing = {"prefill": 0.0, "compile": 0.0}  # spent on the prompts' prefills

    def fill(b: int) -> None:
      """Give row b the next prompt that is not finished by its first token."""
      nonlocal cache
      for i in pending:
        T = min(prompt_bucket(lengths[i]), S)
        prefill, c = self.prefill_program(sampling, 1, T, S, cache_dtype)
        timing["compile"] += c
        t = time.perf_counter()
        tokens = np.zeros((1, T), np.int32)
        tokens[0, :lengths[i]] = prompts[i]
        tok, row = prefill(self.params, jnp.asarray(tokens),
                           jnp.asarray([lengths[i]], jnp.int32),
                           self._new_cache(1, S, cache_dtype),
                           fold_in(key_prefill, i))
        tok = int(np.asarray(tok)[0])
        out.add_row(i, [tok], step=0)
        if not out.done[i]:
          cache = _put_row(cache, row, b)
          timing["prefill"] += time.perf_counter() - t
          new[b], occupant[b] = tok, i
          return
        timing["prefill"] += time.perf_counter() - t
      occupant[b] = -1  # no prompt left: the row idles from slot 0 (never past S)
      cache = cache.replace(lengths=cache.lengths.at[b].set(0))

    t0 = time.perf_counter()
    for b in range(B):
      fill(b)
    steps = 0
    while any(i >= 0 for i in occupant):
      steps += 1
      emitted, cache = step(self.params, jnp.asarray(new), cache,
                            fold_in(key_step, steps))
      new = np.array(emitted, np.int32)
      for b, i in enumerate(occupant):
        if i >= 0:
          out.add_row(i, [int(new[b])], step=steps)
          if out.done[i]:
            fill(b)
    total = time.perf_counter() - t0
    return GenerationResult(tokens=out.tokens, finish_reasons=out.reasons,
                            prompt_lengths=lengths, compile_s=compile_s + timing["compile"],
                            prefill_s=timing["prefill"],
                            decode_s=total - timing["prefill"] - timing["compile"], steps=steps)


@functools.partial(jax.jit, donate_argnums=(0,))
def _put_row(cache: KVCache, row: KVCache, b) -> KVCache:
  """`cache` with row b replaced by the one-row cache `row` (continuous batching)."""
  return cache.map_kv(lambda x, _, r: jax.lax.dynamic_update_slice_in_dim(x, r, b, axis=1),
                      row).replace(lengths=cache.lengths.at[b].set(row.lengths[0]))


def _hits_stop(tokenizer, ids: list[int], stop_strings: Sequence[str]) -> bool:
  tail = tokenizer.decode(ids[-16:], skip_special_tokens=False)
  return any(s in tail for s in stop_strings)


def token_ids(prompts) -> list[list[int]]:
  """Prompts as lists of Python ints. Each prompt must be a sequence of integers (Python ints,
  or a 1-D integer NumPy/JAX array): a float (1.9 would become 1), a string ('42' would become
  [4, 2]) or a bool is refused naming the prompt and the value, never silently converted."""
  if isinstance(prompts, (str, bytes)) or not (isinstance(prompts, collections.abc.Sequence)
                                               or hasattr(prompts, "__array__")):
    raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
  out = []
  for i, p in enumerate(prompts):
    if hasattr(p, "__array__") and not isinstance(p, (list, tuple)):
      a = np.asarray(p)
      if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"prompt {i} must be a 1-D integer array of token ids, got "
                         f"{a.dtype}{list(a.shape)}")
      out.append([int(t) for t in a])
      continue
    if isinstance(p, (str, bytes)) or not isinstance(p, collections.abc.Sequence):
      raise ValueError(f"prompt {i} must be a sequence of token ids, got {p!r:.60} "
                       f"({type(p).__name__}); tokenize text first")
    for t in p:
      if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
        raise ValueError(f"prompt {i} holds {t!r} ({type(t).__name__}), not an integer "
                         f"token id")
    out.append([int(t) for t in p])
  return out


def validate_request(prompts: list[list[int]], max_new_tokens: int, sampling: SamplingParams,
                     config: LlamaLikeConfig, max_len: int | None) -> None:
  """Reject bad generation requests with errors that quote the offending value."""
  if not prompts:
    raise ValueError("no prompts given")
  if max_new_tokens <= 0:
    raise ValueError(f"max_new_tokens must be > 0, got {max_new_tokens=}")
  for i, p in enumerate(prompts):
    if not p:
      raise ValueError(f"prompt {i} is empty")
    bad = [t for t in p if not 0 <= t < config.vocab_size]
    if bad:
      raise ValueError(f"prompt {i} holds token ids outside [0, {config.vocab_size}): {bad[:5]}")
  sampling.validate_for_vocab(config.vocab_size)
  longest = max(len(p) for p in prompts)
  if max_len is not None and longest + max_new_tokens > max_len:
    raise ValueError(f"prompt of {longest} tokens + {max_new_tokens=} exceeds the cache length "
                     f"{max_len=}")
  if longest + max_new_tokens > config.max_position_embeddings:
    raise ValueError(f"prompt of {longest} tokens + {max_new_tokens=} exceeds the model's "
                     f"context {config.max_position_embeddings}")


def check_cache_fits(config: LlamaLikeConfig, B: int, S: int, method: str) -> None:
  """Refuse, before anything is compiled or allocated, a target KV cache that cannot fit: B rows
  of S slots need at least 2 (K and V) x layers x B x S x KV heads x head dim x 2 bytes (bf16:
  a lower bound whatever the dtype) against the memory free on the device (`backends`)."""
  need = 2 * config.num_layers * B * S * config.num_kv_heads * config.head_dim * 2
  free = available_memory_bytes()
  if free is not None and need > free:
    raise ValueError(f"{method}: the target's KV cache for {B} row(s) x {S:,} slots needs at "
                     f"least {need / 2**30:,.1f} GiB; {free / 2**30:,.1f} GiB are free on "
                     f"{jax.devices()[0].platform}: fewer rows, new tokens or draft tokens")


def block_request(prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  sampling: SamplingParams, config: LlamaLikeConfig, max_len: int | None,
                  extra_slots: int, method: str):
  """Validate a request for a method whose steps write up to `extra_slots` cache slots past
  `max_new_tokens`; returns (prompts as int lists, lengths [B], cache slots S, prompt block T,
  right-padded prompt tokens [B, T])."""
  prompts = token_ids(prompts)
  room = max_new_tokens + extra_slots
  validate_request(prompts, max_new_tokens, sampling, config, None)
  lengths = np.array([len(p) for p in prompts], np.int32)
  longest = int(lengths.max())
  if extra_slots > config.max_position_embeddings:
    raise ValueError(f"one {method} step writes {extra_slots} cache slots (its draft length or "
                     f"tree), more than the model's whole context of "
                     f"{config.max_position_embeddings} positions: lower gamma / the tree's "
                     f"total_tokens")
  if max_len is not None and longest + room > max_len:
    raise ValueError(f"prompt of {longest} tokens + {max_new_tokens=} + {extra_slots} slots for "
                     f"one {method} step = {longest + room} exceeds the cache length {max_len=}")
  S = cache_slots(longest, room, max_len)
  check_cache_fits(config, len(prompts), S, method)
  T = min(prompt_bucket(longest), S)
  tokens = np.zeros((len(prompts), T), np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  return prompts, lengths, S, T, tokens


def request(prompts: Sequence[Sequence[int]], *, max_new_tokens: int, sampling: SamplingParams,
            config: LlamaLikeConfig, max_len: int | None, extra_slots: int, method: str,
            mesh, seed: int, eos_token_ids=(), stop_strings=(), tokenizer=None,
            streamer=None) -> Request:
  """Validate a request (ids, lengths, cache room for one step's `extra_slots`, the mesh's data
  axis dividing the batch) and lay it out (`block_request`) for `engine.host_loop`."""
  prompts, lengths, S, T, tokens = block_request(prompts, max_new_tokens, sampling, config,
                                                 max_len, extra_slots, method)
  B = len(prompts)
  if mesh is not None and B % mesh.shape["data"]:
    raise ValueError(f"a batch of B={B} rows does not divide the mesh's data axis of "
                     f"{mesh.shape['data']} devices: pad the batch or use another mesh")
  out = OutputCollector(B, max_new_tokens, eos_token_ids, stop_strings, tokenizer, streamer)
  return Request(prompts, lengths, S, T, tokens, jax.random.key(seed), out)


def generate(params: dict, config: LlamaLikeConfig, prompts: Sequence[Sequence[int]],
             **kwargs) -> GenerationResult:
  """One-shot convenience wrapper around `Decoder(params, config).generate(...)`."""
  return Decoder(params, config).generate(prompts, **kwargs)
