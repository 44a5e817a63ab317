"""Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"): drafts copied from the
context at no model cost, verified by the same lossless chain verification.

Letters: B batch, G most drafts per step (gamma), g drafts in this step's block (0..G), c
candidates (matches) of a tree, n its nodes (<= c*G), S cache slots, V vocabulary.

Drafting (host, numpy, per row): for n = max_ngram down to min_ngram, take the last n committed
tokens (prompt + output) and find their earliest earlier occurrence whose continuation starts
before that suffix (Saxena's `find_candidate_pred_tokens`); propose up to G tokens that
followed it. No match: no drafts for that row.

Verification: one target forward over [last, d_1 .. d_g] with g the longest draft in the batch
this step; a program is compiled per g (0..G) when that g is first met (its compile time is
reported apart from decoding), so a step without any match is an ordinary one-token step.
Rows with fewer drafts pass `n_valid`; what lies past it is never accepted.

Tree (`candidates` c > 1): the continuations of up to c matches (the chain's first, then the
other occurrences of the same n-gram, most recent first, then shorter n-grams) merged into a
token trie of at most c*G nodes (shared prefixes once, siblings distinct), verified in one
target forward with the tree engine's ancestor mask and path compaction
(`vocabjax.decoding.tree.verify_tree`). The chain's drafts are one branch, so greedily the tree
accepts at least what the chain would. Where the context repeats with variations (a passage
restated, code edited in several places) the other branches catch what the first match misses.
A program is compiled per node count actually met (n = 0..c*G, padded rows point padding nodes
at themselves, so they are never a child of anything); its compile time is reported apart.

Exactness: greedy keeps the longest prefix equal to the target's argmax, then the target's
token: identical to autoregressive greedy decoding. Sampling: the drafts are a deterministic
function of the context, so the drafting law is a point mass q = one-hot(d); the chain rule
then accepts d with probability p(d) and on rejection samples norm(max(0, p - one-hot(d))),
i.e. p with d removed: the output follows p exactly (DESIGN: deterministic drafts). A tree's
siblings are distinct deterministic tokens: each is tried with p'(x) and removed from p' on
rejection (`verify_tree_sampling`), the multi-draft form of the same rule.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax import sharding
from vocabjax.decoding.autoregressive import (GenerationResult, abstract_cache, compile_prefill,
                                              request)
from vocabjax.decoding.base import DecodingMethod
from vocabjax.decoding.engine import ProgramCache, fold_in, host_loop
from vocabjax.sampling import SamplingParams
from vocabjax.decoding.speculative import SpecStats
from vocabjax.decoding.tree import TreeBounds, verify_tree
from vocabjax.decoding.verify import verify_chain
from vocabjax.lowering import decoding_lowering, lowered, step_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import compute_dtype


def lookup_drafts(seq: np.ndarray, gamma: int, max_ngram: int = 3,
                  min_ngram: int = 1) -> np.ndarray:
  """Up to `gamma` tokens that followed the earliest earlier occurrence of the longest suffix
  n-gram (max_ngram >= n >= min_ngram) of `seq` [L]; empty when nothing matches."""
  found = lookup_continuations(seq, gamma, max_ngram, min_ngram, candidates=1)
  return found[0] if found else np.asarray(seq)[:0].copy()


def lookup_continuations(seq: np.ndarray, gamma: int, max_ngram: int = 3, min_ngram: int = 1,
                         candidates: int = 1) -> list[np.ndarray]:
  """Up to `candidates` distinct continuations (each <= `gamma` tokens) of earlier occurrences
  of suffix n-grams of `seq`: first `lookup_drafts`'s, then the other occurrences of that
  n-gram from the most recent back, then those of shorter n-grams. A continuation that is a
  prefix of one already taken adds nothing and is skipped."""
  seq = np.asarray(seq)
  L = len(seq)
  out: list[np.ndarray] = []
  for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
    windows = np.lib.stride_tricks.sliding_window_view(seq, n)
    hits = np.flatnonzero((windows == seq[L - n:]).all(axis=1))
    hits = hits[hits + n < L - n]
    if not hits.size:
      continue
    for h in [hits[0], *hits[:0:-1]] if not out else hits[::-1]:
      c = seq[int(h) + n:int(h) + n + gamma]
      if any(len(o) >= len(c) and np.array_equal(o[:len(c)], c) for o in out):
        continue
      out.append(c.copy())
      if len(out) == candidates:
        return out
  return out


def continuation_trie(conts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The token trie of `conts`: (tokens [n], parent [n] with 0 the root and j + 1 node j,
  depth [n] from 1), nodes in insertion order, siblings distinct."""
  index: dict = {}
  tok, par, dep = [], [], []
  for c in conts:
    at = 0
    for i, t in enumerate(np.asarray(c).tolist()):
      if (at, t) not in index:
        tok.append(t)
        par.append(at)
        dep.append(i + 1)
        index[(at, t)] = len(tok)
      at = index[(at, t)]
  return (np.asarray(tok, np.int32), np.asarray(par, np.int32), np.asarray(dep, np.int32))


