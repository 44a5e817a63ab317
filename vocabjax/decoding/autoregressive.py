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

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax import sharding
from vocabjax.decoding.base import DecodingMethod, GenerationResult
from vocabjax.decoding.engine import (KEY, DecoderPrograms, ProgramKey, abstract_arg,
                                      arg_signature, check_continuous_mesh, continuous_loop,
                                      fold_in, host_loop, placed_like, prompt_bucket, request)
from vocabjax.sampling import SamplingParams, sample
from vocabjax.lowering import Lowering, decoding_lowering, lowered, step_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import compute_dtype, forward, forward_features, lm_head


def target_prefill(params, tokens, prompt_lengths, cache, key, *, config, sampling,
                   feature_layers: tuple = ()):
  """The model's prefill of a right-padded [B, T] prompt block into a fresh cache: (first [B]
  sampled from the last prompt position, the cache with each row's prompt length, last [B, D]
  that position's final normed hidden state, the features of `feature_layers` [B, T, n D] or
  None). Plain decoding's prefill and every speculative engine's target prefill, one program
  per model, sampling and shapes (`target_prefill_program`)."""
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  hidden, cache, feats = _prompt_forward(params, tokens, positions, cache, config,
                                         feature_layers, fresh=True,
                                         valid_lengths=prompt_lengths)
  cache = cache.with_lengths(prompt_lengths)
  last = jnp.take_along_axis(hidden, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]
  first = sample(key, lm_head(params, last, config=config), sampling)
  return first, cache, last, feats


def _prompt_forward(params, tokens, positions, cache, config, feature_layers, **kw):
  """(hidden, cache, the features of `feature_layers` or None) of a prompt block: `forward`, or
  `forward_features` when features are asked."""
  if feature_layers:
    return forward_features(params, tokens, positions, cache, config=config,
                            layers=feature_layers, **kw)
  return (*forward(params, tokens, positions, cache, config=config, **kw), None)


def target_prefill_more(params, tokens, prompt_lengths, cache, key, offset, last, *, config,
                        sampling, feature_layers: tuple = ()):
  """The next C-token chunk of a right-padded prompt block whose first `offset` tokens (the
  chunks before it) the cache holds: the chunk's keys and values written at slots offset..,
  attending to the cache's first `offset` slots and causally among themselves; `last` [B, D]
  replaced for the rows whose last prompt token is in this chunk; the first token sampled from
  `last` (the final chunk's is the prompt's); the cache's lengths the rows' prompt lengths, as
  `target_prefill` leaves them. (first, cache, last, this chunk's features or None)."""
  B, C = tokens.shape
  cache = cache.with_lengths(jnp.full((B,), offset, jnp.int32))
  positions = offset + jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), (B, C))
  hidden, cache, feats = _prompt_forward(params, tokens, positions, cache, config,
                                         feature_layers)
  cache = cache.with_lengths(prompt_lengths)
  idx = prompt_lengths - 1 - offset
  here = jnp.take_along_axis(hidden, jnp.clip(idx, 0, C - 1)[:, None, None], axis=1)[:, 0]
  last = jnp.where(((idx >= 0) & (idx < C))[:, None], here.astype(last.dtype), last)
  first = sample(key, lm_head(params, last, config=config), sampling)
  return first, cache, last, feats


# Prompt blocks longer than this prefill in chunks of this many tokens (`chunks_prompt`): the
# programs a model compiles stay few whatever the prompts' lengths (a long-context suite's
# blocks of 1K-32K tokens: one program per 128-token bucket otherwise), and so do a prefill's
# temporary buffers. Chunks cost prefill time on the CPU (each one widens the quantized matrices
# again; AVX-512 EPYC, the 1.5B Q4_K_M target): 709 tokens in 128-token chunks 16.5 s against
# 11.3 s in one block; 2,000 tokens in two chunks of 1,024 34.4 s against 30.5 s.
PROMPT_CHUNK = 2048


