"""Engine programs timed on random weights of real shapes (timing does not depend on the
values), on whatever backend JAX runs.

Three kinds of program, each compiled ahead of time and timed as the median of `repeats`
calls after a warm-up:
  target        the target's forward over T new tokens per row plus its full LM head, after
                `context` cached tokens, the cache donated: T = 1 is the plain decoding step,
                T = gamma + 1 a chain's verification, T = nodes + 1 a tree's
  drafter_body  the drafter's forward over T tokens (hidden states only)
  drafter_head  the drafter's LM head over `rows` hidden rows per batch row: `full` (V rows),
                `trim:K` (a static K-row head: VocabTrim / FR-Spec) or `specvocab:k` (a rank-R
                ranker's top-k candidates and the indexed LM head over them: on GPU/TPU the
                Pallas kernel, on the CPU XLA's gather)
as the decoders build them: the library's layers and heads, the CPU matmul kernel for decode
steps (`lowering.step_lowering`), weights in the dtype `load_model(dtype=...)` gives on this
backend (on the CPU a narrower dtype applies to the weight matrices only).

Each row carries the bytes the program must read (weights, the KV cache up to its length, a
head's rows and ranker) and the GB/s that makes, beside the machine's read bandwidth measured
in the same run (`read_bandwidth`: a jitted sum over a large array).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from vocabjax.decoding.profile import median_s
from vocabjax.lowering import Lowering, decoding_lowering, lowered, step_lowering
from vocabjax.models import KVCache, forward
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import (SCALE, cast_weights, compute_dtype, init_params, lm_head,
                                       lm_head_rows)
from vocabjax.vocab.policy import with_policy_state
from vocabjax.vocab.ranked import ranked_policy
from vocabjax.vocab.subset import attach_rows, static_policy

PROGRAMS = ("target", "drafter_body", "drafter_head")


class BenchError(ValueError):
  """A benchmark setting that cannot be run (named with its value)."""


@dataclasses.dataclass(frozen=True)
class Head:
  """A drafter LM head variant: kind full | trim | specvocab, and its size (K or k)."""

  kind: str
  size: int = 0
  rank: int = 0  # specvocab: the ranker's rank R

  @classmethod
  def parse(cls, spec: str, rank: int = 56) -> "Head":
    kind, _, size = spec.partition(":")
    if kind == "full" and not size:
      return cls("full")
    if kind in ("trim", "specvocab") and size.isdigit() and int(size) > 0:
      return cls(kind, int(size), rank if kind == "specvocab" else 0)
    raise BenchError(f"head {spec!r}: expected full, trim:K or specvocab:k with a positive size")

  @property
  def name(self) -> str:
    return self.kind if self.kind == "full" else f"{self.kind}:{self.size}"

  def check(self, vocab_size: int, model: str) -> None:
    if self.size > vocab_size:
      raise BenchError(f"head {self.name}: {self.size} candidates exceed {model}'s vocabulary "
                       f"V={vocab_size}")
    if self.kind == "specvocab" and not 1 <= self.rank:
      raise BenchError(f"head {self.name}: ranker rank {self.rank} must be positive")


def read_bandwidth(nbytes: int, repeats: int = 5) -> float:
  """GB/s of a jitted f32 sum over an `nbytes` array (reads only): the bandwidth a
  weight-streaming program can hope for on this device."""
  n = max(1, nbytes // 4)
  x = jnp.ones((n,), jnp.float32)
  f = jax.jit(jnp.sum)
  s = median_s(f, x, repeats=repeats)
  del x
  return n * 4 / s / 1e9


def random_params(config: LlamaLikeConfig, dtype: str, seed: int = 0) -> dict:
  """Random params of `config` in the dtype `load_model(dtype=...)` would give here."""

  key = jax.random.key(seed)
  if jax.default_backend() == "cpu" or dtype == "int8":
    base = init_params(key, config)
    return base if dtype == "float32" else cast_weights(base, dtype)
  return init_params(key, config, dtype=jnp.dtype(dtype))


def layer_weight_bytes(params: dict) -> int:
  """Bytes of the layers' weight matrices and their int8 scales (norms and biases left out)."""

  return sum(int(a.nbytes) for layer in params["layers"] for n, a in layer.items()
             if a.ndim == 2 or n.endswith(SCALE))


def kv_bytes(config: LlamaLikeConfig, B: int, length: int, itemsize: int) -> int:
  """Bytes of the K and V caches of B rows up to `length` positions (what attention reads)."""
  return 2 * B * length * config.num_layers * config.kv_dim * itemsize


