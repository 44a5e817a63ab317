"""A fixed n-gram table (`ngram`), a whole drafting method in one file: the table, its
proposer, its parameters and its registration (docs/extending.md's worked example).

The table maps each context of up to n - 1 tokens to the token that most often followed it in
a corpus (`NgramTable.fit`); a step drafts up to `gamma` tokens by walking it from the
committed tokens (the longest context it knows, backing off to shorter ones), on the host.
The engine verifies the chain: greedy output equals plain decoding's, and sampling follows the
target's law (the drafts are a deterministic function of the context: point masses).

    table = NgramTable.fit(token_id_lists, n=3)
    dec = SpeculativeEngine(params, config, NgramProposer(table, gamma=4))
    dec = METHODS["ngram"].make(target, None, {"corpus": "my_code.txt", "gamma": 4})
"""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

from vocabjax.decoding.pld import chain_block
from vocabjax.decoding.proposer import Context, Counted, Drafts, RowHandover
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import MAX_TREE_NODES
from vocabjax.errors import ConfigError
from vocabjax.io import read_utf8
from vocabjax.methods import check_sizing_table, model_blocks, register, sizing_table_of


class NgramTable:
  """Most frequent next token per context of 1 .. n - 1 tokens (ties: the smaller id)."""

  def __init__(self, n: int = 3):
    if n < 2:
      raise ValueError(f"an n-gram table needs n >= 2 (a context of n - 1 >= 1 tokens), got {n=}")
    self.n, self.counts = n, collections.defaultdict(collections.Counter)

  @classmethod
  def fit(cls, sequences, n: int = 3) -> "NgramTable":
    table = cls(n)
    for seq in sequences:
      seq = [int(t) for t in seq]
      for i in range(1, len(seq)):
        for k in range(1, min(n - 1, i) + 1):
          table.counts[tuple(seq[i - k:i])][seq[i]] += 1
    if not table.counts:
      raise ValueError("an n-gram table fit on no token pairs: the corpus is empty")
    return table

  def next(self, context) -> int | None:
    for k in range(min(self.n - 1, len(context)), 0, -1):
      seen = self.counts.get(tuple(context[-k:]))
      if seen:
        return min(seen.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    return None

  def draft(self, context, gamma: int) -> list[int]:
    out, ctx = [], [int(t) for t in context[-(self.n - 1):]]
    while len(out) < gamma and (tok := self.next(ctx)) is not None:
      out.append(tok)
      ctx = (ctx + [tok])[-(self.n - 1):]
    return out


class NgramProposer(RowHandover, Counted):
  """Chains of up to `gamma` drafts from an `NgramTable`, found on the host before each step."""

  method = "ngram"
  # continuous batching: no row state, each block from the row's committed tokens

  def __init__(self, table: NgramTable, gamma: int = 4):
    if gamma < 1:
      raise ValueError(f"gamma must be >= 1, got {gamma=}")
    self.table, self.gamma, self.params = table, gamma, {}
    self.drafted_per_step, self.extra_slots = gamma, gamma + 1

  def key(self):
    return ("ngram", self.gamma)

  def host_block(self, history, active):
    drafts = [self.table.draft(h, self.gamma) if a else [] for h, a in zip(history, active)]
    block, n_valid = chain_block(drafts)
    return (block, n_valid), n_valid

  def host_shapes(self, B: int = 1, sampling=None):
    return [((B, M), (B,)) for M in range(self.gamma + 1)]

  def prefill(self, params, target_params, pre):
    return ()

  def propose(self, params, state, ctx: Context, key, *, sampling, keep=None):
    block, n_valid = ctx.host
    return Drafts(tokens=block, n_valid=n_valid), state

  def commit(self, params, state, ctx, drafts, verdict):
    return state

  def record(self, stats) -> dict:
    return {"matched_steps": sum(1 for row in stats.drafted for d in row if d),
            "verifications": len(stats.drafted)}


def table_from(path: str, tokenizer, n: int = 3) -> NgramTable:
  """An `NgramTable` fit on a text file (one document per line; `.jsonl`: each line's "text")
  tokenized with `tokenizer`."""
  lines = read_utf8(path, ConfigError).splitlines()
  texts = [json.loads(x)["text"] if path.endswith(".jsonl") else x for x in lines if x.strip()]
  return NgramTable.fit((tokenizer.encode(t) for t in texts), n=n)


# --- its registration: `--method ngram`, a suite's `method: ngram` ----------------------------

@dataclasses.dataclass(frozen=True)
class NgramParams:
  corpus: str  # a text file the table is fit on (one document per line; .jsonl: its "text")
  n: int = 3  # contexts of up to n - 1 tokens
  gamma: int = 4  # most drafts per step
  self_sizing: bool = False  # each step's draft length from step costs and acceptance
  sizing_table: str = ""  # per batch size, "1:4,8:0": B rows take the length of the largest
  #   batch size <= B every step (0: plain decoding's programs); others keep the rule

  def check(self, where: str) -> None:
    if self.n < 2 or not 1 <= self.gamma <= MAX_TREE_NODES:
      raise ConfigError(f"{where}: ngram needs n >= 2 and 1 <= gamma <= {MAX_TREE_NODES}, got "
                        f"n={self.n}, gamma={self.gamma}")
    check_sizing_table(where, "ngram", self.sizing_table)
    if not Path(self.corpus).is_file():
      raise ConfigError(f"{where}: ngram.corpus={self.corpus!r}: no such file (a text file, "
                        f"one document per line, or a .jsonl with a \"text\" field)")


@register("ngram", NgramParams, needs_draft=False, drafter_passes=lambda p: 0, timed=False)
def _ngram(target, draft, p: NgramParams, mesh=None):
  """Drafts walked from an n-gram table fit on a corpus, no drafter."""
  del draft
  if target.tokenizer is None:
    raise ValueError(f"{target.source} has no tokenizer to encode the ngram corpus with")
  table = table_from(p.corpus, target.tokenizer, n=p.n)
  return SpeculativeEngine(model_blocks(target, mesh), target.config,
                           NgramProposer(table, gamma=p.gamma), mesh=mesh,
                           self_sizing=p.self_sizing, sizing_table=sizing_table_of(p.sizing_table))
