"""Tree speculative decoding with an EAGLE-style head (EAGLE-2 trees, EAGLE-3 heads).

Letters: B batch, d tree depth, P = d + 1 pending entries, Lf*Dt fused target feature width (Lf fused layers),
D head width (= the target's hidden size), S cache slots, V target vocabulary.

The head drafts from the target's own features (`vocabjax.models.eagle`). Its entry at position
p pairs the token x_{p+1} with the target's feature f_p of position p and predicts x_{p+2}; at
deeper tree levels a node's entry pairs its token with its parent entry's output instead of a
target feature. Positions and attention are the target's: entry p sits at slot p of the head's
one-layer KV cache, RoPE position p.

Feature hand-over (the engine's side of EAGLE): the target's verification forward captures the
fused layers' outputs at every tree node; after acceptance the path's features (root and n
accepted nodes) become the head's next pending entries, paired with the tokens that follow them
(the n accepted tokens and the target's next token). So the head never needs a second target
pass, and its cache stays exactly one entry per committed position.

Cache invariants at the start of a step (Nt = target cache length, all per row):
  target: every committed token except `last` (Nt entries);
  head: entries 0 .. Nt - 1 - pend_count; the pend_count pending entries (tokens, features)
    complete it up to entry Nt - 1 = (last, f_{Nt-1}), whose output gives the root's children.

Vocabulary: by default the head's own LM head over its Vd tokens (d2t maps them to target ids,
a static subset as in FR-Spec / EAGLE-3). `lm_head="target"` uses the target's frozen LM head
on the head's normed output instead, and every drafter vocabulary policy applies to it
(`draft_vocab`: a VocabTrim / FR-Spec subset or a SpecVocab ranker of the target's head). A
head with a full-V LM head (Vd = V) takes a `draft_vocab` over its own head as well.

Greedy output equals the target's greedy output token for token; sampling uses the tree's
lossless verification of deterministically chosen drafts (`verify_tree_sampling`), which needs
no drafting distribution, so the head cannot bias the output.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from vocabjax.decoding.autoregressive import GenerationResult, prefill_in_bf16
from vocabjax.decoding.engine import host_loop
from vocabjax.decoding.pld import LookupStats, check_lookup, trie_block
from vocabjax.sampling import SamplingParams, sample
from vocabjax.decoding.speculative import DraftVocab, SpecStats, SpeculativeDecoder
from vocabjax.decoding.tree import TreeBounds, TreeParams, grow_tree, merge_nodes, verify_tree
from vocabjax import sharding
from vocabjax.lowering import lowered, lowering_of, with_lowering
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import EagleConfig, eagle_forward, fuse_features, head_output
from vocabjax.models.llamalike import (compute_dtype, forward_features, is_int8, lm_head,
                                       lm_head_weight, rms_norm, with_mlp_layout)
from vocabjax.vocab.subset import HeadRows

HEAD_KEY = "eagle"  # the head's own params inside the decoder's drafter pytree
GATE_KEY = "gate"  # a gated decoder's threshold (f32 scalar) inside the drafter pytree


@struct.dataclass
class EagleState:
  """Loop state of EAGLE tree decoding; fixed shapes, one row per sequence."""

  target_cache: KVCache
  head_cache: KVCache  # one layer; entries 0 .. Nt - 1 - pend_count
  last: jax.Array  # [B] newest committed token: the next tree's root
  pend_tokens: jax.Array  # [B, P] tokens of the pending entries, left-aligned
  pend_feats: jax.Array  # [B, P, Lf*Dt] the target features paired with them
  pend_count: jax.Array  # [B] int32 in 1 .. P


def _norm(dp, x, config: EagleConfig):
  """What the drafting LM head reads of the head's output (`models.eagle.head_output`)."""
  return head_output(dp[HEAD_KEY], x, config=config)


def _head(dp) -> dict:
  """The head's own params, lowered as the drafter pytree `dp` that holds them says."""
  return with_lowering(dp[HEAD_KEY], lowering_of(dp))


