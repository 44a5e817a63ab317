"""Speculation that sizes itself: each step's draft length chosen from the step costs seen so
far and the running acceptance, for the proposers that draft on the host (prompt lookup, the
n-gram table, SuffixDecoding: their block cut to the length) and for a drafter model
(`Proposer.sized`: one step program per length; 0 is a plain step in which the drafter only
reads what it has not seen).

Letters: n drafts verified in a step (0: a plain step), a the per-draft acceptance rate, c(n)
the seconds of a step that verifies n drafts.

`DraftSizer.choose` picks the n in `lengths` maximizing E(n) / c(n), E(n) = (1 - a^(n+1)) /
(1 - a) (Leviathan et al. 2023, eq. 1; a tree's n is its depth), or 0 when none beats a plain
step. `a` is accepted / drafted over the last `window` drafts (from `prior`; after `probe` plain
steps in a row one step drafts the shortest n > 0 to re-estimate it, where some n could pay at
the costs measured, `can_pay`; while the rule keeps stepping aside each probe doubles the wait,
up to `probe_max`). c(n) is the running median of the step times timed at n (compiling steps
excluded). Lengths are tried from the shortest up: an untimed n with two timed lengths below it
costs the line through the two longest of them carried to n (a step's cost grows with its
drafts: the drafter's calls, and the verified rows once verification is compute bound), so
where a short draft already costs too much the longer ones are never tried; an untimed n with
fewer below it is tried (the shortest such first). A batch whose rows are not refilled ends
with its slowest row (`slowest`): there E(n) is the least over the active rows of E(n) at each
row's own acceptance (its drafts in this call, drawn toward `a` by `row_prior` drafts'
weight), since drafting that speeds the other rows does not shorten the call. The choices are
recorded (`SizedStats`).
Exactness is untouched: the sizer only truncates a proposal (docs/suffix.md, 'Speculation that
sizes itself').
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Sequence

import numpy as np

from vocabjax.decoding.proposer import padding_block

RULE = "n* = argmax_n E(n)/c(n), E(n) = (1 - a^(n+1)) / (1 - a); n = 0: a plain step"


@dataclasses.dataclass
class DraftSizer:
  """The draft-length rule (module doc); host state, updated after every step."""

  lengths: Sequence[int]  # the draft lengths a step may verify (0 included)
  prior: float = 0.5  # acceptance assumed before any draft was verified
  window: int = 256  # drafts the running acceptance is taken over
  samples: int = 5  # step times kept per length (their median is c(n))
  plain: bool = True  # add n = 0 (a plain step) to the choices (a drafter model's
  #   `sized_lengths` name it themselves)
  reach: dict | None = None  # n -> the levels a proposal of n drafts reaches (a tree of n
  #   nodes: its depth; None: n, a chain): E(n) and the acceptance count levels
  probe: int = 16  # after this many plain steps in a row, one step drafts (the least n > 0):
  #   a plain step verifies nothing, so without it the acceptance that chose it never changes;
  #   each probe after which the rule still steps aside doubles the wait, up to `probe_max`
  probe_max: int = 256
  fixed: int | None = None  # a batch size's entry of a sizing table: every step takes it
  slowest: bool = False  # the call ends with its slowest row (a batch not refilled): E(n) is
  #   the least of the active rows' (module doc); `begin` sets it per call
  row_prior: float = 8.0  # drafts' weight of the pooled acceptance in a row's own

  def __post_init__(self):
    if not 0.0 < self.prior < 1.0:
      raise ValueError(f"prior acceptance must lie in (0, 1), got {self.prior}")
    if (self.window < 1 or self.samples < 1 or self.probe < 1 or self.row_prior <= 0
        or self.probe_max < self.probe):
      raise ValueError(f"window={self.window}, samples={self.samples} and probe={self.probe} "
                       f"must be >= 1, row_prior={self.row_prior} > 0, probe_max="
                       f"{self.probe_max} >= probe")
    self.lengths = tuple(sorted(set(int(n) for n in self.lengths) | ({0} if self.plain
                                                                      else set())))
    if not self.lengths or self.lengths[0] < 0:
      raise ValueError(f"draft lengths must be >= 0 (and one given), got {self.lengths}")
    if self.fixed is not None and self.fixed not in self.lengths:
      raise ValueError(f"a sizing table's length {self.fixed} is not one this method drafts; "
                       f"choose one of {self.lengths}")
    self._outcomes: collections.deque = collections.deque(maxlen=self.window)
    self._times: dict[int, collections.deque] = {}
    self.choices: list[int] = []
    self._plain_run = 0  # plain steps chosen in a row
    self._probe_wait = self.probe  # plain steps in a row before the next probe
    self._rows: list = []  # per row of this call: [accepted, tried] drafts (`slowest`)

  def begin(self, rows: int, *, slowest: bool) -> None:
    """A call of `rows` rows starts: their own counts from nothing; `slowest` as above."""
    self.slowest = slowest
    self._rows = [[0, 0] for _ in range(rows)]

  def row_acceptance(self, b: int) -> float:
    """Row b's acceptance in this call, drawn toward the pooled one by `row_prior` drafts."""
    acc, tried = self._rows[b] if b < len(self._rows) else (0, 0)
    a = (acc + self.row_prior * self.acceptance) / (tried + self.row_prior)
    return min(max(a, 1e-3), 1 - 1e-3)

  @property
  def acceptance(self) -> float:
    """The running per-draft acceptance rate (the prior until a draft was verified)."""
    if not self._outcomes:
      return self.prior
    return min(max(sum(self._outcomes) / len(self._outcomes), 1e-3), 1 - 1e-3)

  def cost(self, n: int) -> float | None:
    """c(n): the median step time recorded at n; else, with two or more lengths recorded below
    n, the line through the two longest of them carried to n (never below the longer's: a
    step's cost does not fall with its drafts); else the one recorded below n (an optimistic
    guess: `best` tries n); None when nothing is recorded at or below n."""
    below = self._timed(n + 1)
    if not below:
      return None
    m, c = below[-1], statistics.median(self._times[below[-1]])
    if m == n or len(below) < 2:
      return c
    m0 = below[-2]
    slope = (c - statistics.median(self._times[m0])) / (m - m0)
    return c + max(slope, 0.0) * (n - m)

  def untried(self, n: int) -> bool:
    """Whether n must be tried to be priced: not timed, and fewer than two lengths timed below
    it (`cost` has no line to carry to it)."""
    return not self._times.get(n) and len(self._timed(n)) < 2

  def _timed(self, below: int) -> list[int]:
    """The lengths under `below` with a step time recorded, in order."""
    return [m for m in sorted(self._times) if m < below and self._times[m]]

  def levels(self, n: int) -> int:
    """The drafts in a row a proposal of n reaches (n for a chain, a tree's depth)."""
    return n if self.reach is None else int(self.reach.get(n, n))

  def expected_tokens(self, n: int, a: float | None = None) -> float:
    """E(n) at acceptance `a` (default: the pooled one)."""
    a, d = self.acceptance if a is None else a, self.levels(n)
    return (1 - a ** (d + 1)) / (1 - a)

  def call_tokens(self, n: int, active=None) -> float:
    """The tokens per step that set the call's length: E(n), or with `slowest` the least of
    the active rows' E(n) (`active`: a flag per row, default every row of the call)."""
    if not (self.slowest and self._rows):
      return self.expected_tokens(n)
    rows = [b for b in range(len(self._rows)) if active is None or active[b]]
    return min((self.expected_tokens(n, self.row_acceptance(b)) for b in rows),
               default=self.expected_tokens(n))

  def can_pay(self) -> bool:
    """Whether drafting can beat a plain step at the costs measured at any acceptance: some
    n > 0 whose E(n) with every draft accepted (levels(n) + 1 tokens) over c(n) exceeds 1 /
    c(0) (True while c(0) or a c(n) is unknown). Where none can, a probe (whose drafter first
    catches up on the plain steps' tokens) would only cost: the rule does not probe."""
    c0 = self.cost(0)
    if c0 is None or 0 not in self.lengths:
      return True
    costs = {n: self.cost(n) for n in self.lengths if n > 0}
    return any(c is None or (self.levels(n) + 1) / c > 1 / c0 for n, c in costs.items())

  def best(self, active=None, *, explore: bool = True) -> int:
    """The length the rule's figures favor now (`choose` without probes): the shortest length
    that must be tried to be priced (`untried`: the shortest of all when nothing is measured),
    else the n of the highest E(n) / c(n) (module doc), the shorter on a tie. `explore=False`:
    the best of the lengths priced so far (what a sizing table learned from it takes)."""
    priced = [n for n in self.lengths if not self.untried(n)]
    if explore or not priced:
      for n in self.lengths:
        if self.untried(n):
          return n
    rates = {n: self.call_tokens(n, active) / max(self.cost(n), 1e-12) for n in priced}
    return max(priced, key=lambda m: (rates[m], -m))

  def choose(self, active=None) -> int:
    """This step's draft length (module doc; a table's `fixed` length when it has one).
    `active`: which rows still decode (the slowest active row sets a batch's end)."""
    if self.fixed is not None:
      n = self.fixed
    else:
      n = self.best(active)
      if n:  # the rule drafts of itself: probes start again from `probe`
        self._probe_wait = self.probe
      elif (self._times and self._plain_run >= self._probe_wait and len(self.lengths) > 1
            and self.can_pay()):
        n = self.lengths[1]  # a probe: the shortest drafting step (module doc)
        self._probe_wait = min(2 * self._probe_wait, self.probe_max)
    self._plain_run = self._plain_run + 1 if n == 0 else 0
    self.choices.append(n)
    return n

  def update(self, n: int, seconds: float | None, drafted: Sequence[int],
             accepted: Sequence[int]) -> None:
    """After a step that verified up to n drafts: its time (None: it compiled, not counted)
    and each row's drafted and accepted counts (a chain: the first rejection ends a row)."""
    if seconds is not None:
      self._times.setdefault(n, collections.deque(maxlen=self.samples)).append(seconds)
    for b, (d, acc) in enumerate(zip(drafted, accepted)):
      if d:
        # the accepted drafts, then the rejected one (if any); drafts after it were not tried
        # (a tree: its accepted levels, then the level none of its nodes passed)
        reach = d if self.reach is None else min(d, self.levels(n))
        self._outcomes.extend([1] * int(acc) + ([0] if acc < reach else []))
        if b < len(self._rows):
          self._rows[b][0] += int(acc)
          self._rows[b][1] += int(acc) + (1 if acc < reach else 0)

  def record(self, since: int = 0) -> dict:
    """The rule, its inputs (acceptance and costs as they stand: a sizer keeps learning across
    a decoder's runs of the same shapes) and its choices from choice `since` on (one run's)."""
    rows = {"row_acceptance": [round(self.row_acceptance(b), 4)
                               for b in range(len(self._rows))]} if self.slowest else {}
    return {"rule": RULE if self.fixed is None else f"a sizing table's n = {self.fixed}",
            **({"slowest_row": True} if self.slowest else {}),
            "lengths": list(self.lengths),
            "acceptance": round(self.acceptance, 4), **rows,
            "cost_s": {n: round(self.cost(n), 6) for n in self._times if self.cost(n)},
            "choices": dict(collections.Counter(self.choices[since:])),
            **({"reach": {n: self.levels(n) for n in self.lengths}} if self.reach else {})}


