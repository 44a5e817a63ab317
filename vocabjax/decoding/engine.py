"""The host side every decoder shares: one request check and layout (`request`: prompts as
ids, the cache room one step needs, the mesh's data axis, the rows' `OutputCollector`), one
program cache (`ProgramCache`, the process's `PROGRAMS`, keyed by `ProgramKey` and what a
decoder's programs close over), one host loop.

A decoder supplies only what is its own:

    programs   built once per key through `PROGRAMS` (compile seconds counted)
    start      its prefills: the first token of every row and the loop's carry
    advance    one step: host inputs from the carry (a trie, a translation), the compiled
               step, the step's counts recorded; returns (carry, emitted [B, W] with -1 after
               each row's tokens, seconds spent compiling a program first met inside the loop)

and `host_loop` drives it: rows stop at EOS, a stop string or `max_new_tokens`
(`OutputCollector`), a non-finite flag raises, and the result's times keep compilation out of
prefill and decode. Every decoder runs through it: plain decoding, chain / tree / EAGLE /
Medusa, prompt lookup, EAGLE + lookup, SuffixDecoding and the cross-vocabulary drafter (every
speculative method is a proposer on `speculative.SpeculativeEngine`).
"""

from __future__ import annotations

import collections
import collections.abc
import functools
import os
import threading
import time
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import jax
import numpy as np

from vocabjax.backends import available_memory_bytes, trim_heap
from vocabjax.decoding.base import GenerationResult
from vocabjax.jax_internals import trace_settings
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.sampling import NONFINITE, SamplingParams


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


def arg_signature(tree) -> tuple:
  """What a compiled program needs of a pytree argument to take it in place of another: the
  tree's structure and, per leaf, its shape, dtype and sharding (weak type included; a leaf
  that is no array by its type and value)."""
  leaves, treedef = jax.tree.flatten(tree)

  def one(x):
    if isinstance(x, jax.Array):
      return (x.shape, x.dtype.name, x.sharding, x.weak_type)
    if isinstance(x, (np.ndarray, np.generic)):
      return (x.shape, x.dtype.name)
    return (type(x).__name__, repr(x))

  return treedef, tuple(one(x) for x in leaves)


class SharedProgramMismatch(RuntimeError):
  """`ProgramCache.check`: a shared program is not the program its decoder builds."""