def _head_root(dp, state: EagleState, *, head_config):
  """Read the pending entries into the head's cache: (the root entry's output [B, D], the
  cache with its committed entries)."""
  hc = head_config
  cache = state.head_cache
  L0 = cache.lengths
  P = state.pend_tokens.shape[1]
  x, cache = eagle_forward(_head(dp), dp["embed"], state.pend_tokens,
                           fuse_features(_head(dp), state.pend_feats),
                           L0[:, None] + jnp.arange(P)[None], cache, config=hc)
  x_root = jnp.take_along_axis(x, (state.pend_count - 1)[:, None, None], axis=1)[:, 0]
  return x_root, cache.with_lengths(L0 + state.pend_count)


def _grow(dp, x_root, cache, *, head_config, tree: TreeParams, policy, root=None):
  """Grow the head's tree from the root entry's output: (node tokens, parent, depth [B, n],
  the head cache with its committed entries). `root`: the policy's output there, if computed."""
  hc = head_config

  def expand(params, tok, parent_x, positions, cache, prefix_mask):
    k = tok.shape[1]
    x, cache = eagle_forward(_head(params), params["embed"], tok, parent_x, positions, cache,
                             jnp.eye(k, dtype=jnp.bool_)[None], config=hc,
                             prefix_mask=prefix_mask)
    return _norm(params, x, hc), x, cache

  return grow_tree(dp, _norm(dp, x_root, hc), x_root, cache, tree=tree, policy=policy,
                   expand=expand, root=root)


def root_confidence(dp, x_root, *, head_config, policy) -> jax.Array:
  """[B] the head's top probability for the root's first child (its drafting distribution
  over the policy's candidates): EAGLE-2's confidence, which tracks the chance the target
  accepts that child."""
  return _top_probability(_root_policy(dp, x_root, head_config, policy)[1])


def _root_policy(dp, x_root, head_config, policy):
  """The drafting policy's output (candidate ids, logits) at the root entry."""
  return policy(dp, _norm(dp, x_root, head_config))


def _top_probability(logits) -> jax.Array:
  return jnp.exp(jnp.max(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), axis=-1))


def _committed(state: EagleState, v, hcache) -> EagleState:
  """The next step's state: the verified path's tokens and features become pending entries."""
  return EagleState(target_cache=v.target_cache, head_cache=hcache, last=v.next,
                    pend_tokens=v.pend_tokens,
                    pend_feats=v.features.astype(state.pend_feats.dtype),
                    pend_count=v.accepted + 1)


def eagle_step(target_params, dp, state: EagleState, key, *, target_config, head_config,
               tree: TreeParams, sampling: SamplingParams, policy, gated: bool = False):
  """Read the pending entries, grow a tree with the head, verify it with feature capture.

  `gated` (EAGLE-2's confidence, used as a gate): a row drafts only when the head's top
  probability at its root (`root_confidence`) reaches `dp[GATE_KEY]`, the threshold (a runtime
  f32 scalar: every threshold runs the same compiled program); the other rows' nodes are
  dropped (they verify their root alone: a plain step that still captures the features the
  head reads next). When no row drafts, the step skips the tree's growth and verifies the
  roots alone (one target position instead of n + 1): where the head would rarely be accepted
  the step costs about a plain one. Greedy output and sampling stay exact (the gate reads the
  context only).

  Returns (state, emitted [B, d + 1] with -1 after the emitted tokens, accepted [B]), and when
  `gated` also which rows drafted [B] (bool).
  """
  x_root, cache = _head_root(dp, state, head_config=head_config)
  keep, root = _confident(dp, x_root, head_config, policy, gated)

  def drafted():
    node_tok, parent, depth, hcache = _grow(dp, x_root, cache, head_config=head_config,
                                            tree=tree, policy=policy, root=root)
    node_tok, parent, depth = _drop_rows(node_tok, parent, depth, keep)
    v = verify_tree(target_params, state.last, node_tok, parent, depth, state.target_cache,
                    key, target_config=target_config, tree=tree, sampling=sampling,
                    feature_layers=head_config.feature_layers)
    return _committed(state, v, hcache), v.emitted, v.accepted

  if keep is None:
    return drafted()

  def plain():
    v = verify_tree(target_params, state.last, *_no_nodes(state.last), state.target_cache, key,
                    target_config=target_config, tree=TreeBounds(1, tree.depth),
                    sampling=sampling, feature_layers=head_config.feature_layers)
    return _committed(state, v, cache), v.emitted, v.accepted

  # XLA runs the taken branch only
  return (*jax.lax.cond(jnp.any(keep), drafted, plain), keep)