def chunks_prompt(T: int, config: LlamaLikeConfig, S: int, mesh) -> bool:
  """Whether a [B, T] prompt block into S slots prefills in chunks (`chunked_prefill`) instead
  of as one block with a program of its own T: T above `PROMPT_CHUNK`, one device, a linear
  cache (a sliding layers' ring takes its prompt in one block; its shapes traced only when the
  rest holds)."""
  return (T > PROMPT_CHUNK and mesh is None
          and jax.eval_shape(lambda: KVCache.init(config, 1, S)).ring is None)


def chunk_sizes(T: int, C: int | None = None) -> list[int]:
  """The chunks of a T-token block: C (`PROMPT_CHUNK`) tokens each, the last one the rest."""
  C = C or PROMPT_CHUNK
  return [min(C, T - o) for o in range(0, T, C)]


def chunked_prefill(first_chunk, more: Callable[[int], Any], C: int):
  """`target_prefill`'s call (params, tokens [B, T], lengths, cache, key) -> (first, cache,
  last, features [B, T, n D] or None) run as the first C tokens' `target_prefill` program and a
  `target_prefill_more` program (`more(chunk size)`) for each next chunk."""
  def run(params, tokens, prompt_lengths, cache, key):
    tokens = jnp.asarray(tokens)
    first, cache, last, feats = first_chunk(params, tokens[:, :C], prompt_lengths, cache, key)
    parts, offset = [feats], C
    for size in chunk_sizes(tokens.shape[1], C)[1:]:
      first, cache, last, f = more(size)(params, tokens[:, offset:offset + size],
                                         prompt_lengths, cache, key, jnp.int32(offset), last)
      parts.append(f)
      offset += size
    return first, cache, last, None if feats is None else jnp.concatenate(parts, axis=1)
  return run


def _prefill(params, tokens, prompt_lengths, cache, key, *, config, sampling):
  first, cache, _, _ = target_prefill(params, tokens, prompt_lengths, cache, key,
                                      config=config, sampling=sampling)
  return first, cache


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


def target_prefill_outputs(params, config: LlamaLikeConfig, sampling: SamplingParams, B: int,
                           T: int, S: int, dtype, *, mesh=None, feature_layers: tuple = ()):
  """`target_prefill`'s outputs (first, cache, last, features) for a [B, T] block into S slots,
  abstract and placed as its program gives them and the programs after it take them: on a
  mesh the cache as the decoders place caches, every other leaf with its rows over "data" (the
  first tokens as plain decoding's step takes its tokens); off a mesh on the params' device."""
  i32 = lambda *shape: abstract_arg(shape, jnp.int32, B=B, mesh=mesh, like=params)  # noqa: E731
  key = abstract_arg(KEY.shape, KEY.dtype, B=B, mesh=mesh, like=params, rows=False)
  cache = abstract_cache(config, B, S, dtype, mesh)
  if mesh is None:
    cache = placed_like(cache, params)
  first, _, last, feats = jax.eval_shape(
      functools.partial(target_prefill, config=config, sampling=sampling,
                        feature_layers=tuple(feature_layers)),
      params, i32(B, T), i32(B), cache, key)
  place = lambda x: abstract_arg(x.shape, x.dtype, B=B, mesh=mesh, like=params)  # noqa: E731
  return place(first), cache, place(last), None if feats is None else place(feats)


def lower_target_prefill(params, config: LlamaLikeConfig, sampling: SamplingParams, B: int,
                         T: int, S: int, dtype, *, lowering: Lowering, mesh=None,
                         feature_layers: tuple = ()):
  """`target_prefill` LOWERED for a [B, T] prompt block into S slots (the cache argument
  donated), with `lowering` (bf16 weights prefill with the bf16 GEMM, `prefill_in_bf16`); on
  a mesh its outputs placed as `target_prefill_outputs` says."""
  i32 = lambda *shape: abstract_arg(shape, jnp.int32, B=B, mesh=mesh, like=params)  # noqa: E731
  key = abstract_arg(KEY.shape, KEY.dtype, B=B, mesh=mesh, like=params, rows=False)
  jit_kw = {}
  if mesh is None:
    cache = placed_like(abstract_cache(config, B, S, dtype), params)
  else:  # the outputs placed as the programs after it take them
    outs = target_prefill_outputs(params, config, sampling, B, T, S, dtype, mesh=mesh,
                                  feature_layers=feature_layers)
    cache, jit_kw["out_shardings"] = outs[1], jax.tree.map(lambda x: x.sharding, outs)
  fn = lowered(functools.partial(target_prefill, config=config, sampling=sampling,
                                 feature_layers=tuple(feature_layers)),
               lowering.replace(bf16_blocks=prefill_in_bf16(params)))
  return jax.jit(fn, donate_argnums=(3,), **jit_kw).lower(params, i32(B, T), i32(B), cache,
                                                          key)