class ProgramCache:
  """The process's compiled programs, each built once per key: the one program cache.

  A decoder asks for a program by its `ProgramKey` (program name, the method's static
  identity, sampling, shapes, lowering) and its `scope`: what its programs close over besides
  the key (its class, its proposer's class, the model configs, the mesh, the signature of every
  params argument: tree, shapes, dtypes, shardings; `arg_signature`). With JAX's trace settings
  (`jax_internals.trace_settings`) these make the entry's key, so a decoder built again for the
  same models, method and shapes (a notebook cell re-run, an eval suite's second decoder of a
  pair, a test's) takes the programs the first one compiled instead of tracing, lowering and
  compiling them again; the params are arguments, never part of a program. A scope that is a
  fresh `object()` keeps a decoder's programs its own.

  At most `max_programs`, the least recently used dropped first; `clear()` empties it (as
  `jax.clear_caches()` does JAX's: after patching code that programs trace), `enabled = False`
  builds everything afresh. `check = True` (or `VOCABJAX_CHECK_SHARED_PROGRAMS=1`) builds
  every program anyway and raises `SharedProgramMismatch` if its compiled text differs from the
  cached one's: a proposer whose `key()` misses something its programs read shows up there."""

  def __init__(self, max_programs: int = 512):
    self.max_programs = max_programs
    # builds at least this long hand the C heap back after them (`trim_heap`: a real model's
    # compile frees hundreds of MB that glibc keeps); a quicker one (a tiny program, one from
    # JAX's persistent cache) frees little, and the collection's ~0.3 s or more would dominate
    # (the test suite's 1,200 tests took 3x as long with a trim after every build)
    self.trim_after_s = 1.0
    self.enabled = True
    self.check = os.environ.get("VOCABJAX_CHECK_SHARED_PROGRAMS", "") not in ("", "0")
    self.hits = 0  # programs taken from the cache (a decoder that built nothing)
    self._table: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._table)

  def clear(self) -> None:
    with self._lock:
      self._table.clear()

  def get(self, key: ProgramKey, scope: Hashable, build: Callable[[], Any]) -> tuple[Any, float]:
    """(the program for `key` in `scope`, seconds spent building it now: 0 when it was built
    before, by this decoder or another)."""
    if not isinstance(key, ProgramKey):
      raise TypeError(f"program keys are ProgramKey(program, method, sampling, shapes, "
                      f"lowering), got {key!r}")
    full = (key, scope, trace_settings())
    prog = self._lookup(full) if self.enabled else None
    if prog is not None:
      if self.check and hasattr(prog, "as_text"):
        fresh = build()
        if fresh.as_text() != prog.as_text():
          raise SharedProgramMismatch(
              f"the shared program {key.program!r} of {str(key.method)[:160]} is not the "
              f"one this decoder builds: something its programs read is not in its key (a "
              f"proposer's key() misses a setting, or code was patched without "
              f"`PROGRAMS.clear()`)")
      return prog, 0.0
    t0 = time.perf_counter()
    prog = build()
    if time.perf_counter() - t0 >= self.trim_after_s:
      trim_heap()  # what the compile freed, back to the system (resident memory)
    seconds = time.perf_counter() - t0
    if self.enabled:
      self._store(full, prog)
    return prog, seconds

  def _lookup(self, full: Hashable):
    with self._lock:
      prog = self._table.get(full)
      if prog is not None:
        self._table.move_to_end(full)
        self.hits += 1
      return prog

  def _store(self, full: Hashable, prog) -> None:
    with self._lock:
      self._table[full] = prog
      self._table.move_to_end(full)
      while len(self._table) > self.max_programs:
        self._table.popitem(last=False)


PROGRAMS = ProgramCache()  # the process's


class DecoderPrograms:
  """One decoder's view of `PROGRAMS`: the programs it has used, by key (its fast path: a
  host loop asks for a step program every step), and its scope. `shared`: the program names
  other decoders of the same scope may take; the rest are keyed to this decoder alone."""

  def __init__(self, scope: Callable[[], Hashable], shared: tuple = ()):
    self._used: dict = {}
    self._scope, self._shared = scope, frozenset(shared)
    self._own = object()  # the scope of its unshared programs

  def get(self, key: ProgramKey, build: Callable[[], Any],
          scope: Callable[[], Hashable] | None = None) -> tuple[Any, float]:
    """(the program for `key`, seconds spent building it now). `scope`: the scope of a program
    other kinds of decoders share too (a model's prefill: `autoregressive.target_prefill`),
    instead of this decoder's."""
    prog = self._used.get(key)
    if prog is not None:
      return prog, 0.0
    if scope is not None:
      scope = scope()
    else:
      scope = self._scope() if key.program in self._shared else self._own
    prog, seconds = PROGRAMS.get(key, scope, build)
    self._used[key] = prog
    return prog, seconds

  def items(self):
    """(key, program) pairs this decoder has used."""
    return self._used.items()


class Request(NamedTuple):
  """A validated generate request, laid out as the prefill reads it."""

  prompts: list  # int lists
  lengths: np.ndarray  # [B]
  S: int  # cache slots
  T: int  # prompt block
  tokens: np.ndarray  # [B, T] right-padded
  key: jax.Array
  out: "OutputCollector"  # the rows' output (`request` builds it)

  @property
  def B(self) -> int:
    return len(self.prompts)