def _confident(dp, x_root, head_config, policy, gated: bool):
  """(keep [B] bool: rows whose root confidence reaches the threshold `dp[GATE_KEY]`, the
  policy's output at the root, which the tree's growth reuses); (None, None) when not gated."""
  if not gated:
    return None, None
  root = _root_policy(dp, x_root, head_config, policy)
  return _top_probability(root[1]) >= dp[GATE_KEY], root


def _drop_rows(tok, parent, depth, keep):
  """The tree with the nodes of rows where `keep` [B] is False made padding (their own parents,
  never reached from the root, as `merge_nodes`'s padding); all of it when keep is None."""
  if keep is None:
    return tok, parent, depth
  own = jnp.arange(1, parent.shape[1] + 1, dtype=parent.dtype)[None]
  return (tok, jnp.where(keep[:, None], parent, own),
          jnp.where(keep[:, None], depth, jnp.ones_like(depth)))


def _no_nodes(last):
  """An empty tree (tokens, parent, depth [B, 0])."""
  e = jnp.zeros((last.shape[0], 0), jnp.int32)
  return e, e, e


def eagle_lookup_step(target_params, dp, state: EagleState, key, lk_tok, lk_parent, lk_depth, *,
                      target_config, head_config, tree: TreeParams, bounds: TreeBounds,
                      sampling: SamplingParams, policy, gated: bool = False):
  """`eagle_step` with prompt-lookup nodes added to the head's tree: lk_tok / lk_parent /
  lk_depth [B, m] a trie of context continuations under the same root (`merge_nodes`'s form;
  padding nodes are their own parents), merged into the head's tree and verified with it in
  one target forward. `bounds`: the merged tree's most children per node and depth. When
  `gated`, a row whose head is unsure at the root (`eagle_step`) offers the
  lookup's trie alone, as prompt lookup would; when no row drafts, the step verifies the tries
  alone (the roots alone where there is none).

  Returns (state, emitted [B, bounds.depth + 1], accepted [B], accepted nodes that came from the
  lookup [B]), and when `gated` which rows' heads drafted [B] (bool).
  """
  x_root, cache = _head_root(dp, state, head_config=head_config)
  keep, root = _confident(dp, x_root, head_config, policy, gated)

  def drafted():
    node_tok, parent, depth, hcache = _grow(dp, x_root, cache, head_config=head_config,
                                            tree=tree, policy=policy, root=root)
    n_head = node_tok.shape[1]
    node_tok, parent, depth = merge_nodes(*_drop_rows(node_tok, parent, depth, keep),
                                          lk_tok, lk_parent, lk_depth)
    v = verify_tree(target_params, state.last, node_tok, parent, depth, state.target_cache,
                    key, target_config=target_config, tree=bounds, sampling=sampling,
                    feature_layers=head_config.feature_layers)
    from_lookup = (v.path > n_head).sum(axis=1).astype(jnp.int32)  # path: node + 1, 0-padded
    return _committed(state, v, hcache), v.emitted, v.accepted, from_lookup

  if keep is None:
    return drafted()

  def lookup_only():  # the trie is a tree of merge_nodes's form already
    v = verify_tree(target_params, state.last, lk_tok, lk_parent, lk_depth, state.target_cache,
                    key, target_config=target_config,
                    tree=TreeBounds(min(bounds.top_k, lk_tok.shape[1] + 1), bounds.depth),
                    sampling=sampling, feature_layers=head_config.feature_layers)
    return (_committed(state, v, cache), v.emitted, v.accepted,
            (v.path > 0).sum(axis=1).astype(jnp.int32))

  return (*jax.lax.cond(jnp.any(keep), drafted, lookup_only), keep)