def check_lookup(gamma: int, max_ngram: int, min_ngram: int, candidates: int) -> None:
  """Raise ValueError naming the value when lookup settings are out of range."""
  if gamma < 1:
    raise ValueError(f"gamma must be >= 1, got {gamma=}")
  if not 1 <= min_ngram <= max_ngram:
    raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram=} {max_ngram=}")
  if candidates < 1:
    raise ValueError(f"candidates must be >= 1 (1: a chain), got {candidates=}")


def trie_block(hist: Sequence[np.ndarray], active, gamma: int, max_ngram: int, min_ngram: int,
               candidates: int, sizes: Sequence[int] | None = None):
  """Each active row's trie of continuations (`lookup_continuations`, `continuation_trie`) as
  one block: (tokens [B, m], parent [B, m], depth [B, m], nodes per row [B]), m the most nodes
  of a row, or the smallest of `sizes` that holds them. Padding nodes are their own parents
  (node j: parent j + 1) at depth 1, so they are never a child of anything."""
  tries = [continuation_trie(lookup_continuations(h, gamma, max_ngram, min_ngram, candidates))
           if a else continuation_trie([]) for h, a in zip(hist, active)]
  n = max(len(t[0]) for t in tries)
  m = n if sizes is None else next(s for s in sorted(sizes) if s >= n)
  B = len(tries)
  tok = np.zeros((B, m), np.int32)
  parent = np.broadcast_to(np.arange(1, m + 1, dtype=np.int32), (B, m)).copy()
  depth = np.ones((B, m), np.int32)
  for b, (t, p, d) in enumerate(tries):
    tok[b, :len(t)], parent[b, :len(t)], depth[b, :len(t)] = t, p, d
  return tok, parent, depth, np.array([len(t[0]) for t in tries], np.int32)


@dataclasses.dataclass
class LookupStats(SpecStats):
  """SpecStats where a step may propose no drafts (no match): every active step counts."""

  active: list[list[bool]] = dataclasses.field(default_factory=list)  # [steps][B]

  @property
  def target_forwards(self) -> int:
    """Verifications after the prefill, with or without drafts."""
    return len(self.drafted)

  @property
  def tau(self) -> float:
    steps = sum(a for row in self.active for a in row)
    acc = sum(a for row in self.accepted for a in row)
    return (acc + steps) / steps if steps else float("nan")

  def record(self) -> dict:
    """Totals for an eval record: steps that found a match, and all verifications."""
    matched = sum(1 for row in self.drafted for d in row if d)
    return {"matched_steps": matched, "verifications": len(self.drafted)}


def pld_step(params, cache: KVCache, tokens, n_valid, key, *, config: LlamaLikeConfig,
             sampling: SamplingParams):
  """Verify tokens [B, g + 1] = [last, d_1 .. d_g] (drafts past n_valid [B] are padding).

  The cache holds every committed token except `last`. Returns (cache, next last [B],
  emitted [B, g + 1] with -1 after the emitted tokens, accepted [B]).
  """
  v = verify_chain(params, tokens[:, 0], tokens[:, 1:], cache, key, target_config=config,
                   sampling=sampling, n_valid=n_valid)
  return v.target_cache, v.next, v.emitted, v.accepted