# --- requests: checks, layout, the rows' output ------------------------------------------

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
    self.row0 = 0  # the first row's index in the caller's request (a batch of it): for errors

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
        raise nonfinite_error(self.row0 + b, len(row), step)
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
      if not is_integer(t):
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
  if not isinstance(sampling, SamplingParams):
    raise ValueError(f"sampling must be a SamplingParams (SamplingParams() is greedy), got "
                     f"{sampling!r} ({type(sampling).__name__})")
  sampling.validate_for_vocab(config.vocab_size)
  longest = max(len(p) for p in prompts)
  if max_len is not None and longest + max_new_tokens > max_len:
    raise ValueError(f"prompt of {longest} tokens + {max_new_tokens=} exceeds the cache length "
                     f"{max_len=}")
  if longest + max_new_tokens > config.max_position_embeddings:
    raise ValueError(f"prompt of {longest} tokens + {max_new_tokens=} exceeds the model's "
                     f"context {config.max_position_embeddings}")


def is_integer(value) -> bool:
  """An int or a numpy integer, not a bool (True would count as 1)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_integer(name: str, value) -> None:
  """An integer argument: bools, floats and strings refused by name (2.5 new tokens, True)."""
  if not is_integer(value):
    raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")


def eos_ids(eos_token_ids, vocab_size: int) -> tuple[int, ...]:
  """The stop ids of a request: an int or a sequence of ints, each inside the vocabulary. A
  string is refused (read as a sequence, "28" would be the ids 2 and 8)."""
  if is_integer(eos_token_ids):
    eos_token_ids = (eos_token_ids,)
  if (isinstance(eos_token_ids, (str, bytes))
      or not isinstance(eos_token_ids, collections.abc.Iterable)):
    raise ValueError(f"eos_token_ids must be an int or a sequence of ints, got "
                     f"{eos_token_ids!r:.60} ({type(eos_token_ids).__name__})")
  ids = tuple(eos_token_ids)
  for t in ids:
    if not is_integer(t):
      raise ValueError(f"eos_token_ids holds {t!r} ({type(t).__name__}), not an integer id")
  bad = [int(t) for t in ids if not 0 <= t < vocab_size]
  if bad:
    raise ValueError(f"eos_token_ids holds ids outside the vocabulary [0, {vocab_size}): "
                     f"{bad[:5]}")
  return tuple(int(t) for t in ids)


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
                  extra_slots: int, method: str, rows: int | None = None):
  """Validate a request for a method whose steps write up to `extra_slots` cache slots past
  `max_new_tokens`; returns (prompts as int lists, lengths [B], cache slots S, prompt block T,
  right-padded prompt tokens [B, T]). `rows`: the cache rows that decode them (continuous
  batching; default one per prompt), what the memory check counts."""
  prompts = token_ids(prompts)
  room = max_new_tokens + extra_slots
  # plain decoding (no extra slots): its own message for a cache that is too short
  validate_request(prompts, max_new_tokens, sampling, config, None if extra_slots else max_len)
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
  check_cache_fits(config, min(rows or len(prompts), len(prompts)), S, method)
  T = min(prompt_bucket(longest), S)
  tokens = np.zeros((len(prompts), T), np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  return prompts, lengths, S, T, tokens


def request(prompts: Sequence[Sequence[int]], *, max_new_tokens: int, sampling: SamplingParams,
            config: LlamaLikeConfig, max_len: int | None, extra_slots: int, method: str,
            mesh, seed: int, eos_token_ids=(), stop_strings=(), tokenizer=None,
            streamer=None, rows_over_data: bool = True, rows: int | None = None) -> Request:
  """Validate a request (ids, lengths, cache room for one step's `extra_slots`, the device's
  memory, on a mesh its data axis dividing the batch unless `rows_over_data` is False: plain
  decoding places an odd batch replicated) and lay it out (`block_request`) for `host_loop`:
  the one request path of every decoder. `rows`: continuous batching's cache rows
  (`continuous_loop`; the collector keeps one row per prompt all the same)."""
  if rows is not None and rows < 1:
    raise ValueError(f"rows={rows} must be >= 1")
  check_integer("max_new_tokens", max_new_tokens)
  check_integer("seed", seed)
  if not 0 <= seed < 2 ** 32:  # jax.random.key takes 32 bits: 2**32 would be seed 0
    raise ValueError(f"seed must lie in [0, 2**32), got {seed=}")
  eos_token_ids = eos_ids(eos_token_ids, config.vocab_size)
  prompts, lengths, S, T, tokens = block_request(prompts, max_new_tokens, sampling, config,
                                                 max_len, extra_slots, method, rows)
  B = len(prompts)
  if rows_over_data and mesh is not None and B % mesh.shape["data"]:
    raise ValueError(f"a batch of B={B} rows does not divide the mesh's data axis of "
                     f"{mesh.shape['data']} devices: pad the batch or use another mesh")
  out = OutputCollector(B, max_new_tokens, eos_token_ids, stop_strings, tokenizer, streamer)
  return Request(prompts, lengths, S, T, tokens, jax.random.key(seed), out)


Advance = Callable[[Any, int, jax.Array, np.ndarray], tuple[Any, np.ndarray, float]]

# jax.monitoring's duration events of a compilation: tracing, lowering, the backend's compile
COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                            "/jax/core/compile/jaxpr_to_mlir_module_duration",
                            "/jax/core/compile/backend_compile_duration"})
_CLOCKS = threading.local()  # this thread's running compile clocks
_LISTENING = []  # the listener, once registered


class CompileClock:
  """Seconds this thread spends compiling (`COMPILE_EVENTS`) while the clock runs: a timed
  region subtracts them, so no compilation lands in `prefill_s` or `decode_s` (the programs
  the decoders build through `ProgramCache` are timed there already; this also catches what
  JAX compiles on first use inside a region: a jitted helper, a new prompt block's shapes)."""

  def __init__(self):
    self.seconds = 0.0

  def __enter__(self) -> "CompileClock":
    if not _LISTENING:
      jax.monitoring.register_event_duration_secs_listener(_on_duration)
      _LISTENING.append(_on_duration)
    _CLOCKS.__dict__.setdefault("running", []).append(self)
    return self

  def __exit__(self, *exc) -> None:
    _CLOCKS.running.remove(self)


def _on_duration(event: str, seconds: float, **_) -> None:
  if event in COMPILE_EVENTS:
    for clock in getattr(_CLOCKS, "running", ()):
      clock.seconds += seconds


def host_loop(req: Request, start: Callable[[], tuple[np.ndarray, Any]], advance: Advance, *,
              compile_s: float, stats=None) -> GenerationResult:
  """Run `start()` (the prefills: (first tokens [B], carry)), then `advance(carry, i, key_i,
  active rows)` until every row is done; the result's `compile_s` adds what compiled inside the
  loop, and `decode_s` leaves it out."""
  out = req.out
  out.begin(req.prompts)  # a streamer's prompt
  t0 = time.perf_counter()
  with CompileClock() as early:  # what compiles on first use is not prefill
    first, carry = start()
    jax.block_until_ready(carry)  # every prefill (a drafter's would else spill into decode_s)
    out.add(np.asarray(first))
  t1 = time.perf_counter()
  steps, late = 0, 0.0
  while not out.done.all():
    steps += 1
    with CompileClock() as clock:
      carry, emitted, compiled = advance(carry, steps, fold_in(req.key, steps),
                                         ~out.done)
    late += max(compiled, clock.seconds)  # (a program the cache built: both saw it)
    out.add(np.asarray(emitted))
  t2 = time.perf_counter()
  out.finish()
  return GenerationResult(tokens=out.tokens, finish_reasons=out.reasons,
                          prompt_lengths=req.lengths.tolist(),
                          compile_s=compile_s + early.seconds + late,
                          prefill_s=t1 - t0 - early.seconds, decode_s=t2 - t1 - late,
                          steps=steps, stats=stats)


def check_continuous_mesh(mesh) -> None:
  """Continuous batching prefills one prompt at a time: one device or a model-parallel mesh
  (data axis 1); a mesh with a data axis is refused, saying why."""
  if mesh is not None and mesh.shape["data"] != 1:
    raise ValueError(f"continuous batching prefills one prompt at a time: it runs on one "
                     f"device or a mesh without a data axis (model-parallel), not one of "
                     f"data={mesh.shape['data']}; use generate()")


Fill = Callable[[Any, int, "int | None", jax.Array], tuple[Any, "int | None", float]]


def continuous_loop(req: Request, rows: int, carry, fill: Fill, advance: Advance, *,
                    compile_s: float, stats=None) -> GenerationResult:
  """Continuous batching, for every decoder: `rows` cache rows decode the request's prompts
  (its collector holds one row per prompt, outputs in prompt order), and a row whose prompt is
  done takes the next one, so answers of different lengths keep every row busy.

  `carry` holds `rows` rows (none of them a prompt's yet). `fill(carry, b, i, key) -> (carry,
  first token, compile seconds)` prefills prompt i alone into row b, replacing the row's state
  (the prompt before it, if any, is done); `fill(carry, b, None, None) -> (carry, None, 0.0)`
  parks row b, no prompt being left for it. `advance` is `host_loop`'s step over the rows
  (`active`: the rows holding a prompt; an idle row's tokens are ignored). Keys: prompt i's
  prefill folds i into the request key's first split, step s's step folds s into its second.
  `prefill_s` counts the prompts' prefills (one at a time), `decode_s` the steps, neither the
  seconds compiling programs first met."""
  out, N = req.out, len(req.prompts)
  R = min(rows, N)
  key_prefill, key_step = split(req.key)
  occupant = np.full(R, -1)  # the prompt each row decodes (-1: idle)
  pending = iter(range(N))
  spent = {"prefill": 0.0, "compile": 0.0}
  by_prompt = stats is not None and hasattr(stats, "prompt_rows")  # who each row decodes
  if by_prompt:
    stats.num_prompts = N

  def take(carry, b: int):
    """Give row b the next prompt that its first token does not finish."""
    for i in pending:
      t = time.perf_counter()
      with CompileClock() as clock:
        carry, first, compiled = fill(carry, b, i, fold_in(key_prefill, i))
        out.add_row(i, [int(first)], step=0)
      compiled = max(compiled, clock.seconds)
      spent["prefill"] += time.perf_counter() - t - compiled
      spent["compile"] += compiled
      if not out.done[i]:
        occupant[b] = i
        return carry
    occupant[b] = -1
    carry, _, _ = fill(carry, b, None, None)
    return carry

  t0 = time.perf_counter()
  for b in range(R):
    carry = take(carry, b)
  steps = 0
  while (occupant >= 0).any():
    steps += 1
    active = occupant >= 0
    with CompileClock() as clock:
      carry, emitted, compiled = advance(carry, steps, fold_in(key_step, steps), active)
    spent["compile"] += max(compiled, clock.seconds)
    if by_prompt:
      stats.prompt_rows.append(occupant.tolist())
    emitted = np.asarray(emitted).reshape(R, -1)
    for b in np.flatnonzero(active):
      i = int(occupant[b])
      out.add_row(i, emitted[b], step=steps)
      if out.done[i]:
        carry = take(carry, b)
  total = time.perf_counter() - t0
  out.finish()
  return GenerationResult(tokens=out.tokens, finish_reasons=out.reasons,
                          prompt_lengths=req.lengths.tolist(),
                          compile_s=compile_s + spent["compile"], prefill_s=spent["prefill"],
                          decode_s=total - spent["prefill"] - spent["compile"], steps=steps,
                          stats=stats)


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