def _eagle_prefill(target_params, dp, tokens, prompt_lengths, tcache, hcache, key, *,
                   target_config, head_config, sampling):
  """Target prefill with feature capture, then the head over entries 0 .. P - 2 (tokens
  x_1 .. x_{P-1} with features f_0 .. f_{P-2}); entry P - 1 = (first, f_{P-1}) stays pending."""
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  hidden, tcache, feats = forward_features(target_params, tokens, positions, tcache,
                                           config=target_config,
                                           layers=head_config.feature_layers, fresh=True,
                                           valid_lengths=prompt_lengths)
  tcache = tcache.with_lengths(prompt_lengths)
  last = jnp.take_along_axis(hidden, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]
  first = sample(key, lm_head(target_params, last, config=target_config), sampling)
  shifted = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))  # entry p reads token p + 1
  head = _head(dp)
  _, hcache = eagle_forward(head, dp["embed"], shifted, fuse_features(head, feats), positions,
                            hcache, config=head_config)
  pend_feat = jnp.take_along_axis(feats, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]
  return first, tcache, hcache.with_lengths(prompt_lengths - 1), pend_feat


class EagleDecoder(SpeculativeDecoder):
  """EAGLE-2 dynamic-tree speculative decoding with an EAGLE(-3) head on the target's features.

      dec = EagleDecoder(target_params, target_config, head_params, head_config,
                         tree=TreeParams(top_k=4, depth=4, total_tokens=16))
      res = dec.generate(prompts, max_new_tokens=128)

  `lm_head`: "own" (the head's Vd rows with d2t, default) or "target" (the target's LM head,
  frozen); `draft_vocab` restricts a full-V head (module doc).
  """

  method = "eagle"

  def __init__(self, target_params, target_config: LlamaLikeConfig, head_params,
               head_config: EagleConfig, *, tree: TreeParams = TreeParams(),
               lm_head: str = "own", layout: str = "auto",
               draft_vocab: DraftVocab | None = None, mesh=None, min_confidence: float = 0.0):
    head_config.check_target(target_config)
    if not 0.0 <= min_confidence < 1.0:
      raise ValueError(f"min_confidence={min_confidence} must lie in [0, 1): the head drafts "
                       f"when its top probability at the root reaches it (0: always)")

    if is_int8(target_params):
      raise ValueError("an EAGLE head reads the target's embedding rows and features as "
                       "floats; an int8 target (`quantize_int8`) is not supported: load the "
                       "target in float32 or bfloat16")
    if lm_head not in ("own", "target"):
      raise ValueError(f"lm_head={lm_head!r}: choose 'own' (the head's rows) or 'target'")
    if head_config.kind == "eagle2":
      lm_head = "target"  # an EAGLE-1/2 head's own LM head is the target's (its authors')
    Vd, V = head_config.draft_vocab_size, target_config.vocab_size
    if lm_head == "own" and draft_vocab is not None and Vd != V:
      raise ValueError(f"the head has its own reduced vocabulary of Vd={Vd} tokens (d2t); a "
                       f"draft_vocab restricts a full LM head of V={V} rows: pass "
                       f"lm_head='target' to restrict the target's head instead")
    size = draft_vocab.size if draft_vocab is not None else (Vd if lm_head == "own" else V)
    if size < tree.top_k:
      raise ValueError(f"tree top_k={tree.top_k} exceeds the head's {size} candidate tokens")
    self.hc, self.tree, self.lm_head_source = head_config, tree, lm_head
    # the drafter's pytree: the head, the target's embedding and the LM head the head drafts
    # with; its "config" is the target's with an untied head `lm_head` (what policies read)
    dc = dataclasses.replace(target_config, tie_word_embeddings=False)
    U = lm_head_weight(target_params, target_config) if lm_head == "target" \
        else head_params["lm_head"]
    dp = {HEAD_KEY: head_params, "embed": target_params["embed"], "lm_head": U}
    if min_confidence > 0:  # an input of the step, not a constant: thresholds share programs
      dp[GATE_KEY] = jnp.asarray(min_confidence, jnp.float32)
    if draft_vocab is None and lm_head == "own" and Vd < V:
      # the head's own static subset: its rows, ids = j + d2t
      ids = jnp.arange(Vd, dtype=jnp.int32) + head_params["d2t"].astype(jnp.int32)
      draft_vocab = HeadRows(head_params["lm_head"], ids)
    super().__init__(target_params, target_config, dp, dc, layout=layout,
                     draft_vocab=draft_vocab, mesh=mesh)
    self.drafted_per_step = tree.total_tokens
    self.extra_slots = tree.total_tokens + tree.draft_slots + tree.depth + 2
    self.verify_tokens = tree.total_tokens + 1
    self.pend_width = tree.depth + 1  # P: a step's accepted tokens + the next, at most
    self.min_confidence = float(min_confidence)

  draft_block_calls = True  # the head runs top_k tokens per tree level, as the target's blocks

  @property
  def step_outputs(self) -> int:
    return 4 if self.min_confidence > 0 else 3  # gated: + which rows drafted

  def _with_draft_layout(self, draft_params, layout: str):
    """The head's one decoder layer in `layout` (the embedding and LM head have no MLP)."""
    layer = with_mlp_layout({"layers": [draft_params[HEAD_KEY]["layer"]]}, layout)["layers"][0]
    return {**draft_params, HEAD_KEY: {**draft_params[HEAD_KEY], "layer": layer}}

  def drafter_calls(self):
    t = self.tree
    return [(t.depth + 1, 1)] + [(t.top_k, t.top_k)] * (t.depth - 1)

  def drafter_body(self):
    """(fn(params, tokens, positions, cache) -> output, params, cache config) of the head's
    layer alone (for profiling; the feature input is zeros)."""
    hc = self.hc

    def body(dp, tokens, positions, cache):
      head = _head(dp)
      feats = jnp.zeros(tokens.shape + (hc.fused_width,), dp["embed"].dtype)
      return eagle_forward(head, dp["embed"], tokens, fuse_features(head, feats), positions,
                           cache, config=hc)[0]

    return body, self.dp, hc.layer

  def _step_fn(self, sampling):
    return functools.partial(eagle_step, target_config=self.tc, head_config=self.hc,
                             tree=self.tree, sampling=sampling, policy=self.draft_policy,
                             gated=self.min_confidence > 0)

  def _new_stats(self) -> SpecStats:
    return EagleStats(drafted=[], accepted=[]) if self.min_confidence > 0 else super()._new_stats()

  def _record(self, stats, active, accepted, extra) -> None:
    if self.min_confidence <= 0:
      return super()._record(stats, active, accepted, extra)
    head = extra[0]  # [B] which rows drafted
    stats.drafted.append([self.tree.total_tokens if a and h else 0
                          for a, h in zip(active, head)])
    stats.accepted.append([int(x) if a else 0 for x, a in zip(accepted, active)])
    stats.active.append([bool(a) for a in active])

  def _place_draft(self, draft_params, mesh):
    """On a mesh: the target's embedding split by rows as the target's own, the head (and a
    policy's arrays) replicated."""
    return {k: sharding.shard_rows(v, mesh) if k in ("embed", "lm_head")
            else sharding.replicate(v, mesh)
            for k, v in draft_params.items()}

  def _compile_start(self, sampling, B, T, S, dtype):
    tcache = self._abstract_cache(self.tc, B, S, dtype)
    hcache = self._abstract_cache(self.hc.layer, B, S, dtype)
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    # as plain decoding's prefill: the bf16 GEMM for a bf16 target
    lowering = self.lowering.replace(bf16_blocks=prefill_in_bf16(self.tp))
    prefill = jax.jit(lowered(functools.partial(_eagle_prefill, target_config=self.tc,
                                                head_config=self.hc, sampling=sampling),
                              lowering, argnums=(0, 1)), donate_argnums=(4, 5)).lower(
        self.tp, self.dp, i32(B, T), i32(B), tcache, hcache, jax.random.key(0)).compile()
    P, F = self.pend_width, self.hc.fused_width

    def initial(tc, hc, first, feat):
      return EagleState(target_cache=tc, head_cache=hc, last=first,
                        pend_tokens=jnp.broadcast_to(first[:, None], (B, P)).astype(jnp.int32),
                        pend_feats=jnp.broadcast_to(feat[:, None], (B, P, F)),
                        pend_count=jnp.ones_like(first))

    def start(tokens, lengths, prompt_last, key):
      del prompt_last
      first, tc, hc, feat = prefill(self.tp, self.dp, tokens, lengths,
                                    self._cache(self.tc, B, S, dtype),
                                    self._cache(self.hc.layer, B, S, dtype), key)
      return first, initial(tc, hc, first, feat)

    state = jax.eval_shape(initial, tcache, hcache, i32(B),
                           jax.ShapeDtypeStruct((B, F), dtype))
    return start, state


