"""Cross-vocabulary speculative decoding (OmniDraft, Ramakrishnan et al. 2025, algorithm 1).

Letters: G drafter tokens per step (gamma), P pending drafter tokens, Vd drafter vocabulary,
V target vocabulary, S cache slots, D drafter hidden size.

The drafter has its own tokenizer. One step:
  1. the drafter first reads the drafter tokens it has not seen (the reverse translation of the
     last committed target token, plus an accepted draft it never fed), then proposes up to G
     drafter tokens. Tokens that cannot reach the target are suppressed (their logits set to
     -inf before q is formed): with the n-gram cache off, every token outside the vocabulary
     intersection (the UAG baseline); with it on, tokens outside the intersection that no cache
     entry uses. An acceptance head may stop the block early (`vocabjax.decoding.adaptive`).
  2. the translator (host) turns the run into target tokens: the longest n-gram cache hit first,
     merging its sub-tokens into one target token with q' = prod q(d_j) (eq. 1), else the
     direct mapping; the run ends at a token that is neither.
  3. the target verifies the m target tokens in one forward (chain rejection sampling, or
     greedy argmax matching) and emits n accepted + 1.
  4. reverse translation: the drafter cache is rolled back to the accepted sub-tokens it holds;
     the correction / bonus target token is detokenized and retokenized with the drafter's
     tokenizer (cached per token id; bytes that are not whole UTF-8 go through the drafter's
     single-byte tokens), and those ids become its pending input, so the drafter's KV cache
     always holds exactly the drafter tokens of the committed text. Every emitted target token
     the drafter spells with two or more tokens enters the n-gram cache.

Exactness (sampling, temperature > 0):
  * greedy: the output equals the target's greedy output token for token, whatever is drafted.
  * direct mapping only (`ngram=False`): exact. The drafted target token at each position is
    the image of a drafter token sampled from q restricted to the intersection and
    renormalized; that distribution scattered into the target vocabulary is passed as q, so
    accept/residual are Leviathan's rule with the true proposal distribution. Tested with a
    chi-square test against target-only sampling.
  * with the n-gram cache, `rule="exact"` (the default): the drafted run is walked down the
    trie of cache keys into target positions, and each position is verified level by level
    against the drafter's exact branch laws (`vocabjax.decoding.routes`): exact for any
    drafter and cache, tested with chi-square tests on a pair built to merge often. The
    verification runs on the host from the target's probabilities of the m + 1 positions.
  * `rule="omnidraft"`: OmniDraft's approximation, kept as a labelled option. A merged token's
    q' = prod q(d_j) is the probability of that particular drafter spelling, not of the target
    token (other spellings and the mass of unmapped tokens are ignored), and the residual at a
    merged position uses q scattered from the first sub-token's distribution with the prefix's
    direct-mapped entry lowered by q' (eq. 2: the mass that went on to the n-gram is not also
    proposed as the prefix alone), clipped at 0. The output is close to, not exactly, the
    target's distribution (its total-variation distance on the test pair is recorded in
    experiments/results/crossvocab_tv.md).

Batches run in lockstep: drafting and verification are device programs over all rows (their
own lengths and pending tokens per row); translation, reverse translation and the n-gram cache
run per row on the host. Compiled programs are shared across calls. The n-gram cache persists
across calls (online learning) and is shared by the rows of a batch.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import types
import warnings
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax import sharding
from vocabjax.decoding.adaptive import acceptance_logit, check_threshold, should_stop
from vocabjax.decoding.routes import Routes
from vocabjax.decoding.autoregressive import (GenerationResult, OutputCollector, abstract_cache,
                                              _prefill, bucket, cache_slots, nonfinite_error,
                                              prefill_in_bf16, prompt_bucket, token_ids,
                                              validate_request)
from vocabjax.decoding.base import DecodingMethod
from vocabjax.decoding.engine import (KEY, ProgramCache, ProgramKey, Request, abstract_arg,
                                      fold_in, host_loop, placed_like, split)
from vocabjax.sampling import NONFINITE, SamplingParams, log_probs, probs
from vocabjax.decoding.drafter import (_draft_prefill, block_layout, check_draft_prefill,
                                       lowering_folds_catch_up)
from vocabjax.decoding.speculative import SpecStats, mesh_layout
from vocabjax.decoding.verify import verify_chain
from vocabjax.lowering import decoding_lowering, lowered, step_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import (compute_dtype, embed_tokens, forward, lm_head,
                                       with_mlp_layout)
from vocabjax.vocab.translate import (NgramCache, TranslationError, Translator, VocabMap,
                                      check_round_trip)

RULES = ("exact", "omnidraft")  # verification of sampled drafts with n-gram merges (module doc)

ROUND_TRIP_TEXTS = (
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Natalia sold 48 clips in April, and half as many in May: 48 / 2 = 24.",
    "  indented\ttabs\n\nand blank lines  ",
    "café naïve – 東京 🙂",
)


@dataclasses.dataclass
class CrossVocabStats(SpecStats):
  """SpecStats (counted in target tokens) plus what the translator did."""

  ngram_drafted: list[list[int]] = dataclasses.field(default_factory=list)  # merged drafts
  ngram_accepted: list[list[int]] = dataclasses.field(default_factory=list)  # of them accepted
  drafter_tokens: list[list[int]] = dataclasses.field(default_factory=list)  # drafter proposals
  draft_s: float = 0.0  # drafter programs (pending block + drafting loop)
  verify_s: float = 0.0  # target verification
  host_s: float = 0.0  # translation, reverse translation, n-gram cache

  active: list[list[bool]] = dataclasses.field(default_factory=list)  # row ran this step
  # (a step may translate to 0 drafts, when the first drafter token merges into nothing; the
  # target still runs and emits one token, so steps are counted from `active`, not `drafted`)

  @property
  def num_steps(self) -> int:
    return sum(1 for row in self.active for a in row if a)

  @property
  def target_forwards(self) -> int:
    return sum(1 for row in self.active if any(row))

  @property
  def tau(self) -> float:
    acc = sum(a for row in self.accepted for a in row)
    steps = self.num_steps
    return (acc + steps) / steps if steps else float("nan")

  def record(self) -> dict:
    """Totals for an eval record."""
    tot = lambda rows: int(sum(map(sum, rows)))  # noqa: E731
    return {"ngram_drafted": tot(self.ngram_drafted), "ngram_accepted": tot(self.ngram_accepted),
            "drafter_tokens": tot(self.drafter_tokens), "verifications": self.num_steps,
            "draft_s": self.draft_s, "verify_s": self.verify_s, "host_s": self.host_s}

  @property
  def ngram_hits_per_step(self) -> float:
    """Merged (n-gram) target drafts proposed per verification."""
    steps = self.num_steps
    return sum(map(sum, self.ngram_drafted)) / steps if steps else float("nan")



def _draft(dp, cache, pend, n_pend, allowed, key, head, *, config: LlamaLikeConfig, gamma: int,
           sampling: SamplingParams, threshold: float):
  """Feed each row's pending drafter tokens, then propose up to `gamma` drafter tokens per row.

  pend [B, P] (row b's first n_pend[b] real), allowed [Vd] bool, head: acceptance head params
  or None. Returns (drafts [B, G] int32, q of each draft [B, G], q rows [B, G, Vd] (sampling)
  or [B, G, 1], number drafted [B], acceptance probabilities [B, G], cache). Row b's cache
  gains its n_pend[b] tokens and its first (number drafted - 1) drafts: the last draft is never
  fed (it may be rejected). Rows draft in lockstep; a row the acceptance head stopped keeps
  running with the others, and what it drafts after stopping is not counted (its cache entries
  lie past the length the host sets).
  """
  G, (B, P) = gamma, pend.shape
  L0 = cache.lengths
  h, cache = forward(dp, pend, L0[:, None] + jnp.arange(P)[None], cache, config=config)
  # [B, D]: each row's last fed position (a per-row gather: on a mesh rows stay on their
  # devices, where h[arange(B), n_pend - 1] moved them between devices)
  h = jnp.take_along_axis(h, (n_pend - 1)[:, None, None], axis=1)[:, 0]
  cache = cache.with_lengths(L0 + n_pend)
  Vq = allowed.shape[0] if not sampling.greedy else 1
  keys = jax.random.split(key, G)

  def choose(i, h, p_all):
    logits = jnp.where(allowed, lm_head(dp, h, config=config), -jnp.inf)  # [B, Vd]
    if sampling.greedy:
      d = jnp.argmax(logits, axis=-1).astype(jnp.int32)
      q_row, q_d = jnp.ones((B, 1), jnp.float32), jnp.ones((B,), jnp.float32)
    else:
      lp = log_probs(logits, sampling)
      d = jax.random.categorical(keys[i], lp, axis=-1).astype(jnp.int32)
      q_row = jnp.exp(lp)
      q_d = jnp.take_along_axis(q_row, d[:, None], axis=1)[:, 0]
    a = (jax.nn.sigmoid(acceptance_logit(head, h, embed_tokens(dp, d))) if head is not None
         else jnp.ones((B,), jnp.float32))
    p_all = p_all * a
    stop = should_stop(p_all, threshold) if head is not None else jnp.zeros((B,), jnp.bool_)
    return d, q_d, q_row, a, p_all, stop

  def record(bufs, i, d, q_d, q_row, a):
    ds, qd, qs, acc = bufs
    return (ds.at[:, i].set(d), qd.at[:, i].set(q_d), qs.at[:, i].set(q_row),
            acc.at[:, i].set(a))

  bufs = (jnp.zeros((B, G), jnp.int32), jnp.zeros((B, G), jnp.float32),
          jnp.zeros((B, G, Vq), jnp.float32), jnp.zeros((B, G), jnp.float32))
  d, q_d, q_row, a, p_all, stop = choose(0, h, jnp.ones((B,), jnp.float32))
  bufs = record(bufs, 0, d, q_d, q_row, a)
  n = jnp.ones((B,), jnp.int32)

  # Draft i feeds draft i-1 first, so the loop never feeds a draft it will not build on (no
  # lax.cond around the forward: on XLA:CPU a cond copied the whole cache every step).
  def cond(c):
    return (c[0] < G) & ~c[2].all()

  def body(c):
    i, d, stopped, p_all, n, cache, bufs = c
    h, cache = forward(dp, d[:, None], cache.lengths[:, None], cache, config=config)
    d, q_d, q_row, a, p_all, stop = choose(i, h[:, 0], p_all)
    n = n + ~stopped
    return i + 1, d, stopped | stop, p_all, n, cache, record(bufs, i, d, q_d, q_row, a)

  _, _, _, _, n, cache, (ds, qd, qs, acc) = jax.lax.while_loop(
      cond, body, (jnp.int32(1), d, stop, p_all, n, cache, bufs))
  return ds, qd, qs, n, acc, cache


def translated_q(q_rows, d2t_idx, ngram_t, prefix_t, qprime, vocab_size: int) -> jax.Array:
  """The drafting distribution in target ids, [G, V] (OmniDraft eqs. 1-2).

  q_rows [G, Vd]: the drafter's q at each draft's first sub-token; d2t_idx [Vd]: target id of
  each drafter id, `vocab_size` where there is none (dropped); ngram_t [G]: the merged target
  token of an n-gram draft, -1 for a direct one; prefix_t [G]: the direct target token of the
  n-gram's first sub-token (`vocab_size` if none); qprime [G]: prod q(d_j) of the n-gram.
  """
  G, V = q_rows.shape[0], vocab_size
  rows = jnp.arange(G)
  qt = jnp.zeros((G, V + 1), jnp.float32).at[:, d2t_idx].add(q_rows.astype(jnp.float32))
  is_ng = ngram_t >= 0
  qt = qt.at[rows, jnp.where(is_ng, ngram_t, V)].add(jnp.where(is_ng, qprime, 0.0))
  qt = qt.at[rows, jnp.where(is_ng, prefix_t, V)].add(jnp.where(is_ng, -qprime, 0.0))
  return jnp.maximum(qt[:, :V], 0.0)


def _target_probs(tp, cache, last, drafts, *, config: LlamaLikeConfig, sampling: SamplingParams):
  """The target's processed probabilities after `last` [B] and each row's drafts [B, m],
  [B, m + 1, V], for host-side verification (the `exact` rule); the cache keeps its lengths
  (the host sets them once it knows how many drafts each row had accepted)."""
  N = cache.lengths
  tokens = jnp.concatenate([last[:, None], drafts], axis=1)
  h, cache = forward(tp, tokens, N[:, None] + jnp.arange(tokens.shape[1])[None], cache,
                     config=config)
  return probs(lm_head(tp, h, config=config), sampling), cache.with_lengths(N)


def _verify(tp, cache, last, drafts, m, qs, src, ngram_t, prefix_t, qprime, d2t_idx, key, *,
            config: LlamaLikeConfig, sampling: SamplingParams):
  """Verify row b's m[b] translated drafts (drafts [B, M], the rest padding) in one forward.

  Sampling builds q over the target vocabulary per draft position: the drafter's q row of the
  draft's first sub-token (qs[b, src]) scattered through the direct map (d2t_idx [Vd], V where
  there is no target token); at an n-gram position, q' added at the merged token and taken
  from the prefix sub-token's own target token (eq. 2), clipped at 0 (module doc).
  Returns (accepted [B], next token [B], cache with every committed token but `next`).
  """
  qt = None
  if not sampling.greedy:
    q_rows = jnp.take_along_axis(qs, src[..., None], axis=1)  # [B, M, Vd]
    qt = jax.vmap(translated_q, in_axes=(0, None, 0, 0, 0, None))(
        q_rows, d2t_idx, ngram_t, prefix_t, qprime, config.vocab_size)
  v = verify_chain(tp, last, drafts, cache, key, target_config=config, sampling=sampling,
                   q=qt, n_valid=m)
  return v.accepted, v.next, v.target_cache


class CrossVocabDecoder(DecodingMethod):
  """A drafter with another tokenizer drafting for a target (module doc).

  `ngram=False` is the direct-mapping (UAG) baseline; `acceptance_head` (params of
  `vocabjax.decoding.adaptive`) with `stop_threshold` makes the draft length adaptive. `rule`:
  how sampled drafts with n-gram merges are verified, "exact" (lossless) or "omnidraft" (the
  paper's approximation; module doc). Greedy decoding and direct mapping are exact either way.
  """

  method = "crossvocab"

  def __init__(self, target_params, target_config: LlamaLikeConfig, draft_params,
               draft_config: LlamaLikeConfig, *, target_tokenizer, draft_tokenizer,
               gamma: int = 4, ngram: bool = True, vocab_map: VocabMap | None = None,
               min_overlap: float = 0.1, acceptance_head: dict | None = None,
               stop_threshold: float = 0.5, layout: str = "auto",
               round_trip_texts: Sequence[str] = ROUND_TRIP_TEXTS, draft_prefill: str = "bf16",
               rule: str = "exact", mesh=None):
    """`draft_prefill`: the drafter's prompt prefill precision, as for `ChainDecoder`
    (`vocabjax.decoding.drafter.compile_draft_prefill`). `mesh`: a ("data", "model") mesh
    (`vocabjax.sharding`): target and drafter placed on it by the sharding rules (weights
    [out, in]), their caches rows over "data"; every program (prefills, drafting, the target's
    probabilities, verification) runs partitioned and keeps its cache's sharding, while
    translation and the n-gram cache stay on the host as on one device."""
    check_draft_prefill(draft_prefill)
    self.mesh = mesh
    # what its programs lower with, as `SpeculativeDecoder`'s (`vocabjax.lowering`)
    self.lowering = decoding_lowering(mesh=mesh)
    layout = mesh_layout(layout, mesh)
    if rule not in RULES:
      raise ValueError(f"unknown crossvocab sampling rule {rule!r}; choose one of {RULES}")
    self.rule = rule
    self.draft_prefill = draft_prefill
    if gamma < 1:
      raise ValueError(f"gamma must be >= 1, got {gamma=}")
    if acceptance_head is not None:
      check_threshold(stop_threshold)
      if acceptance_head["w1"].shape[0] != 2 * draft_config.hidden_size:
        raise ValueError(f"acceptance head input {acceptance_head['w1'].shape[0]} != 2 x the "
                         f"drafter's hidden size {draft_config.hidden_size}")
    for tok, cfg, name in ((target_tokenizer, target_config, "target"),
                           (draft_tokenizer, draft_config, "drafter")):
      if len(tok) > cfg.vocab_size + 64:
        raise TranslationError(f"the {name} tokenizer has {len(tok)} tokens but the {name} "
                               f"model only V={cfg.vocab_size} rows: wrong tokenizer/model pair")
      if len(tok) > cfg.vocab_size:  # a few added tokens past the rows: never mapped
        warnings.warn(f"the {name} tokenizer has {len(tok)} tokens, the {name} model "
                      f"V={cfg.vocab_size} rows; ids >= {cfg.vocab_size} are left out of the "
                      f"vocabulary map")
      check_round_trip(tok, round_trip_texts, name=f"the {name} tokenizer")
    self.translator = Translator(target_tokenizer, draft_tokenizer, vocab_map=vocab_map,
                                 min_overlap=min_overlap, target_vocab=target_config.vocab_size,
                                 draft_vocab=draft_config.vocab_size)
    self.vm, self.d2t, self.t2d = self.translator.vm, self.translator.d2t, self.translator.t2d
    V = target_config.vocab_size
    if layout == "auto":
      layout = block_layout(self.lowering.platform, self.lowering.cpu_kernel)
    self.tc, self.dc = target_config, draft_config
    self.tp = self._place(with_mlp_layout(target_params, layout), target_config)
    self.dp = self._place(with_mlp_layout(draft_params, "out_in"), draft_config)
    self.gamma, self.use_ngram = gamma, ngram
    self.extra_slots = gamma + 2  # target cache slots one step may write past max_new_tokens
    self.head, self.threshold = self._replicated(acceptance_head), stop_threshold
    self.reset_ngram()
    self._d2t_idx = self._replicated(jnp.asarray(np.where(self.d2t >= 0, self.d2t, V),
                                                 jnp.int32))
    self._programs = ProgramCache()

  def _place(self, params, config: LlamaLikeConfig):
    """A model's params on the mesh by the sharding rules (as given without one)."""
    return params if self.mesh is None else sharding.shard_params(params, config, self.mesh)

  def _replicated(self, tree):
    """Small arrays (the acceptance head, the id map) copied to every device of the mesh."""
    return tree if self.mesh is None or tree is None else sharding.replicate(tree, self.mesh)

  def set_drafter(self, draft_params, head: dict | None = None) -> None:
    """Swap in updated drafter weights (online distillation); same shapes, no recompilation."""
    self.dp = self._place(with_mlp_layout(draft_params, "out_in"), self.dc)
    if head is not None:
      self.head = self._replicated(head)

  # --- translation (host) -------------------------------------------------------------------
  def to_drafter(self, target_ids: Sequence[int]) -> list[int]:
    """Reverse translation: the drafter ids of target tokens, one token at a time."""
    return self.translator.to_drafter(target_ids)

  def prompt_to_drafter(self, prompt: Sequence[int]) -> list[int]:
    return self.translator.prompt_to_drafter(prompt)

  def learn(self, target_ids: Sequence[int]) -> int:
    """Add emitted target tokens the drafter spells with several tokens to the n-gram cache
    (nothing with the cache off: direct mapping only)."""
    if not self.use_ngram:
      return 0
    return sum(self._add_ngram(t, self.to_drafter([t])) for t in target_ids)

  def _add_ngram(self, target_id, drafter_ids) -> bool:
    """Cache one entry (runs of >= 2 drafter tokens) and let the drafter propose its tokens."""
    if not self.ngram.add(int(target_id), drafter_ids):
      return False
    self.routes.add(drafter_ids, target_id)
    self._allowed[list(drafter_ids)] = True
    self._allowed_dev = None
    return True

  def run_record(self, result) -> dict:
    """The run's translator counts (`CrossVocabStats.record`) and the n-gram cache's size."""
    return {**result.stats.record(), "ngram_cache": self.ngram.stats}

  def ngram_entries(self) -> list[list]:
    """The n-gram cache as [[drafter ids], target id] pairs in insertion order (to save)."""
    return [[list(k), t] for k, t in self.ngram.entries.items()]

  def reset_ngram(self) -> None:
    """Empty the n-gram cache (it persists across `generate` calls)."""
    self.ngram = NgramCache()
    self.routes = Routes(self.d2t, self.t2d)
    self._allowed, self._allowed_dev = self.d2t >= 0, None

  def load_ngram(self, entries) -> None:
    """Restore a saved n-gram cache (`ngram_entries`), e.g. when resuming an online run."""
    for ids, t in entries:
      self._add_ngram(t, ids)

  def allowed(self) -> jax.Array:
    """[Vd] bool: drafter tokens the drafter may propose (module doc)."""
    if self._allowed_dev is None:
      self._allowed_dev = self._replicated(
          jnp.asarray(self._allowed if self.use_ngram else self.d2t >= 0))
    return self._allowed_dev

  def translate(self, ds, qd) -> tuple[list[int], list[float], list[int], list[bool]]:
    """Drafter run -> (target ids, q', sub-tokens used each, merged by the n-gram cache)."""
    cache = self.ngram if self.use_ngram else NgramCache()
    merged = cache.merge(ds, qd, self.d2t)
    return ([t for t, _, _ in merged], [q for _, q, _ in merged], [k for _, _, k in merged],
            [k > 1 for _, _, k in merged])

  # --- compiled programs --------------------------------------------------------------------
  def _program(self, name: str, sampling: SamplingParams, B: int, *shape):
    key = ProgramKey(name, ("crossvocab", self.tc, self.dc, self.gamma, self.threshold),
                     sampling, (B, *shape), self.lowering)
    return self._programs.get(key, lambda: self._compile(
        name, sampling, B, shape, compute_dtype(self.tp)))

  def _cache(self, config: LlamaLikeConfig, B: int, S: int, dtype, abstract: bool = False):
    """An empty cache (or its shapes, for lowering), on the mesh: rows over "data"."""
    if abstract:
      return abstract_cache(config, B, S, dtype, self.mesh)
    cache = KVCache.init(config, B, S, dtype)
    return cache if self.mesh is None else sharding.shard_cache(cache, config, self.mesh)

  def _placed(self, cache: KVCache, config: LlamaLikeConfig) -> KVCache:
    """`cache` with the sharding the programs were compiled for (a prefill's or a grown
    cache's layout may differ; nothing moves when it already has it)."""
    if self.mesh is None:
      return cache
    return sharding.shard_cache(cache, config, self.mesh)

  def _lengths(self, cache: KVCache, lengths) -> KVCache:
    """`cache` with the host's lengths, placed as its own lengths are."""
    arr = jnp.asarray(lengths, jnp.int32)
    if self.mesh is not None:
      arr = jax.device_put(arr, cache.lengths.sharding)
    return cache.with_lengths(arr)

  def _lower(self, fn, *args):
    """`jax.jit(fn).lower(*args)` lowered as the decoder's steps (its params, args[0], tagged
    with `step_lowering(self.lowering)`) with the cache (args[1]) donated; on a mesh every
    KVCache output keeps that cache's sharding and the other outputs come back replicated (for
    the host), so no program reshards a cache between steps."""
    fn = lowered(fn, step_lowering(self.lowering))
    if self.mesh is None:  # the cache with the params (a deviceless build's chip too)
      args = (args[0], placed_like(args[1], args[0]), *args[2:])
      return jax.jit(fn, donate_argnums=(1,)).lower(*args)
    cache_sh = jax.tree.map(lambda x: x.sharding, args[1])
    rep = sharding.replicated(self.mesh)
    out = jax.tree.map(lambda x: cache_sh if isinstance(x, KVCache) else rep,
                       jax.eval_shape(fn, *args), is_leaf=lambda x: isinstance(x, KVCache))
    # the host's inputs (tokens, lengths, q rows, the id map, keys) replicated: left
    # unspecified, XLA may choose to split one, and a replicated array passed then is refused
    rest = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep),
                        args[2:])
    return jax.jit(fn, donate_argnums=(1,), out_shardings=out).lower(*args[:2], *rest)

  def _compile(self, name, sampling, B, shape, dtype):
    """One of `_program`'s programs, compiled (decoding steps take the CPU kernel for any M)."""
    return self._lowered(name, sampling, B, shape, dtype).compile()

  step_programs = ("draft", "verify")  # the programs one decoding step runs (`lower`'s names)
  prefill_programs = ("tprefill", "dprefill")

  def abstract_caches(self, B: int, S: int, dtype) -> list:
    """The step's KV caches (the target's, the drafter's: S slots each here), abstract."""
    return [self._cache(self.tc, B, S, dtype, abstract=True),
            self._cache(self.dc, B, S, dtype, abstract=True)]

  def lower(self, sampling: SamplingParams, B: int, T: int, S: int, dtype, *,
            programs=("tprefill", "dprefill", "draft", "verify")) -> dict:
    """The decoder's programs LOWERED (not compiled) for a [B, T] prompt block, S cache slots
    (both models'), a one-token pending block and a verification of gamma drafts: what
    `_program` compiles (per shape met), and what bench and deviceless builds compile."""
    shapes = {"tprefill": (T, S), "dprefill": (T, S), "draft": (1, S), "tprobs": (S, self.gamma),
              "verify": (S, self.gamma)}
    return {name: self._lowered(name, sampling, B, shapes[name], dtype) for name in programs}

  def _lowered(self, name, sampling, B, shape, dtype):
    """One of `_program`'s programs, lowered: the one way this decoder builds a program."""
    i32 = lambda *s: abstract_arg(s, jnp.int32, B=B, mesh=self.mesh,  # noqa: E731
                                  like=self.tp, rows=False)
    f32 = lambda *s: abstract_arg(s, jnp.float32, B=B, mesh=self.mesh,  # noqa: E731
                                  like=self.tp, rows=False)
    key = abstract_arg(KEY.shape, KEY.dtype, B=B, mesh=self.mesh, like=self.tp, rows=False)
    if name in ("tprefill", "dprefill"):
      T, S = shape
      config, params = (self.tc, self.tp) if name == "tprefill" else (self.dc, self.dp)
      cache = self._cache(config, B, S, dtype, abstract=True)
      if self.mesh is None:
        cache = placed_like(cache, params)
      if name == "tprefill":
        lw = self.lowering.replace(bf16_blocks=prefill_in_bf16(params))
        fn = functools.partial(_prefill, config=config, sampling=sampling)
        args = (params, i32(B, T), i32(B), cache, key)
      else:
        lw = self.lowering.replace(bf16_blocks=self.draft_prefill == "bf16")
        fn = functools.partial(_draft_prefill, config=config)
        args = (params, i32(B, T), i32(B), cache)
      return jax.jit(lowered(fn, lw), donate_argnums=(3,)).lower(*args)
    if name == "draft":
      P, S = shape
      cache = self._cache(self.dc, B, S, dtype, abstract=True)
      return self._lower(functools.partial(_draft, config=self.dc, gamma=self.gamma,
                                           sampling=sampling, threshold=self.threshold),
                         self.dp, cache, i32(B, P), i32(B),
                         abstract_arg((self.dc.vocab_size,), jnp.bool_, B=B, mesh=self.mesh,
                                      like=self.tp, rows=False), key, self.head)
    if name == "tprobs":  # the target's probabilities of m drafts per row (exact rule)
      S, m = shape
      cache = self._cache(self.tc, B, S, dtype, abstract=True)
      return self._lower(functools.partial(_target_probs, config=self.tc, sampling=sampling),
                         self.tp, cache, i32(B), i32(B, m))
    # verify up to m drafts per row, for each block M the loop meets (powers of two to gamma)
    S, m = shape
    G = self.gamma
    cache = self._cache(self.tc, B, S, dtype, abstract=True)
    Vq = 1 if sampling.greedy else self.dc.vocab_size
    return self._lower(functools.partial(_verify, config=self.tc, sampling=sampling),
                       self.tp, cache, i32(B), i32(B, m), i32(B), f32(B, G, Vq), i32(B, m),
                       i32(B, m), i32(B, m), f32(B, m), self._d2t_idx, key)

  # --- generation ---------------------------------------------------------------------------
  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               eos_token_ids: Sequence[int] = (), max_len: int | None = None,
               stop_strings: Sequence[str] = (), tokenizer=None,
               batch_size: int | None = None, streamer=None) -> GenerationResult:
    """Generate like `Decoder.generate` (prompts in target ids); greedy output equals it token
    for token. `stats` is a CrossVocabStats counted in target tokens.

    The prompts run as one batch (`batch_size`: in batches of that many rows): drafting and
    verification are batched device programs over the rows, in lockstep; only translation,
    reverse translation and the n-gram cache run per row on the host (microseconds a row). A
    row that has finished stays in its batch, frozen (its caches do not advance) until the
    batch ends.
    """
    prompts = token_ids(prompts)
    validate_request(prompts, max_new_tokens, sampling, self.tc, None)
    if streamer is not None and len(prompts) != 1:
      raise ValueError(f"a streamer takes one row (as transformers' streamers do); this "
                       f"request has {len(prompts)} rows")
    if batch_size is not None and batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    room = max_new_tokens + self.gamma + 2
    longest = max(len(p) for p in prompts)
    if max_len is not None and longest + room > max_len:
      raise ValueError(f"prompt of {longest} tokens + {max_new_tokens=} + {self.gamma + 2} "
                       f"slots for one crossvocab step = {longest + room} exceeds the cache "
                       f"length {max_len=}")
    size = batch_size or len(prompts)
    if self.mesh is not None:
      sizes = sorted({min(size, len(prompts) - lo) for lo in range(0, len(prompts), size)})
      bad = [n for n in sizes if n % self.mesh.shape["data"]]
      if bad:
        raise ValueError(f"a batch of B={bad[0]} rows does not divide the mesh's data axis of "
                         f"{self.mesh.shape['data']} devices: pad the batch, pick batch_size, "
                         f"or use another mesh")
    stats = CrossVocabStats(drafted=[], accepted=[])
    res = GenerationResult(tokens=[], finish_reasons=[], prompt_lengths=[len(p) for p in prompts],
                           compile_s=0.0, prefill_s=0.0, decode_s=0.0, steps=0, stats=stats)
    for lo in range(0, len(prompts), size):
      rows = prompts[lo:lo + size]
      out = OutputCollector(len(rows), max_new_tokens, eos_token_ids, stop_strings, tokenizer,
                            streamer)
      self._generate_batch(lo, len(prompts), rows, max_len, room, out, sampling,
                           jax.random.key(seed), res)
      res.tokens.extend(out.tokens)
      res.finish_reasons.extend(out.reasons)
    return res

  def _generate_batch(self, lo, total, prompts, max_len, room, out, sampling, key, res):
    """Rows lo .. lo + len(prompts) - 1 of `total` (stats rows are laid out over all of them)."""
    st = res.stats
    G, B = self.gamma, len(prompts)
    dtype = compute_dtype(self.tp)
    S = cache_slots(max(len(p) for p in prompts), room, max_len)
    dprompts = [self.prompt_to_drafter(p) for p in prompts]
    # the drafter's cache: each row's own need (its drafter prompt + twice its target room, as
    # one row alone would get), the largest of them; not the longest drafter prompt + twice the
    # batch's room over the shortest target prompt, which mixed prompt lengths inflate
    Sd = bucket(max(len(d) + 2 * (cache_slots(len(p), room, max_len) - len(p))
                    for p, d in zip(prompts, dprompts)) + 2 * G + 16)
    T = min(prompt_bucket(max(len(p) for p in prompts)), S)
    Td = min(prompt_bucket(max(len(d) for d in dprompts)), Sd)
    tprefill, c1 = self._program("tprefill", sampling, B, T, S)
    dprefill, c2 = self._program("dprefill", sampling, B, Td, Sd)
    compile_s = c1 + c2
    exact = not sampling.greedy and self.use_ngram and self.rule == "exact"
    # the programs most steps need, compiled before the clock starts: full blocks and one or
    # two pending tokens (shorter blocks, a long pending run or a grown drafter cache compile
    # when first met; their compile time is kept out of decode_s)
    verify_name = "tprobs" if exact else "verify"
    compile_s += self._program(verify_name, sampling, B, S, G)[1]
    # the drafter's pending block is padded to 2 tokens at least where a two-token call costs
    # about a one-token call (the CPU kernel, any GPU/TPU: `fold_catch_up`), so one program
    # serves the usual one- and two-token steps; else 1- and 2-token programs
    p_min = 2 if lowering_folds_catch_up(self.lowering) else 1
    for P in range(p_min, 3):
      compile_s += self._program("draft", sampling, B, P, Sd)[1]
    row_keys = [fold_in(key, lo + b) for b in range(B)]
    rngs = [np.random.default_rng(np.asarray(jax.random.key_data(k)).ravel().tolist())
            for k in row_keys]
    tokens = np.zeros((B, T), np.int32)
    dtokens = np.zeros((B, Td), np.int32)
    for b, (p, dp_) in enumerate(zip(prompts, dprompts)):
      tokens[b, :len(p)], dtokens[b, :len(dp_)] = p, dp_
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    req = Request(prompts, lengths, S, T, tokens, key, out)
    final = []

    def start():
      first, tcache = tprefill(self.tp, jnp.asarray(tokens), jnp.asarray(lengths),
                               self._cache(self.tc, B, S, dtype), fold_in(key, lo))
      dcache = dprefill(self.dp, jnp.asarray(dtokens),
                        jnp.asarray([len(d) for d in dprompts], jnp.int32),
                        self._cache(self.dc, B, Sd, dtype))
      last = [int(x) for x in np.asarray(first)]
      for b, x in enumerate(last):  # before the drafter re-tokenizes it
        if x == NONFINITE:
          raise nonfinite_error(lo + b, 0, step=0)
      self.learn(last)
      # the loop's host state: each row's committed target tokens in its cache (tlen), its
      # last token, the drafter tokens it has not read (pend) and those in its cache (ctx)
      c = types.SimpleNamespace(
          tcache=self._placed(tcache, self.tc), dcache=self._placed(dcache, self.dc), Sd=Sd,
          last=last, tlen=[len(p) for p in prompts], pend=[self.to_drafter([x]) for x in last],
          ctx=[list(d) for d in dprompts])
      final.append(c)  # updated in place by every step
      return np.asarray(last), c

    def advance(c, step, _key, live):  # live: rows still generating; the others are frozen
      kd, kv = split(fold_in(key, step * total + lo))
      P = bucket(max(len(x) for x in c.pend), minimum=p_min)
      while max(map(len, c.ctx)) + P + G > c.Sd:  # long drafter spellings: grow its cache
        c.Sd *= 2
        c.dcache = self._placed(_grow(c.dcache, c.Sd), self.dc)
      draft, compiled = self._program("draft", sampling, B, P, c.Sd)
      t0 = time.perf_counter()
      pend_arr = np.zeros((B, P), np.int32)
      for b, x in enumerate(c.pend):
        pend_arr[b, :len(x)] = x
      ds, qd, qs, nd, _, c.dcache = draft(self.dp, c.dcache, jnp.asarray(pend_arr),
                                          jnp.asarray([len(x) for x in c.pend], jnp.int32),
                                          self.allowed(), kd, self.head)
      ds_h, qd_h, nd = np.asarray(ds), np.asarray(qd), np.asarray(nd)
      t1 = time.perf_counter()
      # translation, per row on the host: the exact rule's planned positions, or OmniDraft's
      # q' of each translated draft
      plans, qprimes, tids, nsub, is_ng = [], [], [], [], []
      for b in range(B):
        if exact:
          positions = self.routes.plan(ds_h[b], nd[b])
          kept = [x for x in positions if x.fed]
          plans.append(positions)
          tids.append([x.target for x in kept])
          nsub.append([x.end - x.start for x in kept])
          is_ng.append([len(x.node) > 1 for x in kept])
        else:
          t_b, qp_b, ns_b, ng_b = self.translate(ds_h[b, :nd[b]], qd_h[b, :nd[b]])
          qprimes.append(qp_b)
          tids.append(t_b)
          nsub.append(ns_b)
          is_ng.append(ng_b)
        if not live[b]:  # frozen: nothing to verify
          tids[b], nsub[b], is_ng[b] = [], [], []
      m = np.asarray([len(t) for t in tids], np.int32)
      # the block a verification program runs: a power of two up to gamma (rows pad past
      # their m), so that at most log2(gamma) + 2 programs are compiled, not gamma + 1
      M = min(bucket(max(int(m.max()), 1), minimum=1), G)
      drafts = np.zeros((B, M), np.int32)
      for b in range(B):
        drafts[b, :m[b]] = tids[b]
      if exact:
        probs_fn, seconds = self._program(verify_name, sampling, B, S, M)
        compiled += seconds
        t2 = time.perf_counter()
        p_rows, c.tcache = probs_fn(self.tp, c.tcache, jnp.asarray(c.last, jnp.int32),
                                    jnp.asarray(drafts))
        p_rows = np.asarray(p_rows)
        t3 = time.perf_counter()
        n, nxt = np.zeros(B, np.int64), np.zeros(B, np.int64)
        qs_h = np.asarray(qs)
        for b in np.flatnonzero(live):
          kept = sum(x.fed for x in plans[b])
          if not np.isfinite(p_rows[b, :kept + 1]).all():
            raise nonfinite_error(lo + b, len(out.tokens[b]), step)
          n[b], nxt[b] = self.routes.verify(p_rows[b, :kept + 1], plans[b], ds_h[b],
                                            qs_h[b, :nd[b]], rngs[b])
      else:
        src = np.zeros((B, M), np.int32)
        ngram_t = np.full((B, M), -1, np.int32)
        prefix_t = np.full((B, M), -1, np.int32)
        qp = np.zeros((B, M), np.float32)
        for b in range(B):
          pos = 0
          for i in range(m[b]):
            src[b, i] = pos
            if is_ng[b][i]:
              ngram_t[b, i], qp[b, i] = tids[b][i], qprimes[b][i]
              first_sub = ds_h[b, pos]
              prefix_t[b, i] = (self.d2t[first_sub] if self.d2t[first_sub] >= 0
                                else self.tc.vocab_size)
            pos += nsub[b][i]
        verify, seconds = self._program(verify_name, sampling, B, S, M)
        compiled += seconds
        t2 = time.perf_counter()
        n, nxt, c.tcache = verify(self.tp, c.tcache, jnp.asarray(c.last, jnp.int32),
                                  jnp.asarray(drafts), jnp.asarray(m), qs, jnp.asarray(src),
                                  jnp.asarray(ngram_t), jnp.asarray(prefix_t), jnp.asarray(qp),
                                  self._d2t_idx, kv)
        n, nxt = np.asarray(n).astype(np.int64), np.asarray(nxt).astype(np.int64)
        t3 = time.perf_counter()
      emitted = np.full((B, G + 1), -1, np.int64)
      for b in np.flatnonzero(live):
        if nxt[b] == NONFINITE:
          raise nonfinite_error(lo + b, len(out.tokens[b]), step)
        row = [int(x) for x in drafts[b, :n[b]]] + [int(nxt[b])]
        emitted[b, :len(row)] = row
        c.tlen[b] += 1 + int(n[b])
        u = sum(nsub[b][:n[b]])  # drafter sub-tokens accepted
        fed = min(u, int(nd[b]) - 1)  # of them already in the drafter's cache
        c.ctx[b] += c.pend[b] + [int(x) for x in ds_h[b, :fed]]
        self.learn(row)
        c.pend[b] = [int(x) for x in ds_h[b, fed:u]] + self.to_drafter([int(nxt[b])])
        c.last[b] = int(nxt[b])
      # frozen rows keep their lengths; live rows keep what they committed
      c.tcache = self._lengths(c.tcache, c.tlen)
      c.dcache = self._lengths(c.dcache, [len(x) for x in c.ctx])

      def spread(vals):  # this batch's values in the row layout of all prompts
        v = [0] * total
        v[lo:lo + B] = [int(x) if live[b] else 0 for b, x in enumerate(vals)]
        return v

      st.drafted.append(spread(m))
      st.accepted.append(spread(n))
      st.ngram_drafted.append(spread([sum(x) for x in is_ng]))
      st.ngram_accepted.append(spread([sum(x[:k]) for x, k in zip(is_ng, n)]))
      st.drafter_tokens.append(spread(nd))
      st.active.append([lo <= j < lo + B and bool(live[j - lo]) for j in range(total)])
      st.draft_s += t1 - t0
      st.verify_s += t3 - t2
      st.host_s += (t2 - t1) + (time.perf_counter() - t3)
      return c, emitted, compiled

    done = host_loop(req, start, advance, compile_s=compile_s)
    res.compile_s += done.compile_s
    res.prefill_s += done.prefill_s
    res.decode_s += done.decode_s
    res.steps += done.steps
    c, b = final[0], B - 1
    self.trace = (c.ctx[b], c.pend[b], c.dcache.rows(b, b + 1))


def _grow(cache: KVCache, S: int) -> KVCache:
  """The same entries in a cache of S slots (a sliding layers' ring keeps its size)."""
  pad = [(0, 0)] * cache.k.ndim
  pad[2] = (0, S - cache.max_len)
  return cache.replace(k=jnp.pad(cache.k, pad), v=jnp.pad(cache.v, pad))