def limit_block(arrays: tuple, counts, n: int):
  """A host block cut (or padded) to width n: a chain's (tokens [B, M], counts [B]) keeps its
  first n drafts; a tree's (tokens, parent, depth [B, M], ...) its first n nodes, which are
  parents first, so the rest stays a tree (a node past n is dropped with its subtree, whose
  nodes all come after it); padding nodes are their own parents. Returns (arrays, counts)."""
  counts = np.minimum(np.asarray(counts), n).astype(np.int32)
  if len(arrays) == 2:  # a chain and its counts
    block, n_valid = arrays
    out = np.zeros((block.shape[0], n), block.dtype)
    w = min(n, block.shape[1])
    out[:, :w] = block[:, :w]
    return (out, np.minimum(n_valid, n).astype(n_valid.dtype)), counts
  tok, parent, depth, *rest = arrays
  B, M = tok.shape
  w = min(n, M)
  t, par, dep = padding_block(B, n, tok.dtype)
  t[:, :w], par[:, :w], dep[:, :w] = tok[:, :w], parent[:, :w], depth[:, :w]
  cut = par[:, :w] > w  # a kept node whose parent was cut: padding too (never, parents first)
  par[:, :w] = np.where(cut, np.arange(1, w + 1)[None], par[:, :w])
  return (t, par, dep, *rest), counts