@dataclasses.dataclass
class EagleStats(LookupStats):
  """SpecStats of an EagleDecoder with `min_confidence`: a row whose head was unsure verifies
  its root alone (`drafted` 0) and still counts as a verification (tau is per verification,
  as prompt lookup's)."""

  def record(self) -> dict:
    """Totals for an eval record: (row) steps where the head drafted, and all verifications."""
    return {"head_steps": sum(1 for row in self.drafted for d in row if d),
            "verifications": len(self.drafted)}


@dataclasses.dataclass
class EagleLookupStats(LookupStats):
  """SpecStats of `EagleLookupDecoder`: `drafted` counts the head's nodes (when it drafted)
  plus the lookup's trie nodes of each step; `lookup_nodes` / `from_lookup` [steps][B] the
  trie nodes offered and the accepted tokens that came from them (the rest came from the
  head's nodes); `head` [steps][B] whether the row's head drafted (always, without
  `min_confidence`)."""

  lookup_nodes: list[list[int]] = dataclasses.field(default_factory=list)
  from_lookup: list[list[int]] = dataclasses.field(default_factory=list)
  head: list[list[bool]] = dataclasses.field(default_factory=list)

  def record(self) -> dict:
    """Totals for an eval record: steps with lookup nodes, tokens accepted from them, steps
    where the head drafted, all verifications."""
    return {"lookup_steps": sum(1 for row in self.lookup_nodes for x in row if x),
            "lookup_nodes": sum(map(sum, self.lookup_nodes)),
            "accepted_from_lookup": sum(map(sum, self.from_lookup)),
            "accepted": sum(map(sum, self.accepted)),
            "head_steps": sum(map(sum, self.head)), "verifications": len(self.drafted)}