def pld_tree_step(params, cache: KVCache, tokens, parent, depth, key, *,
                  config: LlamaLikeConfig, sampling: SamplingParams, tree: TreeBounds):
  """Verify the trie tokens [B, n + 1] = [last, nodes] (parent [B, n]: 0 the root, j + 1 node
  j; a padding node is its own parent; depth [B, n]). Returns what `pld_step` returns, emitted
  [B, G + 1]."""
  v = verify_tree(params, tokens[:, 0], tokens[:, 1:], parent, depth, cache, key,
                  target_config=config, tree=tree, sampling=sampling)
  return v.target_cache, v.next.astype(jnp.int32), v.emitted, v.accepted


class PromptLookupDecoder(DecodingMethod):
  """Prompt lookup decoding of one target; greedy output equals `Decoder.generate`'s."""

  method = "pld"

  def __init__(self, target_params, target_config: LlamaLikeConfig, *, gamma: int = 4,
               max_ngram: int = 3, min_ngram: int = 1, candidates: int = 1, mesh=None):
    """`mesh`: a ("data", "model") mesh (`vocabjax.sharding`): the target is placed on it
    (weights [out, in]), the cache rows over "data" and KV heads over "model"; prefill and
    every verification run partitioned, the cache keeping its sharding from step to step (the
    drafts are looked up on the host either way)."""
    check_lookup(gamma, max_ngram, min_ngram, candidates)
    self.tc, self.mesh = target_config, mesh
    self.lowering = decoding_lowering(mesh=mesh)  # as `SpeculativeDecoder`'s
    self.tp = target_params if mesh is None else sharding.shard_params(target_params,
                                                                       target_config, mesh)
    self.gamma, self.max_ngram, self.min_ngram = gamma, max_ngram, min_ngram
    self.candidates = candidates
    # the tree's bounds: siblings <= candidates, depth <= gamma (nodes <= candidates * gamma)
    self.tree = TreeBounds(top_k=candidates, depth=gamma)
    self.drafted_per_step = candidates * gamma
    self.extra_slots = candidates * gamma + 1
    self.verify_tokens = candidates * gamma + 1
    self._programs = ProgramCache()  # the prefills, the chain steps (per M), the tree steps

  def _jit_step(self, fn, cache):
    """`jax.jit(fn)` lowered as the decoder's steps (`self.lowering`, see
    `SpeculativeDecoder`) with the cache donated; on a mesh the cache keeps its sharding out
    of the step and the step's other outputs come back replicated (for the host)."""
    fn = lowered(fn, step_lowering(self.lowering))
    if self.mesh is None:
      return jax.jit(fn, donate_argnums=(1,))
    rep = sharding.replicated(self.mesh)
    return jax.jit(fn, donate_argnums=(1,), out_shardings=(
        jax.tree.map(lambda x: x.sharding, cache), rep, rep, rep))

  def _new_cache(self, B: int, S: int, dtype) -> KVCache:
    cache = KVCache.init(self.tc, B, S, dtype)
    return cache if self.mesh is None else sharding.shard_cache(cache, self.tc, self.mesh)

  def programs(self, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    """(prefill, step, the prefill's compile seconds) for these shapes; `step(M)` is (the
    chain step verifying M drafts, seconds spent compiling it now): a step compiles when its
    draft count is first met (0 when it was compiled before), as the tree steps do."""
    name = jnp.dtype(dtype).name
    prefill, seconds = self._programs.get(("prefill", sampling, B, T, S, name), lambda: (
        compile_prefill(self.tp, self.tc, sampling, B, T,
                        abstract_cache(self.tc, B, S, dtype, self.mesh), self.lowering)))

    def step(M: int):
      def build():
        cache = abstract_cache(self.tc, B, S, dtype, self.mesh)
        fn = self._jit_step(functools.partial(pld_step, config=self.tc, sampling=sampling),
                            cache)
        i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
        return fn.lower(self.tp, cache, i32(B, M + 1), i32(B), jax.random.key(0)).compile()

      if not 0 <= M <= self.gamma:
        raise ValueError(f"a chain step verifies 0..gamma={self.gamma} drafts, got M={M}")
      return self._programs.get(("chain", sampling, B, S, name, M), build)

    return prefill, step, seconds

  def tree_program(self, sampling: SamplingParams, B: int, S: int, dtype, n: int):
    """The compiled tree verification of n nodes (`pld_tree_step`), and its compile seconds
    (0 when it was compiled before: programs are kept per node count and cache size)."""
    def build():
      cache = abstract_cache(self.tc, B, S, dtype, self.mesh)
      i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
      fn = self._jit_step(functools.partial(pld_tree_step, config=self.tc, sampling=sampling,
                                            tree=self.tree), cache)
      return fn.lower(self.tp, cache, i32(B, n + 1), i32(B, n), i32(B, n),
                      jax.random.key(0)).compile()

    return self._programs.get(("tree", sampling, B, S, jnp.dtype(dtype).name, n), build)

  def _tree_block(self, hist, active, last_np):
    """(tokens [B, n + 1], parent [B, n], depth [B, n], nodes per row) of this step's tries."""
    tok, parent, depth, nodes = trie_block(hist, active, self.gamma, self.max_ngram,
                                           self.min_ngram, self.candidates)
    return np.concatenate([np.asarray(last_np, np.int32)[:, None], tok], 1), parent, depth, nodes

  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               eos_token_ids: Sequence[int] = (), max_len: int | None = None,
               stop_strings: Sequence[str] = (), tokenizer=None,
               streamer=None) -> GenerationResult:
    """Generate like `Decoder.generate`; `stats` is a LookupStats, `steps` counts target
    forwards after the prefill."""
    req = request(prompts, max_new_tokens=max_new_tokens, sampling=sampling, config=self.tc,
                  max_len=max_len, extra_slots=self.extra_slots, method=self.method,
                  mesh=self.mesh, seed=seed, eos_token_ids=eos_token_ids,
                  stop_strings=stop_strings, tokenizer=tokenizer, streamer=streamer)
    B, S, dtype = req.B, req.S, compute_dtype(self.tp)
    prefill, steps, compile_s = self.programs(sampling, B, req.T, S, dtype)
    stats = LookupStats(drafted=[], accepted=[])

    def start():
      last, cache = prefill(self.tp, jnp.asarray(req.tokens), jnp.asarray(req.lengths),
                            self._new_cache(B, S, dtype), fold_in(req.key, 0))
      if self.mesh is not None:  # the steps' cache sharding (the prefill's output may differ)
        cache = jax.device_put(cache, jax.tree.map(
            lambda x: x.sharding, abstract_cache(self.tc, B, S, dtype, self.mesh)))
      last_np = np.asarray(last)
      hist = [np.append(np.asarray(p, np.int64), t) for p, t in zip(req.prompts, last_np)]
      return last_np, (cache, last_np, hist)  # committed tokens per row: prompt + first token

    def advance(carry, i, key, active):
      cache, last_np, hist = carry
      # a step program compiles when its node count (tree) or draft count (chain) is first met
      if self.candidates > 1:
        block, parent, depth, n_valid = self._tree_block(hist, active, last_np)
        prog, compiled = self.tree_program(sampling, B, S, dtype, block.shape[1] - 1)
        cache, last, emitted, n = prog(self.tp, cache, jnp.asarray(block), jnp.asarray(parent),
                                       jnp.asarray(depth), key)
      else:
        drafts = [lookup_drafts(h, self.gamma, self.max_ngram, self.min_ngram) if a else
                  np.zeros(0, np.int64) for h, a in zip(hist, active)]
        n_valid = np.array([len(d) for d in drafts], np.int32)
        M = int(n_valid.max())
        block = np.zeros((B, M + 1), np.int32)
        block[:, 0] = last_np
        for b, d in enumerate(drafts):
          block[b, 1:1 + len(d)] = d
        prog, compiled = steps(M)
        cache, last, emitted, n = prog(self.tp, cache, jnp.asarray(block),
                                       jnp.asarray(n_valid), key)
      last_np, emitted, n = np.asarray(last), np.asarray(emitted), np.asarray(n)
      stats.drafted.append([int(v) if a else 0 for v, a in zip(n_valid, active)])
      stats.accepted.append([int(x) if a else 0 for x, a in zip(n, active)])
      stats.active.append([bool(a) for a in active])
      hist = [np.concatenate([h, e[:k + 1]]) for h, e, k in zip(hist, emitted, n)]
      return (cache, last_np, hist), emitted, compiled

    return host_loop(req, start, advance, compile_s=compile_s, stats=stats)
