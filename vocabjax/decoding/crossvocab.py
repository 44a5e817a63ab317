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
  * with the n-gram cache: OmniDraft's approximation. A merged token's q' = prod q(d_j) is the
    probability of that particular drafter spelling, not of the target token (other spellings
    and the mass of unmapped tokens are ignored), and the residual at a merged position uses
    q scattered from the first sub-token's distribution with the prefix's direct-mapped entry
    lowered by q' (eq. 2: the mass that went on to the n-gram is not also proposed as the
    prefix alone), clipped at 0. The output is close to, not exactly, the target's distribution.

Batches run row by row (each row's translation is its own host loop); compiled programs are
shared across rows and calls. The n-gram cache persists across calls (online learning).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.decoding.adaptive import acceptance_logit, check_threshold, should_stop
from vocabjax.decoding.autoregressive import (GenerationResult, OutputCollector, bucket,
                                              cache_slots, compile_prefill, prompt_bucket,
                                              validate_request)
from vocabjax.decoding.sampling import SamplingParams, log_probs, probs
from vocabjax.decoding.speculative import (SpecStats, block_layout, check_draft_prefill,
                                           compile_draft_prefill)
from vocabjax.decoding.verify import verify_chain_greedy, verify_chain_sampling
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import compute_dtype, embed_tokens, forward, lm_head, with_mlp_layout
from vocabjax.vocab.translate import (NgramCache, TranslationError, Translator, VocabMap,
                                      check_round_trip)

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
  """Feed the pending drafter tokens, then propose up to `gamma` drafter tokens.

  pend [1, P] (first n_pend real), allowed [Vd] bool, head: acceptance head params or None.
  Returns (drafts [G] int32, q of each draft [G], q rows [G, Vd] (sampling) or [G, 1], number
  drafted, acceptance probabilities [G], cache). The cache gains the n_pend tokens and the
  first (number drafted - 1) drafts: the last draft is never fed (it may be rejected).
  """
  G, P = gamma, pend.shape[1]
  L0 = cache.lengths
  h, cache = forward(dp, pend, L0[:, None] + jnp.arange(P)[None], cache, config=config)
  h = jnp.take(h[0], n_pend - 1, axis=0)  # [D]
  cache = cache.with_lengths(L0 + n_pend)
  Vq = allowed.shape[0] if not sampling.greedy else 1
  keys = jax.random.split(key, G)

  def choose(i, h, p_all):
    logits = jnp.where(allowed, lm_head(dp, h, config=config), -jnp.inf)
    if sampling.greedy:
      d = jnp.argmax(logits).astype(jnp.int32)
      q_row, q_d = jnp.ones((1,), jnp.float32), jnp.float32(1.0)
    else:
      lp = log_probs(logits, sampling)
      d = jax.random.categorical(keys[i], lp).astype(jnp.int32)
      q_row = jnp.exp(lp)
      q_d = q_row[d]
    a = (jax.nn.sigmoid(acceptance_logit(head, h, embed_tokens(dp, d))) if head is not None
         else jnp.float32(1.0))
    p_all = p_all * a
    stop = should_stop(p_all, threshold) if head is not None else jnp.bool_(False)
    return d, q_d, q_row, a, p_all, stop

  def record(bufs, i, d, q_d, q_row, a):
    ds, qd, qs, acc = bufs
    return ds.at[i].set(d), qd.at[i].set(q_d), qs.at[i].set(q_row), acc.at[i].set(a)

  bufs = (jnp.zeros((G,), jnp.int32), jnp.zeros((G,), jnp.float32),
          jnp.zeros((G, Vq), jnp.float32), jnp.zeros((G,), jnp.float32))
  d, q_d, q_row, a, p_all, stop = choose(0, h, jnp.float32(1.0))
  bufs = record(bufs, 0, d, q_d, q_row, a)

  # Draft i feeds draft i-1 first, so the loop never feeds a draft it will not build on (no
  # lax.cond around the forward: on XLA:CPU a cond copied the whole cache every step).
  def cond(c):
    return (c[0] < G) & ~c[2]

  def body(c):
    i, d, _, p_all, cache, bufs = c
    h, cache = forward(dp, d[None, None], cache.lengths[:, None], cache, config=config)
    d, q_d, q_row, a, p_all, stop = choose(i, h[0, 0], p_all)
    return i + 1, d, stop, p_all, cache, record(bufs, i, d, q_d, q_row, a)

  n, _, _, _, cache, (ds, qd, qs, acc) = jax.lax.while_loop(
      cond, body, (jnp.int32(1), d, stop, p_all, cache, bufs))
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


def _verify(tp, cache, last, drafts, m, qs, src, ngram_t, prefix_t, qprime, d2t_idx, key, *,
            config: LlamaLikeConfig, sampling: SamplingParams):
  """Verify m translated drafts (drafts [G], the rest padding) in one target forward.

  Sampling builds q over the target vocabulary per draft position: the drafter's q row of the
  draft's first sub-token (qs[src]) scattered through the direct map (d2t_idx [Vd], V where
  there is no target token); at an n-gram position, q' added at the merged token and taken
  from the prefix sub-token's own target token (eq. 2), clipped at 0 (module doc).
  Returns (accepted, next token, cache with every committed token but `next`).
  """
  G = drafts.shape[0]
  V = config.vocab_size
  N = cache.lengths
  tokens = jnp.concatenate([last[None], drafts])[None]
  h, cache = forward(tp, tokens, N[:, None] + jnp.arange(G + 1)[None], cache, config=config)
  logits = lm_head(tp, h, config=config)  # [1, G + 1, V]
  if sampling.greedy:
    n, nxt = verify_chain_greedy(drafts[None], logits, m[None])
  else:
    qt = translated_q(qs[src], d2t_idx, ngram_t, prefix_t, qprime, V)
    n, nxt = verify_chain_sampling(key, drafts[None], probs(logits, sampling), qt[None], m[None])
  return n[0], nxt[0], cache.with_lengths(N + 1 + n[0])


class CrossVocabDecoder:
  """A drafter with another tokenizer drafting for a target (module doc).

  `ngram=False` is the direct-mapping (UAG) baseline; `acceptance_head` (params of
  `vocabjax.decoding.adaptive`) with `stop_threshold` makes the draft length adaptive.
  """

  method = "crossvocab"

  def __init__(self, target_params, target_config: LlamaLikeConfig, draft_params,
               draft_config: LlamaLikeConfig, *, target_tokenizer, draft_tokenizer,
               gamma: int = 4, ngram: bool = True, vocab_map: VocabMap | None = None,
               min_overlap: float = 0.1, acceptance_head: dict | None = None,
               stop_threshold: float = 0.5, layout: str = "auto",
               round_trip_texts: Sequence[str] = ROUND_TRIP_TEXTS, draft_prefill: str = "bf16"):
    """`draft_prefill`: the drafter's prompt prefill precision, as for `ChainDecoder`
    (`vocabjax.decoding.speculative.compile_draft_prefill`)."""
    check_draft_prefill(draft_prefill)
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
      layout = block_layout()
    self.tp, self.tc = with_mlp_layout(target_params, layout), target_config
    self.dp, self.dc = with_mlp_layout(draft_params, "out_in"), draft_config
    self.gamma, self.use_ngram = gamma, ngram
    self.extra_slots = gamma + 2  # target cache slots one step may write past max_new_tokens
    self.head, self.threshold = acceptance_head, stop_threshold
    self.reset_ngram()
    self._d2t_idx = jnp.asarray(np.where(self.d2t >= 0, self.d2t, V), jnp.int32)
    self._programs: dict = {}

  def set_drafter(self, draft_params, head: dict | None = None) -> None:
    """Swap in updated drafter weights (online distillation); same shapes, no recompilation."""
    self.dp = with_mlp_layout(draft_params, "out_in")
    if head is not None:
      self.head = head

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
    self._allowed[list(drafter_ids)] = True
    self._allowed_dev = None
    return True

  def ngram_entries(self) -> list[list]:
    """The n-gram cache as [[drafter ids], target id] pairs in insertion order (to save)."""
    return [[list(k), t] for k, t in self.ngram.entries.items()]

  def reset_ngram(self) -> None:
    """Empty the n-gram cache (it persists across `generate` calls)."""
    self.ngram = NgramCache()
    self._allowed, self._allowed_dev = self.d2t >= 0, None

  def load_ngram(self, entries) -> None:
    """Restore a saved n-gram cache (`ngram_entries`), e.g. when resuming an online run."""
    for ids, t in entries:
      self._add_ngram(t, ids)

  def allowed(self) -> jax.Array:
    """[Vd] bool: drafter tokens the drafter may propose (module doc)."""
    if self._allowed_dev is None:
      self._allowed_dev = jnp.asarray(self._allowed if self.use_ngram else self.d2t >= 0)
    return self._allowed_dev

  def translate(self, ds, qd) -> tuple[list[int], list[float], list[int], list[bool]]:
    """Drafter run -> (target ids, q', sub-tokens used each, merged by the n-gram cache)."""
    cache = self.ngram if self.use_ngram else NgramCache()
    merged = cache.merge(ds, qd, self.d2t)
    return ([t for t, _, _ in merged], [q for _, q, _ in merged], [k for _, _, k in merged],
            [k > 1 for _, _, k in merged])

  # --- compiled programs --------------------------------------------------------------------
  def _program(self, name: str, sampling: SamplingParams, *shape):
    key = (name, sampling, *shape)
    if key in self._programs:
      return self._programs[key], 0.0
    t0 = time.perf_counter()
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    dtype = compute_dtype(self.tp)
    if name == "tprefill":
      T, S = shape
      cache = jax.eval_shape(lambda: KVCache.init(self.tc, 1, S, dtype))
      fn = compile_prefill(self.tp, self.tc, sampling, 1, T, cache)
    elif name == "dprefill":
      T, S = shape
      cache = jax.eval_shape(lambda: KVCache.init(self.dc, 1, S, dtype))
      fn = compile_draft_prefill(self.dp, self.dc, 1, T, cache, self.draft_prefill)
    elif name == "draft":
      P, S = shape
      cache = jax.eval_shape(lambda: KVCache.init(self.dc, 1, S, dtype))
      fn = jax.jit(functools.partial(_draft, config=self.dc, gamma=self.gamma,
                                     sampling=sampling, threshold=self.threshold),
                   donate_argnums=(1,)).lower(
          self.dp, cache, i32(1, P), i32(), jax.ShapeDtypeStruct((self.dc.vocab_size,), bool),
          jax.random.key(0), self.head).compile()
    else:  # verify m drafts: one program per block size, so short blocks cost less
      S, m = shape
      G = self.gamma
      cache = jax.eval_shape(lambda: KVCache.init(self.tc, 1, S, dtype))
      f32 = jax.ShapeDtypeStruct
      Vq = 1 if sampling.greedy else self.dc.vocab_size
      fn = jax.jit(functools.partial(_verify, config=self.tc, sampling=sampling),
                   donate_argnums=(1,)).lower(
          self.tp, cache, i32(), i32(m), i32(), f32((G, Vq), jnp.float32), i32(m), i32(m),
          i32(m), f32((m,), jnp.float32), self._d2t_idx, jax.random.key(0)).compile()
    self._programs[key] = fn
    return fn, time.perf_counter() - t0

  # --- generation ---------------------------------------------------------------------------
  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               eos_token_ids: Sequence[int] = (), max_len: int | None = None,
               stop_strings: Sequence[str] = (), tokenizer=None) -> GenerationResult:
    """Generate like `Decoder.generate` (prompts in target ids); greedy output equals it token
    for token. `stats` is a CrossVocabStats counted in target tokens."""
    prompts = [list(map(int, p)) for p in prompts]
    validate_request(prompts, max_new_tokens, sampling, self.tc, None)
    room = max_new_tokens + self.gamma + 2
    longest = max(len(p) for p in prompts)
    if max_len is not None and longest + room > max_len:
      raise ValueError(f"prompt of {longest} tokens + {max_new_tokens=} + {self.gamma + 2} "
                       f"slots for one crossvocab step = {longest + room} exceeds the cache "
                       f"length {max_len=}")
    B = len(prompts)
    stats = CrossVocabStats(drafted=[], accepted=[])
    res = GenerationResult(tokens=[], finish_reasons=[], prompt_lengths=[len(p) for p in prompts],
                           compile_s=0.0, prefill_s=0.0, decode_s=0.0, steps=0, stats=stats)
    for b, prompt in enumerate(prompts):
      S = cache_slots(len(prompt), room, max_len)
      out = OutputCollector(1, max_new_tokens, eos_token_ids, stop_strings, tokenizer)
      self._generate_row(b, B, prompt, S, out, sampling, jax.random.fold_in(
          jax.random.key(seed), b), res)
      res.tokens.append(out.tokens[0])
      res.finish_reasons.append(out.reasons[0])
    return res

  def _generate_row(self, b, B, prompt, S, out, sampling, key, res):
    st = res.stats
    G = self.gamma
    dtype = compute_dtype(self.tp)
    dprompt = self.prompt_to_drafter(prompt)
    Sd = bucket(len(dprompt) + 2 * (S - len(prompt)) + 2 * G + 16)
    T, Td = min(prompt_bucket(len(prompt)), S), min(prompt_bucket(len(dprompt)), Sd)
    tprefill, c1 = self._program("tprefill", sampling, T, S)
    dprefill, c2 = self._program("dprefill", sampling, Td, Sd)
    res.compile_s += c1 + c2
    # the programs a step needs, compiled before the clock starts (more only on rare paths:
    # a long pending run, a grown drafter cache; their compile time is kept out of decode_s)
    for m in range(G + 1):
      res.compile_s += self._program("verify", sampling, S, m)[1]
    for P in (1, 2):
      res.compile_s += self._program("draft", sampling, P, Sd)[1]
    compile_in_loop = 0.0

    t0 = time.perf_counter()
    tokens = np.zeros((1, T), np.int32)
    tokens[0, :len(prompt)] = prompt
    first, tcache = tprefill(self.tp, jnp.asarray(tokens), jnp.asarray([len(prompt)], jnp.int32),
                             KVCache.init(self.tc, 1, S, dtype), jax.random.fold_in(key, 0))
    dtokens = np.zeros((1, Td), np.int32)
    dtokens[0, :len(dprompt)] = dprompt
    dcache = dprefill(self.dp, jnp.asarray(dtokens), jnp.asarray([len(dprompt)], jnp.int32),
                      KVCache.init(self.dc, 1, Sd, dtype))
    last = int(np.asarray(first)[0])
    out.add(np.asarray([last]))
    self.learn([last])
    pend = self.to_drafter([last])
    ctx = list(dprompt)  # the drafter tokens in its cache
    Ld = len(ctx)
    res.prefill_s += time.perf_counter() - t0

    t_start = time.perf_counter()
    step = 0
    while not out.done.all():
      step += 1
      k = jax.random.fold_in(key, step)
      kd, kv = jax.random.split(k)
      P = bucket(len(pend), minimum=1)
      while Ld + P + G > Sd:  # long drafter spellings: grow its cache
        Sd *= 2
        dcache = _grow(dcache, Sd)
      draft, c = self._program("draft", sampling, P, Sd)
      res.compile_s += c
      compile_in_loop += c
      t0 = time.perf_counter()
      pend_arr = np.zeros((1, P), np.int32)
      pend_arr[0, :len(pend)] = pend
      ds, qd, qs, nd, _, dcache = draft(self.dp, dcache, jnp.asarray(pend_arr),
                                        jnp.int32(len(pend)), self.allowed(), kd, self.head)
      nd = int(nd)
      ds_h, qd_h = np.asarray(ds)[:nd], np.asarray(qd)[:nd]
      t1 = time.perf_counter()
      tids, qprime, nsub, is_ng = self.translate(ds_h, qd_h)
      m = len(tids)
      src = np.zeros(G, np.int32)
      ngram_t = np.full(G, -1, np.int32)
      prefix_t = np.full(G, -1, np.int32)
      qp = np.zeros(G, np.float32)
      drafts = np.zeros(G, np.int32)
      pos = 0
      for i in range(m):
        src[i], drafts[i] = pos, tids[i]
        if is_ng[i]:
          ngram_t[i], qp[i] = tids[i], qprime[i]
          prefix_t[i] = self.d2t[ds_h[pos]] if self.d2t[ds_h[pos]] >= 0 else self.tc.vocab_size
        pos += nsub[i]
      verify = self._program("verify", sampling, S, m)[0]
      t2 = time.perf_counter()
      n, nxt, tcache = verify(self.tp, tcache, jnp.int32(last), jnp.asarray(drafts[:m]),
                              jnp.int32(m), qs, jnp.asarray(src[:m]), jnp.asarray(ngram_t[:m]),
                              jnp.asarray(prefix_t[:m]), jnp.asarray(qp[:m]), self._d2t_idx, kv)
      n, nxt = int(n), int(nxt)
      t3 = time.perf_counter()
      emitted = [int(x) for x in drafts[:n]] + [nxt]
      out.add(np.asarray(emitted + [-1] * (G + 1 - len(emitted)))[None])
      u = sum(nsub[:n])  # drafter sub-tokens accepted
      fed = min(u, nd - 1)  # of them already in the drafter's cache
      ctx += pend + [int(x) for x in ds_h[:fed]]
      Ld = len(ctx)
      dcache = dcache.with_lengths(jnp.asarray([Ld], jnp.int32))
      self.learn(emitted)
      pend = [int(x) for x in ds_h[fed:u]] + self.to_drafter([nxt])
      last = nxt
      row = lambda v: [v if j == b else 0 for j in range(B)]  # noqa: E731
      st.drafted.append(row(m))
      st.accepted.append(row(n))
      st.ngram_drafted.append(row(int(sum(is_ng))))
      st.ngram_accepted.append(row(int(sum(is_ng[:n]))))
      st.drafter_tokens.append(row(nd))
      st.active.append([j == b for j in range(B)])
      st.draft_s += t1 - t0
      st.verify_s += t3 - t2
      st.host_s += (t2 - t1) + (time.perf_counter() - t3)
    res.steps += step
    self.trace = (ctx, pend, dcache)  # the last row's drafter context (tests, debugging)
    res.decode_s += time.perf_counter() - t_start - compile_in_loop


def _grow(cache: KVCache, S: int) -> KVCache:
  """The same entries in a cache of S slots."""
  pad = [(0, 0)] * cache.k.ndim
  pad[2] = (0, S - cache.max_len)
  return KVCache(k=jnp.pad(cache.k, pad), v=jnp.pad(cache.v, pad), lengths=cache.lengths)