class EagleLookupDecoder(EagleDecoder):
  """EAGLE-2 tree of an EAGLE-3 head plus prompt lookup (Saxena 2023) in the same tree.

      dec = EagleLookupDecoder(target_params, target_config, head_params, head_config,
                               tree=TreeParams(4, 4, 16), gamma=4, candidates=1)

  Each step, on the host, the continuations of earlier occurrences of the context's suffix
  n-grams (`pld.lookup_continuations`: up to `candidates` of them, `gamma` tokens each) form a
  trie under the root; in the step program the head grows its tree as `EagleDecoder` does, the
  trie is merged into it (`tree.merge_nodes`: a lookup token that the head also drafted under
  the same parent is one node) and the target verifies both in one forward, capturing its
  features on whichever path it accepts. Where the text copies its context (summaries,
  retrieval answers, edited code) the lookup reaches further than the head; elsewhere the head
  drafts. A step program is compiled per trie size bucket (0, gamma, 2 gamma, ..,
  candidates x gamma nodes; a trie is padded up to its bucket) when the bucket is first met
  (its compile time is reported apart from decoding), so a step without a match verifies the
  head's tree alone.

  Greedy output equals the target's greedy output; sampling stays lossless (every draft is a
  deterministic function of the context: `verify_tree_sampling`'s multi-draft rule). One
  device only (`mesh` is refused).
  """

  method = "eagle_pld"

  def __init__(self, target_params, target_config: LlamaLikeConfig, head_params,
               head_config: EagleConfig, *, tree: TreeParams = TreeParams(), gamma: int = 4,
               max_ngram: int = 3, min_ngram: int = 1, candidates: int = 1,
               lm_head: str = "own", layout: str = "auto",
               draft_vocab: DraftVocab | None = None, mesh=None, min_confidence: float = 0.0):
    if mesh is not None:
      raise ValueError("EAGLE with prompt lookup runs on one device: mesh is not supported "
                       "(use method eagle or pld on a mesh)")
    check_lookup(gamma, max_ngram, min_ngram, candidates)
    super().__init__(target_params, target_config, head_params, head_config, tree=tree,
                     lm_head=lm_head, layout=layout, draft_vocab=draft_vocab,
                     min_confidence=min_confidence)
    self.gamma, self.max_ngram, self.min_ngram = gamma, max_ngram, min_ngram
    self.candidates = candidates
    m = candidates * gamma
    self.buckets = tuple(range(0, m + 1, gamma))
    self.bounds = TreeBounds(top_k=tree.top_k + candidates, depth=max(tree.depth, gamma))
    self.pend_width = self.bounds.depth + 1
    self.drafted_per_step = tree.total_tokens + m
    self.extra_slots = tree.total_tokens + m + tree.draft_slots + self.bounds.depth + 2
    self.verify_tokens = tree.total_tokens + m + 1

  def _step_fn(self, sampling):
    return functools.partial(eagle_lookup_step, target_config=self.tc, head_config=self.hc,
                             tree=self.tree, bounds=self.bounds, sampling=sampling,
                             policy=self.draft_policy, gated=self.min_confidence > 0)

  def programs(self, sampling: SamplingParams, B: int, T: int, S: int, dtype):
    """(start, step, the start's compile seconds) for one shape; `step(m)` is (the step for
    trie bucket m, seconds spent compiling it now): a bucket's step compiles when the bucket
    is first met (0 when it was compiled before)."""
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    name = jnp.dtype(dtype).name
    (start, state), seconds = self._programs.get(
        ("start", sampling, B, T, S, name),
        lambda: self._compile_start(sampling, B, T, S, dtype))

    def step(m: int):
      if m not in self.buckets:
        raise ValueError(f"trie buckets are {self.buckets}, got m={m}")
      return self._programs.get(("step", sampling, B, S, name, m), lambda: (
          jax.jit(self._lowered_step(sampling), donate_argnums=(2,)).lower(
              self.tp, self.dp, state, jax.random.key(0), i32(B, m), i32(B, m),
              i32(B, m)).compile()))

    return start, step, seconds

  def generate(self, prompts, *, max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
               seed: int = 0, eos_token_ids=(), max_len: int | None = None, stop_strings=(),
               tokenizer=None, streamer=None) -> GenerationResult:
    """Generate like `Decoder.generate`; greedy output equals it token for token. `stats` is an
    EagleLookupStats; `steps` counts verifications."""
    req = self._request(prompts, max_new_tokens, sampling, seed, eos_token_ids, max_len,
                        stop_strings, tokenizer, streamer)
    start, steps, compile_s = self.programs(sampling, req.B, req.T, req.S,
                                            compute_dtype(self.tp))
    prefill = self._start(req, start)
    stats = EagleLookupStats(drafted=[], accepted=[])

    def begin():
      first, state = prefill()
      first = np.asarray(first)  # committed tokens per row: the prompt and the first token
      return first, (state, [np.append(np.asarray(p, np.int64), t)
                             for p, t in zip(req.prompts, first)])

    def advance(carry, i, key, active):
      state, hist = carry
      tok, parent, depth, nodes = trie_block(hist, active, self.gamma, self.max_ngram,
                                             self.min_ngram, self.candidates, self.buckets)
      prog, compiled = steps(tok.shape[1])
      state, emitted, n, from_lk, *head = prog(self.tp, self.dp, state, key, jnp.asarray(tok),
                                               jnp.asarray(parent), jnp.asarray(depth))
      emitted, n, from_lk = np.asarray(emitted), np.asarray(n), np.asarray(from_lk)
      drafted = np.asarray(head[0]) if head else np.ones(len(active), bool)
      stats.drafted.append([self.tree.total_tokens * bool(h) + int(x) if a else 0
                            for x, a, h in zip(nodes, active, drafted)])
      stats.accepted.append([int(x) if a else 0 for x, a in zip(n, active)])
      stats.active.append([bool(a) for a in active])
      stats.lookup_nodes.append([int(x) if a else 0 for x, a in zip(nodes, active)])
      stats.from_lookup.append([int(x) if a else 0 for x, a in zip(from_lk, active)])
      stats.head.append([bool(h) if a else False for h, a in zip(drafted, active)])
      hist = [np.concatenate([h, e[:k + 1]]) for h, e, k in zip(hist, emitted, n)]
      return (state, hist), emitted, compiled

    return host_loop(req, begin, advance, compile_s=compile_s, stats=stats)
