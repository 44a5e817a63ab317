"""Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"): drafts copied from the
context at no model cost, verified by the same lossless chain verification.

Letters: B batch, G most drafts per step (gamma), g drafts in this step's block (0..G), c
candidates (matches) of a tree, n its nodes (<= c*G), S cache slots, V vocabulary.

Drafting (host, numpy, per row): for n = max_ngram down to min_ngram, the last n committed tokens
are looked up at their earliest earlier occurrence whose continuation starts before that suffix
(Saxena's `find_candidate_pred_tokens`), and up to G tokens that followed it are proposed; no
match, no drafts. One target forward verifies [last, d_1 .. d_g] with g the batch's longest draft
(`n_valid` masks shorter rows); a program is compiled per g when first met (its compile time
reported apart), so a step without a match is a plain step. A tree (`candidates` c > 1) merges the
continuations of up to c matches into a trie of at most c*G nodes, verified by
`vocabjax.decoding.tree.verify_tree`; the chain's drafts are one branch, so greedily it accepts at
least what the chain would. Drafts are deterministic, so sampling treats them as point masses:
greedy output equals plain decoding's, sampled output follows p (docs/speculative.md, 'Prompt
lookup decoding').
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vocabjax.decoding.proposer import (Context, Counted, Drafts, Prefilled, RowHandover,
                                       padding_block)
from vocabjax.decoding.tree import TreeBounds
from vocabjax.sampling import SamplingParams


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
  tok, parent, depth = padding_block(len(tries), m)
  for b, (t, p, d) in enumerate(tries):
    tok[b, :len(t)], parent[b, :len(t)], depth[b, :len(t)] = t, p, d
  return tok, parent, depth, np.array([len(t[0]) for t in tries], np.int32)


def chain_block(drafts) -> tuple[np.ndarray, np.ndarray]:
  """Rows' chains of drafts (each a token list, maybe empty) as one block: (tokens [B, M] with
  M the longest, zero-padded; counts [B]) for a chain step's host arrays."""
  n_valid = np.array([len(d) for d in drafts], np.int32)
  block = np.zeros((len(drafts), int(n_valid.max(initial=0))), np.int32)
  for b, d in enumerate(drafts):
    block[b, :len(d)] = d
  return block, n_valid


class LookupProposer(RowHandover, Counted):
  """Prompt lookup's drafts (module doc): found on the host (the host hook) before each step,
  a chain of up to `gamma` tokens (`candidates` 1) or a trie of up to `candidates` x `gamma`
  nodes; no device state, no weights."""

  method = "pld"
  # continuous batching: no row state, each block from the row's committed tokens

  def __init__(self, *, gamma: int = 4, max_ngram: int = 3, min_ngram: int = 1,
               candidates: int = 1):
    check_lookup(gamma, max_ngram, min_ngram, candidates)
    self.gamma, self.max_ngram, self.min_ngram = gamma, max_ngram, min_ngram
    self.candidates = candidates
    self.params = {}
    # the tree's bounds: siblings <= candidates, depth <= gamma (nodes <= candidates * gamma)
    self.tree = self.bounds = TreeBounds(top_k=candidates, depth=gamma)
    self.drafted_per_step = candidates * gamma
    self.extra_slots = candidates * gamma + 1

  def key(self):
    return ("pld", self.gamma, self.candidates)

  def host_block(self, history, active):
    """A chain's drafts [B, M] (M: the longest this step) and their counts [B], or a trie's
    tokens, parent and depth [B, n] (n: the most nodes of a row)."""
    if self.candidates > 1:
      tok, parent, depth, nodes = trie_block(history, active, self.gamma, self.max_ngram,
                                             self.min_ngram, self.candidates)
      return (tok, parent, depth), nodes
    drafts = [lookup_drafts(h, self.gamma, self.max_ngram, self.min_ngram) if a else []
              for h, a in zip(history, active)]
    block, n_valid = chain_block(drafts)
    return (block, n_valid), n_valid

  def host_shapes(self, B: int = 1, sampling=None):
    if self.candidates > 1:
      return [((B, n), (B, n), (B, n)) for n in range(self.candidates * self.gamma + 1)]
    return [((B, M), (B,)) for M in range(self.gamma + 1)]

  def prefill(self, params, target_params, pre: Prefilled):
    return ()

  def propose(self, params, state, ctx: Context, key, *, sampling: SamplingParams, keep=None):
    del key, sampling, keep
    if self.candidates > 1:
      tok, parent, depth = ctx.host
      return Drafts(tokens=tok, parent=parent, depth=depth, bounds=self.bounds), state
    block, n_valid = ctx.host
    return Drafts(tokens=block, n_valid=n_valid), state

  def commit(self, params, state, ctx: Context, drafts: Drafts, verdict):
    return state

  def record(self, stats) -> dict:
    """Totals for an eval record: steps that found a match, and all verifications."""
    matched = sum(1 for row in stats.drafted for d in row if d)
    return {"matched_steps": matched, "verifications": len(stats.drafted)}
