"""The host side every decoder shares: one request check, one program cache, one host loop.

A decoder supplies only what is its own:

    programs   built once per key through a `ProgramCache` (compile seconds counted)
    start      its prefills: the first token of every row and the loop's carry
    advance    one step: host inputs from the carry (a trie, a translation), the compiled
               step, the step's counts recorded; returns (carry, emitted [B, W] with -1 after
               each row's tokens, seconds spent compiling a program first met inside the loop)

and `host_loop` drives it: rows stop at EOS, a stop string or `max_new_tokens`
(`OutputCollector`), a non-finite flag raises, and the result's times keep compilation out of
prefill and decode. Every decoder runs through it: plain decoding, chain / tree / EAGLE /
Medusa (`SpeculativeDecoder`), prompt lookup, EAGLE + lookup, and the cross-vocabulary decoder
(one `host_loop` per batch of rows, its translation and n-gram cache in `advance`).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Hashable, NamedTuple

import jax
import numpy as np

from vocabjax.decoding.base import GenerationResult


@jax.jit
def _fold_in(key, data):
  return jax.random.fold_in(key, data)


@functools.partial(jax.jit, static_argnums=1)
def _split(key, num):
  return jax.random.split(key, num)


def fold_in(key: jax.Array, data: int) -> jax.Array:
  """`jax.random.fold_in(key, data)` (the same key) as one compiled call: the host loops derive
  a key per step and per row, and eagerly that is a dozen dispatched ops (~0.1 ms) each time."""
  return _fold_in(key, np.uint32(data))


def split(key: jax.Array, num: int = 2) -> jax.Array:
  """`jax.random.split(key, num)` (the same keys) as one compiled call (see `fold_in`)."""
  return _split(key, num)


class ProgramKey(NamedTuple):
  """What a compiled program is built for: the one key scheme of every decoder's programs."""

  program: str  # which program: "prefill", "step", "draft", "verify", ...
  method: Hashable  # the method's static identity (a proposer's `key()`, a decoder's settings)
  sampling: Any  # SamplingParams
  shapes: tuple  # batch rows, cache slots, prompt block, dtype name, host block shapes, ...
  lowering: Any  # the `Lowering` the program is compiled with


class ProgramCache:
  """A decoder's compiled programs, each built once per `ProgramKey`: a program compiled for
  one lowering is never reused for another (changing a decoder's `lowering` builds anew)."""

  def __init__(self):
    self._built: dict = {}

  def get(self, key: ProgramKey, build: Callable[[], Any]) -> tuple[Any, float]:
    """(the program for `key`, seconds spent building it now: 0 when it was built before)."""
    if not isinstance(key, ProgramKey):
      raise TypeError(f"program keys are ProgramKey(program, method, sampling, shapes, "
                      f"lowering), got {key!r}")
    if key in self._built:
      return self._built[key], 0.0
    t0 = time.perf_counter()
    self._built[key] = build()
    return self._built[key], time.perf_counter() - t0

  def items(self):
    """(key, program) pairs built so far (e.g. to inspect every compiled program)."""
    return self._built.items()


class Request(NamedTuple):
  """A validated generate request, laid out as the prefill reads it."""

  prompts: list  # int lists
  lengths: np.ndarray  # [B]
  S: int  # cache slots
  T: int  # prompt block
  tokens: np.ndarray  # [B, T] right-padded
  key: jax.Array
  out: Any  # the rows' OutputCollector (`autoregressive.request` builds one)

  @property
  def B(self) -> int:
    return len(self.prompts)


Advance = Callable[[Any, int, jax.Array, np.ndarray], tuple[Any, np.ndarray, float]]


def host_loop(req: Request, start: Callable[[], tuple[np.ndarray, Any]], advance: Advance, *,
              compile_s: float, stats=None) -> GenerationResult:
  """Run `start()` (the prefills: (first tokens [B], carry)), then `advance(carry, i, key_i,
  active rows)` until every row is done; the result's `compile_s` adds what compiled inside the
  loop, and `decode_s` leaves it out."""
  out = req.out
  out.begin(req.prompts)  # a streamer's prompt
  t0 = time.perf_counter()
  first, carry = start()
  jax.block_until_ready(carry)  # every prefill (a drafter's would else spill into decode_s)
  out.add(np.asarray(first))
  t1 = time.perf_counter()
  steps, late = 0, 0.0
  while not out.done.all():
    steps += 1
    carry, emitted, compiled = advance(carry, steps, fold_in(req.key, steps),
                                       ~out.done)
    late += compiled
    out.add(np.asarray(emitted))
  t2 = time.perf_counter()
  out.finish()
  return GenerationResult(tokens=out.tokens, finish_reasons=out.reasons,
                          prompt_lengths=req.lengths.tolist(), compile_s=compile_s + late,
                          prefill_s=t1 - t0, decode_s=t2 - t1 - late, steps=steps, stats=stats)


KEY = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype)  # a PRNG key


def device_of(params):
  """The one device `params` are on (a SingleDeviceSharding), or None (JAX's default: arrays
  not yet placed)."""
  leaves = jax.tree.leaves(params)
  sh = getattr(leaves[0], "sharding", None) if leaves else None
  return sh if isinstance(sh, jax.sharding.SingleDeviceSharding) else None


def abstract_arg(shape, dtype, *, B: int, mesh=None, like=None, rows: bool = True):
  """An abstract program argument placed as the decoders place their inputs: on a mesh its rows
  over "data" (where its leading axis is the batch and divides it; `rows=False`: replicated),
  else on the device of the params `like` (a deviceless TPU or GPU build's chip too)."""
  if mesh is None:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=device_of(like))
  split = rows and len(shape) >= 1 and shape[0] == B and B % mesh.shape["data"] == 0
  spec = jax.sharding.PartitionSpec("data") if split else jax.sharding.PartitionSpec()
  return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(mesh, spec))


def placed_like(tree, like):
  """`tree`'s abstract leaves placed on the device of `like` (off a mesh)."""
  one = device_of(like)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), tree)