def parse_table(spec) -> dict[int, int]:
  """A per-batch-size sizing table (as vLLM's dynamic speculation takes one) from a mapping or
  text: {batch size: draft length}, or "1:4,8:0" (an entry holds from its batch size up to the
  next entry's; 0: plain decoding). Bad entries are refused naming the entry."""
  if isinstance(spec, str):
    items = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
      b, sep, n = part.partition(":")
      try:
        if not sep:
          raise ValueError
        items.append((int(b), int(n)))
      except ValueError:
        raise ValueError(f"sizing table entry {part!r}: expected BATCH:LENGTH, e.g. "
                         f"'1:4,8:0'") from None
  else:
    items = [(int(b), int(n)) for b, n in dict(spec).items()]
  if not items:
    raise ValueError(f"a sizing table needs at least one BATCH:LENGTH entry, got {spec!r}")
  for b, n in items:
    if b < 1 or n < 0:
      raise ValueError(f"sizing table entry {b}:{n}: batch sizes are >= 1 and lengths >= 0")
  return dict(sorted(items))


def table_length(table: dict[int, int] | None, B: int) -> int | None:
  """A sizing table's length for B rows: the entry of the largest batch size <= B (None: no
  entry that low, or no table: the rule measures)."""
  keys = [b for b in (table or {}) if b <= B]
  return table[max(keys)] if keys else None