def target_prefill_program(programs: DecoderPrograms, params, config: LlamaLikeConfig,
                           sampling: SamplingParams, B: int, T: int, S: int, dtype, *,
                           lowering: Lowering, mesh=None, feature_layers: tuple = ()):
  """(compiled `target_prefill` (`lower_target_prefill`), compile seconds: 0 when built
  before); for a block longer than `PROMPT_CHUNK` (`chunks_prompt`) the same call run in
  chunks (`chunked_prefill`: the first chunk's program and `target_prefill_more`'s). One
  program per model (its config, mesh and params' signature), features, sampling,
  shapes and lowering, whichever decoder asks: plain decoding and every speculative engine
  over the same target share it (the process's `engine.PROGRAMS`)."""
  name = jnp.dtype(dtype).name
  method = ("target", config, tuple(feature_layers))
  prefill_lowering = lowering.replace(bf16_blocks=prefill_in_bf16(params))
  scope = lambda: ("target", mesh, arg_signature(params))  # noqa: E731
  chunked = chunks_prompt(T, config, S, mesh)
  T0 = PROMPT_CHUNK if chunked else T
  first, s1 = programs.get(
      ProgramKey("target_prefill", method, sampling, (B, T0, S, name), prefill_lowering),
      lambda: lower_target_prefill(params, config, sampling, B, T0, S, dtype,
                                   lowering=lowering, mesh=mesh,
                                   feature_layers=feature_layers).compile(),
      scope=scope)
  if not chunked:
    return first, s1
  more, seconds = {}, s1
  for C in sorted(set(chunk_sizes(T)[1:])):
    more[C], s = programs.get(
        ProgramKey("target_prefill_more", method, sampling, (B, C, S, name), prefill_lowering),
        lambda C=C: lower_target_prefill_more(params, config, sampling, B, C, S, dtype,
                                              lowering=lowering,
                                              feature_layers=feature_layers).compile(),
        scope=scope)
    seconds += s
  return chunked_prefill(first, more.__getitem__, T0), seconds


