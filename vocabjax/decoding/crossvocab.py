"""Cross-vocabulary speculative decoding (OmniDraft, Ramakrishnan et al. 2025, algorithm 1).

Letters: G drafter tokens per step (gamma), P pending drafter tokens, Vd drafter vocabulary,
V target vocabulary, S cache slots, D drafter hidden size.

The drafter has its own tokenizer. One step: it reads its pending tokens and proposes up to G
drafter tokens (those that cannot reach the target suppressed before q is formed; an acceptance
head may stop early, `vocabjax.decoding.adaptive`); the host translates the run into target
tokens (longest n-gram cache hit first, merged with q' = prod q(d_j), else the direct mapping);
the target verifies them in one forward; the drafter cache is rolled back to the accepted
sub-tokens and fed its spelling of the correction, so it holds exactly the committed text.
Greedy output equals the target's; sampling is exact with direct mapping and with the n-gram
cache under `rule="exact"` (default, `vocabjax.decoding.routes`); `rule="omnidraft"` is the
paper's approximation. `CrossVocabProposer` is a host-hook proposer: its drafter programs run
through the engine's cache, rows in lockstep, translation per row on the host; the n-gram cache
persists across calls, shared by a batch's rows (docs/crossvocab.md).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax import sharding
from vocabjax.decoding.adaptive import acceptance_logit, check_threshold, should_stop
from vocabjax.decoding.autoregressive import abstract_cache, put_cache_row
from vocabjax.decoding.drafter import (check_draft_prefill, lowering_folds_catch_up,
                                       prefill_drafter)
from vocabjax.decoding.engine import (KEY, abstract_arg, bucket, cache_slots, fold_in,
                                      placed_like, prompt_bucket)
from vocabjax.decoding.proposer import (Context, Counted, Drafts, HostPrograms, HostRun,
                                       HostVerifier, Prefilled, RowHandover)
from vocabjax.decoding.routes import Routes
from vocabjax.lowering import lowered, lowering_of, step_lowering
from vocabjax.lowering import while_loop as lowering_while_loop
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import embed_tokens, forward, lm_head, with_mlp_layout
from vocabjax.sampling import NONFINITE, SamplingParams, log_probs
from vocabjax.vocab.translate import (NgramCache, TranslationError, Translator, VocabMap,
                                      check_round_trip)

ROW_DRAWS = 2**32 - 2  # fold_in(the hook's key, this): continuous batching's per-prompt draws
RULES = ("exact", "omnidraft")  # verification of sampled drafts with n-gram merges (module doc)

ROUND_TRIP_TEXTS = (
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Natalia sold 48 clips in April, and half as many in May: 48 / 2 = 24.",
    "  indented\ttabs\n\nand blank lines  ",
    "café naïve – 東京 🙂",
)


class DrafterOutput(NamedTuple):
  """What the drafting program (`draft_tokens`) returns, per row."""

  tokens: jax.Array  # [B, G] int32 drafter ids
  q_tokens: jax.Array  # [B, G] the drafter's probability of each
  q_rows: jax.Array  # [B, G, Vd] its law at each position (sampling), else [B, G, 1]
  drafted: jax.Array  # [B] drafter tokens drafted
  acceptance: jax.Array  # [B, G] the acceptance head's probabilities (1 without one)
  cache: KVCache  # the drafter's cache: its pending tokens and all drafts but the last fed


class HostDrafts(NamedTuple):
  """The host arrays a step reads (`ctx.host`): the target drafts, and where the step builds
  their law in target ids (sampling, not the exact rule) what it builds it from."""

  tokens: Any  # [B, M] target drafts (row b's first n_valid[b] real)
  n_valid: Any  # [B]
  q_rows: Any = None  # [B, G, Vd] the drafter's laws
  source: Any = None  # [B, M] the drafter position of each target draft's first sub-token
  ngram_target: Any = None  # [B, M] the merged target id at an n-gram position, else -1
  prefix_target: Any = None  # [B, M] the first sub-token's own target id there, else -1
  q_prime: Any = None  # [B, M] OmniDraft's q' at an n-gram position


def draft_tokens(dp, cache, pend, n_pend, allowed, key, head, *, config: LlamaLikeConfig,
                 gamma: int, sampling: SamplingParams, threshold: float) -> DrafterOutput:
  """Feed each row's pending drafter tokens, then propose up to `gamma` drafter tokens per row.

  pend [B, P] (row b's first n_pend[b] real), allowed [Vd] bool, head: acceptance head params
  or None. Row b's cache
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
      lp = log_probs(logits, sampling.draft_law)
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

  _, _, _, _, n, cache, (ds, qd, qs, acc) = lowering_while_loop(
      cond, body, (jnp.int32(1), d, stop, p_all, n, cache, bufs), lowering_of(dp))
  return DrafterOutput(tokens=ds, q_tokens=qd, q_rows=qs, drafted=n, acceptance=acc,
                       cache=cache)


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
  is_ngram = ngram_t >= 0
  qt = qt.at[rows, jnp.where(is_ngram, ngram_t, V)].add(jnp.where(is_ngram, qprime, 0.0))
  qt = qt.at[rows, jnp.where(is_ngram, prefix_t, V)].add(jnp.where(is_ngram, -qprime, 0.0))
  return jnp.maximum(qt[:, :V], 0.0)


@dataclasses.dataclass
class DraftStep:
  """One step's drafting on the host, kept until the step's verdict is read (`_commit_row`)."""

  tokens: np.ndarray  # [B, G] the drafter's tokens
  drafted: np.ndarray  # [B] how many each row drafted
  subtokens: list  # per row, per target draft: the drafter tokens it spans
  merged: list  # per row, per target draft: whether the n-gram cache merged it
  plans: list  # per row: the exact rule's planned positions (`routes.Routes.plan`), or []
  q_rows: Any  # [B, G, Vd] the drafter's laws (the exact rule's host verification), or None
  live: np.ndarray  # [B] bool: rows whose verdict is still to be read
  draft_s: float  # seconds the drafting program took


@dataclasses.dataclass
class DrafterRun:
  """The drafter's state over one generate call (from `host_start` to `host_end`), per row
  where a list."""

  prompts: list  # each row's prompt spelled in drafter tokens
  slots: int  # the drafter cache's slots (doubled when long spellings need more)
  prompt_block: int  # its prefill's prompt block
  min_pending: int  # the smallest pending block its drafting program takes
  rngs: list  # the exact rule's host draws
  steps: int = 0
  started: int = 0  # prompts started by continuous batching's hand-overs
  step: DraftStep | None = None  # the last step's drafting, until its verdict is read
  cache: KVCache | None = None  # [B, slots] the drafter's KV cache
  seen: list = dataclasses.field(default_factory=list)  # committed target tokens read
  pending: list = dataclasses.field(default_factory=list)  # drafter tokens not yet fed
  context: list = dataclasses.field(default_factory=list)  # drafter tokens in its cache


class CrossVocabProposer(HostPrograms, RowHandover, HostVerifier, Counted):
  """A drafter with another tokenizer (module doc): its drafting and translation in the host
  hook, target drafts into the engine's step.

  `ngram=False` is the direct-mapping (UAG) baseline; `acceptance_head` (params of
  `vocabjax.decoding.adaptive`) with `stop_threshold` makes the draft length adaptive. `rule`:
  how sampled drafts with n-gram merges are verified, "exact" (lossless, on the host) or
  "omnidraft" (the paper's approximation; module doc). Greedy decoding and direct mapping are
  exact either way. `draft_prefill`: the drafter's prompt prefill precision, as for a chain
  drafter (`vocabjax.decoding.drafter.compile_draft_prefill`).
  """

  method = "crossvocab"
  host_sizable = False  # its draft length is the drafter's (gamma, or the acceptance head's)
  host_step_programs = ("draft",)
  host_prefill_programs = ("dprefill",)

  def __init__(self, draft_params, draft_config: LlamaLikeConfig,
               target_config: LlamaLikeConfig, *, target_tokenizer, draft_tokenizer,
               gamma: int = 4, ngram: bool = True, vocab_map: VocabMap | None = None,
               min_overlap: float = 0.1, acceptance_head: dict | None = None,
               stop_threshold: float = 0.5,
               round_trip_texts: Sequence[str] = ROUND_TRIP_TEXTS, draft_prefill: str = "bf16",
               rule: str = "exact"):
    check_draft_prefill(draft_prefill)
    if rule not in RULES:
      raise ValueError(f"unknown crossvocab sampling rule {rule!r}; choose one of {RULES}")
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
    self.rule, self.draft_prefill = rule, draft_prefill
    self.target_config, self.draft_config = target_config, draft_config
    self.gamma, self.use_ngram = gamma, ngram
    self.drafted_per_step = gamma  # target drafts per step, at most (one per drafter token)
    self.extra_slots = gamma + 2  # target cache slots one step may write past max_new_tokens
    self.draft_params, self.head, self.threshold = draft_params, acceptance_head, stop_threshold
    V = target_config.vocab_size
    # the step's params: each drafter id's target id (V where none), for the law in target ids
    self.params = {"d2t_idx": jnp.asarray(np.where(self.d2t >= 0, self.d2t, V), jnp.int32)}
    self.mesh, self.lowering = None, None
    self.reset_ngram()
    self.trace = None

  def key(self):
    return ("crossvocab", self.draft_config, self.gamma, self.threshold, self.head is not None,
            self.use_ngram, self.rule, self.draft_prefill)

  # --- placement ---------------------------------------------------------------------------
  def prepare(self, *, layout: str, lowering, mesh=None) -> None:
    del layout  # the drafter runs one token at a time but its pending block: [out, in]
    self.lowering, self.mesh = lowering, mesh
    self.draft_params = with_mlp_layout(self.draft_params, "out_in")

  def place(self, mesh, target_config) -> None:
    self.draft_params = sharding.shard_params(self.draft_params, self.draft_config, mesh)
    self.params = sharding.replicate(self.params, mesh)
    self.head = self._replicated(self.head)

  def _replicated(self, tree):
    """Small arrays (the acceptance head, the allowed tokens) copied to every device."""
    return tree if self.mesh is None or tree is None else sharding.replicate(tree, self.mesh)

  def set_drafter(self, draft_params, head: dict | None = None) -> None:
    """Swap in updated drafter weights (online distillation); same shapes, no recompilation."""
    dp = with_mlp_layout(draft_params, "out_in")
    self.draft_params = dp if self.mesh is None else sharding.shard_params(
        dp, self.draft_config, self.mesh)
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

  # --- the step (traced in the engine's program) --------------------------------------------
  def _exact(self, sampling: SamplingParams) -> bool:
    return not sampling.greedy and self.use_ngram and self.rule == "exact"

  def verifies_on_host(self, sampling: SamplingParams) -> bool:
    """The exact rule's walk down the n-gram trie runs on the host (`routes.verify`)."""
    return self._exact(sampling)

  def _blocks(self) -> list[int]:
    """Verification blocks M a step may meet: powers of two up to gamma (rows pad past their
    m), so that at most log2(gamma) + 2 step programs are compiled, not gamma + 1."""
    return sorted({min(bucket(m, minimum=1), self.gamma) for m in range(1, self.gamma + 1)})

  def host_shapes(self, B: int = 1, sampling: SamplingParams | None = None):
    sampling = sampling or SamplingParams(temperature=0.0)
    out = []
    for M in self._blocks():
      shapes = ((B, M), (B,))
      if not sampling.greedy and not self._exact(sampling):  # the law, built in the step
        f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
        shapes += (f32(B, self.gamma,
                       self.draft_config.vocab_size), (B, M), (B, M), (B, M), f32(B, M))
      out.append(shapes)
    return out

  def host_caches(self) -> dict:
    return {"drafter": self.draft_config}

  def prefill(self, params, target_params, pre: Prefilled):
    return ()  # its state is the host's (its own cache, its pending tokens)

  def propose(self, params, state, ctx: Context, key, *, sampling: SamplingParams, keep=None):
    """The host's target drafts [B, M] (row b's first m[b] real); sampling with the verifier
    on the device: q over the target vocabulary per position, the drafter's q row of the
    draft's first sub-token (qs[b, src]) scattered through the direct map, at an n-gram
    position q' added at the merged token and taken from the prefix sub-token's own target
    token (eq. 2), clipped at 0 (module doc)."""
    host = HostDrafts(*ctx.host)
    q = None
    if host.q_rows is not None:
      q_rows = jnp.take_along_axis(host.q_rows, host.source[..., None], axis=1)  # [B, M, Vd]
      q = jax.vmap(translated_q, in_axes=(0, None, 0, 0, 0, None))(
          q_rows, params["d2t_idx"], host.ngram_target, host.prefix_target, host.q_prime,
          self.target_config.vocab_size)
    return Drafts(tokens=host.tokens, q=q, n_valid=host.n_valid), state

  def commit(self, params, state, ctx: Context, drafts: Drafts, verdict):
    return state

  # --- its own programs (the drafter's prefill and drafting loop) ---------------------------
  def lower_host(self, name: str, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    """"dprefill": the drafter's prefill of a [B, T] block into S slots; "draft": a one-token
    pending block and gamma drafts over S slots."""
    return self._lowered(name, sampling, B, (T, S) if name == "dprefill" else (1, S), dtype)

  def _cache(self, B: int, S: int, dtype, abstract: bool = False):
    """An empty drafter cache (or its shapes, for lowering), on the mesh: rows over "data"."""
    if abstract:
      cache = abstract_cache(self.draft_config, B, S, dtype, self.mesh)
      return cache if self.mesh is not None else placed_like(cache, self.draft_params)
    cache = KVCache.init(self.draft_config, B, S, dtype)
    return cache if self.mesh is None else sharding.shard_cache(cache, self.draft_config, self.mesh)

  def _lowered(self, name, sampling, B, shape, dtype):
    i32 = lambda *s: abstract_arg(s, jnp.int32, B=B, mesh=self.mesh,  # noqa: E731
                                  like=self.draft_params, rows=False)
    key = abstract_arg(KEY.shape, KEY.dtype, B=B, mesh=self.mesh, like=self.draft_params,
                       rows=False)
    if name == "dprefill":
      T, S = shape
      lw = self.lowering.replace(bf16_blocks=self.draft_prefill == "bf16")
      fn = functools.partial(prefill_drafter, config=self.draft_config)
      return jax.jit(lowered(fn, lw), donate_argnums=(3,)).lower(
          self.draft_params, i32(B, T), i32(B), self._cache(B, S, dtype, abstract=True))
    if name != "draft":
      raise ValueError(f"crossvocab has no program {name!r}")
    P, S = shape
    fn = lowered(
        functools.partial(draft_tokens, config=self.draft_config,
                          gamma=self.gamma, sampling=sampling, threshold=self.threshold),
        step_lowering(self.lowering))
    cache = self._cache(B, S, dtype, abstract=True)
    allowed = abstract_arg((self.draft_config.vocab_size,), jnp.bool_, B=B, mesh=self.mesh,
                           like=self.draft_params, rows=False)
    args = (self.draft_params, cache, i32(B, P), i32(B), allowed, key, self.head)
    if self.mesh is None:
      return jax.jit(fn, donate_argnums=(1,)).lower(*args)
    # the cache keeps its sharding, the other outputs come back replicated (for the host)
    cache_sh = jax.tree.map(lambda x: x.sharding, cache)
    rep = sharding.replicated(self.mesh)
    out = jax.tree.map(lambda x: cache_sh if isinstance(x, KVCache) else rep,
                       jax.eval_shape(fn, *args), is_leaf=lambda x: isinstance(x, KVCache))
    return jax.jit(fn, donate_argnums=(1,), out_shardings=out).lower(*args)

  def _program(self, name: str, B: int, *shape):
    run = self._run
    return run.program(name, (B, *shape, jnp.dtype(run.dtype).name),
                       lambda: self._lowered(name, run.sampling, B, shape, run.dtype).compile())

  def _lengths(self, cache: KVCache, lengths) -> KVCache:
    """`cache` with the host's lengths, placed as its own lengths are."""
    arr = jnp.asarray(lengths, jnp.int32)
    if self.mesh is not None:
      arr = jax.device_put(arr, cache.lengths.sharding)
    return cache.with_lengths(arr)

  def _placed(self, cache: KVCache) -> KVCache:
    """`cache` with the sharding the programs were compiled for (a prefill's or a grown
    cache's layout may differ; nothing moves when it already has it)."""
    return cache if self.mesh is None else sharding.shard_cache(cache, self.draft_config, self.mesh)

  # --- the host hook ------------------------------------------------------------------------
  def host_start(self, prompts, run: HostRun) -> None:
    """The drafter's spelling of each prompt, its cache size, and its programs compiled: the
    prefill, and the drafting loop for one- and two-token pending blocks (a longer pending
    run or a grown cache compiles when first met)."""
    self._run, B, G = run, run.B, self.gamma
    spelled = [self.prompt_to_drafter(p) for p in prompts]
    # the drafter's cache: each row's own need (its drafter prompt + twice its target room, as
    # one row alone would get), the largest of them; not the longest drafter prompt + twice the
    # batch's room over the shortest target prompt, which mixed prompt lengths inflate
    slots = bucket(max(len(d) + 2 * (cache_slots(len(p), run.room, run.max_len) - len(p))
                       for p, d in zip(prompts, spelled)) + 2 * G + 16)
    prompt_block = min(prompt_bucket(max(len(d) for d in spelled)), slots)
    # the pending block is padded to 2 tokens at least where a two-token call costs about a
    # one-token call (the CPU kernel, any GPU/TPU: `fold_catch_up`), so one program serves
    # the usual one- and two-token steps; else 1- and 2-token programs
    min_pending = 2 if lowering_folds_catch_up(self.lowering) else 1
    if not run.continuous:  # (continuous batching: one-row prefills, when first met)
      self._program("dprefill", B, prompt_block, slots)
    for P in range(min_pending, 3):
      self._program("draft", B, P, slots)
    self._state = DrafterRun(prompts=spelled, slots=slots, prompt_block=prompt_block,
                             min_pending=min_pending,
                             rngs=[self._rng(fold_in(run.key, b)) for b in range(B)])
    if run.continuous:  # rows filled by `host_swap`
      st = self._state
      st.cache = self._placed(self._cache(B, slots, run.dtype))
      st.seen, st.pending, st.context = [0] * B, [[] for _ in range(B)], [[] for _ in range(B)]

  @staticmethod
  def _rng(key) -> np.random.Generator:
    """The exact rule's host draws for a row, seeded from `key`."""
    return np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())

  def host_swap(self, b: int, ended, started) -> None:
    """Continuous batching: the ended prompt's last verdict read (as `host_end` reads every
    row's), then the started one's spelling prefilled alone into row b of the drafter's cache,
    its first token pending, its draws its own. A row left idle keeps its last prompt's
    drafter tokens, pending tokens and cache row in `trace` (tests check the cache; no device
    work on a hand-over)."""
    st, run = self._state, self._run
    if ended is not None and st.step is not None:
      self._commit_row(b, ended)
    if started is None:
      if ended is not None:
        st.cache = self._lengths(st.cache, [len(x) for x in st.context])
        self.trace = (st.context[b], st.pending[b], st.cache.rows(b, b + 1))
      return
    spelled = self.prompt_to_drafter([int(t) for t in started[:-1]])
    T = min(prompt_bucket(len(spelled)), st.slots)  # (st.slots holds every prompt's need)
    tokens = np.zeros((1, T), np.int32)
    tokens[0, :len(spelled)] = spelled
    dprefill = self._program("dprefill", 1, T, st.slots)
    row = dprefill(self.draft_params, jnp.asarray(tokens), jnp.asarray([len(spelled)], jnp.int32),
                   self._cache(1, st.slots, run.dtype))
    st.cache = self._placed(put_cache_row(st.cache, row, b))
    # a non-finite first token is the collector's error (naming its prompt): nothing to spell
    first = int(started[-1]) if started[-1] != NONFINITE else 0
    self.learn([first])
    st.seen[b] = len(started)
    st.pending[b] = self.to_drafter([first])
    st.context[b] = list(spelled)
    st.rngs[b] = self._rng(fold_in(fold_in(run.key, ROW_DRAWS), st.started))
    st.started += 1

  def host_begin(self, history) -> None:
    """The drafter's prefill over its spelling of the prompts; each row's first target token
    becomes its pending drafter tokens."""
    st, run = self._state, self._run
    B = len(history)
    tokens = np.zeros((B, st.prompt_block), np.int32)
    for b, d in enumerate(st.prompts):
      tokens[b, :len(d)] = d
    dprefill = self._program("dprefill", B, st.prompt_block, st.slots)
    st.cache = self._placed(dprefill(self.draft_params, jnp.asarray(tokens),
                                     jnp.asarray([len(d) for d in st.prompts], jnp.int32),
                                     self._cache(B, st.slots, run.dtype)))
    # a non-finite first token is the collector's error (naming its row): nothing to spell
    first = [int(h[-1]) if h[-1] != NONFINITE else 0 for h in history]
    self.learn(first)
    st.seen = [len(h) for h in history]
    st.pending = [self.to_drafter([x]) for x in first]
    st.context = [list(d) for d in st.prompts]

  def _commit(self, history) -> None:
    """The last step's verdict, read off the committed tokens: the drafter's cache keeps the
    accepted sub-tokens it holds, the correction / bonus token's spelling becomes pending,
    the emitted tokens teach the n-gram cache."""
    st = self._state
    if st.step is None:
      return
    for b, h in enumerate(history):
      self._commit_row(b, h)
    st.step = None

  def _commit_row(self, b: int, h) -> None:
    """`_commit` of row b (committed tokens `h`); the row leaves the step's verdict."""
    st = self._state
    step = st.step
    new, st.seen[b] = [int(t) for t in h[st.seen[b]:]], len(h)
    if not step.live[b]:  # frozen: its caches do not advance
      return
    step.live[b] = False
    n = len(new) - 1
    accepted = sum(step.subtokens[b][:n])  # drafter sub-tokens accepted
    fed = min(accepted, int(step.drafted[b]) - 1)  # of them already in the drafter's cache
    st.context[b] += st.pending[b] + [int(x) for x in step.tokens[b, :fed]]
    self.learn(new)
    st.pending[b] = ([int(x) for x in step.tokens[b, fed:accepted]]
                     + self.to_drafter([new[-1]]))

  def host_block(self, history, active):
    st, run = self._state, self._run
    self._commit(history)
    B, G = len(history), self.gamma
    sampling = run.sampling
    exact = self._exact(sampling)
    st.cache = self._lengths(st.cache, [len(x) for x in st.context])
    P = bucket(max(len(x) for x in st.pending), minimum=st.min_pending)
    while max(map(len, st.context)) + P + G > st.slots:  # long spellings: grow its cache
      st.slots *= 2
      st.cache = self._placed(_grow(st.cache, st.slots))
    draft = self._program("draft", B, P, st.slots)
    st.steps += 1
    t0 = time.perf_counter()
    pend = np.zeros((B, P), np.int32)
    for b, x in enumerate(st.pending):
      pend[b, :len(x)] = x
    out = draft(self.draft_params, st.cache, jnp.asarray(pend),
                jnp.asarray([len(x) for x in st.pending], jnp.int32), self.allowed(),
                fold_in(run.key, B + st.steps), self.head)
    st.cache = out.cache
    tokens, q_tokens = np.asarray(out.tokens), np.asarray(out.q_tokens)
    drafted = np.asarray(out.drafted)
    draft_s = time.perf_counter() - t0
    # translation, per row: the exact rule's planned positions, or OmniDraft's q' of each
    # translated draft; per target draft the drafter tokens it spans and whether it is merged
    plans, q_primes, targets, subtokens, merged = [], [], [], [], []
    for b in range(B):
      if exact:
        positions = self.routes.plan(tokens[b], drafted[b])
        kept = [x for x in positions if x.fed]
        plans.append(positions)
        targets.append([x.target for x in kept])
        subtokens.append([x.end - x.start for x in kept])
        merged.append([len(x.node) > 1 for x in kept])
        q_primes.append([])
      else:
        t_b, qp_b, ns_b, ng_b = self.translate(tokens[b, :drafted[b]],
                                               q_tokens[b, :drafted[b]])
        q_primes.append(qp_b)
        targets.append(t_b)
        subtokens.append(ns_b)
        merged.append(ng_b)
      if not active[b]:  # frozen: nothing to verify
        targets[b], subtokens[b], merged[b] = [], [], []
    m = np.asarray([len(t) for t in targets], np.int32)
    M = next(x for x in self._blocks() if x >= max(int(m.max()), 1))
    drafts = np.zeros((B, M), np.int32)
    for b in range(B):
      drafts[b, :m[b]] = targets[b]
    st.step = DraftStep(tokens=tokens, drafted=drafted, subtokens=subtokens, merged=merged,
                        plans=plans, q_rows=out.q_rows if exact else None,
                        live=np.asarray(active, bool), draft_s=draft_s)
    if sampling.greedy or exact:
      return (drafts, m), m  # HostDrafts' tokens and n_valid alone: the law is not built
    source = np.zeros((B, M), np.int32)
    ngram_target = np.full((B, M), -1, np.int32)
    prefix_target = np.full((B, M), -1, np.int32)
    q_prime = np.zeros((B, M), np.float32)
    for b in range(B):
      pos = 0
      for i in range(m[b]):
        source[b, i] = pos
        if merged[b][i]:
          ngram_target[b, i], q_prime[b, i] = targets[b][i], q_primes[b][i]
          first_sub = tokens[b, pos]
          prefix_target[b, i] = (self.d2t[first_sub] if self.d2t[first_sub] >= 0
                                 else self.target_config.vocab_size)
        pos += subtokens[b][i]
    return HostDrafts(drafts, m, out.q_rows, source, ngram_target, prefix_target, q_prime), m

  def host_verify(self, probs: np.ndarray, active):
    """The exact rule: each row's planned positions verified level by level against the
    drafter's branch laws (`routes.verify`). A position whose target probabilities are not
    finite ends the row there, flagged (the collector's error names it)."""
    st, B = self._state, probs.shape[0]
    step = st.step
    q_rows = np.asarray(step.q_rows)
    n, nxt = np.zeros(B, np.int64), np.zeros(B, np.int64)
    for b in np.flatnonzero(active):
      kept = sum(x.fed for x in step.plans[b])
      p = probs[b, :kept + 1]
      finite = np.isfinite(p).all(axis=-1)
      bad = int(np.argmin(finite)) if not finite.all() else None
      if bad is not None:
        p = np.where(finite[:, None], p, 1.0 / p.shape[-1])
      n[b], nxt[b] = self.routes.verify(p, step.plans[b], step.tokens[b],
                                        q_rows[b, :step.drafted[b]], st.rngs[b])
      if bad is not None and bad <= n[b]:
        n[b], nxt[b] = bad, NONFINITE
    return n, nxt

  def host_end(self, history) -> None:
    """The last step's verdict (as the next step would read it); `trace` keeps the last row's
    drafter tokens, pending tokens and cache rows (tests check the cache against them)."""
    self._commit(history)
    st = self._state
    b = len(history) - 1
    st.cache = self._lengths(st.cache, [len(x) for x in st.context])
    self.trace = (st.context[b], st.pending[b], st.cache.rows(b, b + 1))

  # --- statistics ---------------------------------------------------------------------------
  def record_step(self, stats, active, counts, host_counts, keep) -> None:
    step, n = self._state.step, counts["accepted"]
    stats.add("ngram_drafted", [sum(x) if a else 0 for x, a in zip(step.merged, active)])
    stats.add("ngram_accepted", [sum(x[:k]) if a else 0
                                 for x, k, a in zip(step.merged, n, active)])
    stats.add("drafter_tokens", [int(x) if a else 0 for x, a in zip(step.drafted, active)])
    stats.time("draft_s", step.draft_s)

  def record(self, stats) -> dict:
    """Totals for an eval record: the translator's counts, the drafter's, the target's and
    the host's seconds (translation and host verification), and the n-gram cache."""
    tot = lambda rows: int(sum(map(sum, rows)))  # noqa: E731
    c = stats.counts
    draft_s = stats.seconds.get("draft_s", 0.0)
    return {"ngram_drafted": tot(c.get("ngram_drafted", [])),
            "ngram_accepted": tot(c.get("ngram_accepted", [])),
            "drafter_tokens": tot(c.get("drafter_tokens", [])), "verifications": stats.num_steps,
            "verify_s": round(stats.step_s, 4), "translate_s": round(stats.host_s - draft_s, 4),
            "ngram_cache": self.ngram.stats}


def ngram_hits_per_step(stats) -> float:
  """Merged (n-gram) target drafts proposed per verification of a crossvocab run."""
  steps = stats.num_steps
  return sum(map(sum, stats.counts.get("ngram_drafted", []))) / steps if steps else float("nan")


def _grow(cache: KVCache, S: int) -> KVCache:
  """The same entries in a cache of S slots (a sliding layers' ring keeps its size)."""
  pad = [(0, 0)] * cache.k.ndim
  pad[2] = (0, S - cache.max_len)
  return cache.replace(k=jnp.pad(cache.k, pad), v=jnp.pad(cache.v, pad))