def head_bytes(params: dict, config: LlamaLikeConfig, head: Head, B: int, rows: int) -> int:
  """Bytes a head program reads: the head's rows (and a ranker)."""

  U, scale = lm_head_rows(params, config)
  per_row = U.shape[1] * U.dtype.itemsize + (0 if scale is None else scale.dtype.itemsize)
  if head.kind == "full":
    return U.shape[0] * per_row
  if head.kind == "trim":
    return head.size * per_row
  R, isz = head.rank, U.dtype.itemsize
  ranker = (config.vocab_size * R + R * config.hidden_size) * isz
  return ranker + min(B * rows * head.size, config.vocab_size) * per_row


def _runner(run: Callable[[], object], compiled) -> Callable[[], object]:
  run.compiled = compiled
  return run


class Programs:
  """Compiled programs of one model in one dtype (`target`, `body`, `head`), each returning a
  zero-argument callable that runs it once on fixed inputs; the callable's `compiled` is the
  compiled program (its HLO text, its cost analysis: `kernels/step_trace.py` reads the ops'
  kernel targets from it)."""

  def __init__(self, config: LlamaLikeConfig, params: dict, *, context: int, max_len: int,
               lowering: Lowering | None = None):
    """`lowering`: what the programs lower with (default: as one device's decoding steps)."""
    self.lowering = lowering or step_lowering(decoding_lowering(mesh=False))
    self.config, self.params = config, params
    self.context, self.max_len = context, max_len
    self.dtype = compute_dtype(params)

  def _cache(self, B: int):

    return KVCache.init(self.config, B, self.max_len, self.dtype).with_lengths(
        jnp.full((B,), self.context, jnp.int32))

  def _inputs(self, B: int, T: int):
    tok = jnp.zeros((B, T), jnp.int32)
    pos = self.context + jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    return tok, pos

  def _compile(self, fn, *args, donate=()):
    return jax.jit(lowered(fn, self.lowering), donate_argnums=donate).lower(*args).compile()

  def target(self, B: int, T: int) -> Callable[[], object]:

    cfg = self.config

    def step(p, tok, pos, cache):
      h, cache = forward(p, tok, pos, cache, config=cfg)
      return lm_head(p, h, config=cfg), cache

    tok, pos = self._inputs(B, T)
    state = {"cache": self._cache(B)}
    prog = self._compile(step, self.params, tok, pos, state["cache"], donate=(3,))
    def run():
      logits, cache = prog(self.params, tok, pos, state["cache"])
      # every call verifies the same block (fresh lengths: the old ones were donated)
      state["cache"] = cache.with_lengths(jnp.full((B,), self.context, jnp.int32))
      return logits

    return _runner(run, prog)

  def body(self, B: int, T: int) -> Callable[[], object]:

    cfg = self.config
    tok, pos = self._inputs(B, T)
    cache = self._cache(B)
    prog = self._compile(lambda p, t, q, c: forward(p, t, q, c, config=cfg)[0], self.params,
                         tok, pos, cache)
    return _runner(lambda: prog(self.params, tok, pos, cache), prog)

  def head(self, head: Head, B: int, rows: int) -> Callable[[], object]:

    cfg = self.config
    U, scale = lm_head_rows(self.params, cfg)
    name = "embed" if cfg.tie_word_embeddings else "lm_head"
    p = {name: U} if scale is None else {name: U, name + SCALE: scale}
    h = jnp.full((B, rows, cfg.hidden_size), 0.01, self.dtype)
    if head.kind == "full":
      fn = lambda p, h: lm_head(p, h, config=cfg)
    elif head.kind == "trim":
      ids = jnp.arange(head.size, dtype=jnp.int32)
      p = attach_rows(p, U[:head.size], ids, None if scale is None else scale[:head.size])
      fn = static_policy
    else:
      if scale is not None:
        raise BenchError("a SpecVocab head runs on a float drafter (its ranker is matched to "
                         "the float LM head): not with int8 weights")
      k = jax.random.key(1)
      ranker = {"down": (0.02 * jax.random.normal(k, (head.rank, cfg.hidden_size))).astype(U.dtype),
                "vocab": (0.02 * jax.random.normal(jax.random.fold_in(k, 1),
                                                   (cfg.vocab_size, head.rank))).astype(U.dtype)}
      p = with_policy_state(p, ranker)
      fn = lambda p, h: ranked_policy(p, h, config=cfg, k=head.size)
    prog = self._compile(fn, p, h)
    return _runner(lambda: prog(p, h), prog)