def lower_target_prefill_more(params, config: LlamaLikeConfig, sampling: SamplingParams, B: int,
                              C: int, S: int, dtype, *, lowering: Lowering,
                              feature_layers: tuple = ()):
  """`target_prefill_more` LOWERED for [B, C] chunks into S slots on one device (the cache
  argument donated), with `target_prefill`'s lowering."""
  i32 = lambda *shape: abstract_arg(shape, jnp.int32, B=B, mesh=None, like=params)  # noqa: E731
  key = abstract_arg(KEY.shape, KEY.dtype, B=B, mesh=None, like=params, rows=False)
  offset = abstract_arg((), jnp.int32, B=B, mesh=None, like=params, rows=False)
  cache = placed_like(abstract_cache(config, B, S, dtype), params)
  _, _, last, _ = target_prefill_outputs(params, config, sampling, B, C, S, dtype,
                                         feature_layers=feature_layers)
  fn = lowered(functools.partial(target_prefill_more, config=config, sampling=sampling,
                                 feature_layers=tuple(feature_layers)),
               lowering.replace(bf16_blocks=prefill_in_bf16(params)))
  return jax.jit(fn, donate_argnums=(3,)).lower(params, i32(B, C), i32(B), cache, key, offset,
                                                last)


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
    self._programs = DecoderPrograms(  # shared with the process's decoders of this model
        scope=lambda: (type(self), self.mesh, arg_signature(self.params)),
        shared=("prefill", "step"))

  def _new_cache(self, B: int, S: int, dtype) -> KVCache:
    return self._placed(KVCache.init(self.config, B, S, dtype))

  def _placed(self, cache: KVCache) -> KVCache:
    """`cache` as the programs take it (on a mesh: its sharding; nothing moves when it has it)."""
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
    if "prefill" in programs:  # the model's prefill, which speculative engines share
      out["prefill"] = lower_target_prefill(self.params, self.config, sampling, B, T, S, dtype,
                                            lowering=self.lowering, mesh=self.mesh)
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
    """(the compiled prefill of a [B, T] prompt block into an S-slot cache: `prefill(params,
    tokens, lengths, cache, key) -> (first, cache, last hidden, None)`, compile seconds), the
    model's `target_prefill_program` (shared with speculative engines over it)."""
    return target_prefill_program(self._programs, self.params, self.config, sampling, B, T, S,
                                  cache_dtype, lowering=self.lowering, mesh=self.mesh)

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
    req = request(prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                  config=self.config, max_len=max_len, extra_slots=0, method=self.method,
                  mesh=self.mesh, seed=seed, eos_token_ids=eos_token_ids,
                  stop_strings=stop_strings, tokenizer=tokenizer, streamer=streamer,
                  rows_over_data=False)
    B, S, T, tokens, lengths = req.B, req.S, req.T, req.tokens, req.lengths
    cache_dtype = cache_dtype or compute_dtype(self.params)
    prefill, step, compile_s = self.programs(sampling, B, T, S, cache_dtype)

    def start():
      new, cache, _, _ = prefill(self.params, jnp.asarray(tokens), jnp.asarray(lengths),
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
    Sampling draws other random numbers than `generate` (per prompt and step). One device or
    a model-parallel mesh (its data axis 1)."""
    check_continuous_mesh(self.mesh)
    req = request(prompts, max_new_tokens=max_new_tokens, sampling=sampling,
                  config=self.config, max_len=max_len, extra_slots=0, method=self.method,
                  mesh=self.mesh, seed=seed, eos_token_ids=eos_token_ids,
                  stop_strings=stop_strings, tokenizer=tokenizer, rows_over_data=False,
                  rows=rows)
    B, S = min(rows, req.B), req.S
    cache_dtype = cache_dtype or compute_dtype(self.params)
    step, compile_s = self.step_program(sampling, B, S, cache_dtype)

    def fill(carry, b, i, key):
      new, cache = carry
      if i is None:  # the row idles from slot 0 (never past S)
        return (new, self._placed(cache.replace(lengths=cache.lengths.at[b].set(0)))), None, 0.0
      n = len(req.prompts[i])
      T = min(prompt_bucket(n), S)
      prefill, compiled = self.prefill_program(sampling, 1, T, S, cache_dtype)
      tok, row, _, _ = prefill(self.params, jnp.asarray(req.tokens[i:i + 1, :T]),
                               jnp.asarray([n], jnp.int32), self._new_cache(1, S, cache_dtype),
                               key)
      tok = int(np.asarray(tok)[0])
      new[b] = tok
      return (new, self._placed(put_cache_row(cache, row, b))), tok, compiled

    def advance(carry, i, key, active):
      new, cache = carry
      emitted, cache = step(self.params, jnp.asarray(new), cache, key)
      new = np.array(emitted, np.int32)
      return (new, cache), new, 0.0

    carry = (np.zeros(B, np.int32), self._new_cache(B, S, cache_dtype))
    return continuous_loop(req, rows, carry, fill, advance, compile_s=compile_s)


@functools.partial(jax.jit, donate_argnums=(0,))
def put_cache_row(cache: KVCache, row: KVCache, b) -> KVCache:
  """`cache` with row b replaced by the one-row cache `row` (continuous batching)."""
  return cache.map_kv(lambda x, _, r: jax.lax.dynamic_update_slice_in_dim(x, r, b, axis=1),
                      row).replace(lengths=cache.lengths.at[b].set(row.lengths[0]))


def generate(params: dict, config: LlamaLikeConfig, prompts: Sequence[Sequence[int]],
             **kwargs) -> GenerationResult:
  """One-shot convenience wrapper around `Decoder(params, config).generate(...)`."""
  return Decoder(params, config).generate(prompts, **kwargs)
