"""Tree speculative decoding with an EAGLE-style head (EAGLE-2 trees, EAGLE-3 heads).

Letters: B batch, d tree depth, P = d + 1 pending entries, Lf*Dt fused target feature width (Lf fused layers),
D head width (= the target's hidden size), S cache slots, V target vocabulary.

The head (`vocabjax.models.eagle`) drafts from the target's own features: its entry at position
p pairs token x_{p+1} with the target's feature f_p and predicts x_{p+2} (deeper tree levels pair
a node's token with its parent entry's output); entry p sits at slot p of its one-layer cache,
RoPE position p. The target's verification captures the fused layers' outputs at every node, and
the accepted path's features become the head's pending entries: no second target pass. At the
start of a step (Nt = target cache length, per row) the target holds every committed token but
`last`; the head holds entries 0 .. Nt - 1 - pend_count, and the pending entries complete it up
to (last, f_{Nt-1}), whose output gives the root's children. Vocabulary: the head's own LM head
over Vd tokens (d2t), or `lm_head="target"`, with any `draft_vocab` policy on the target's head
(or on its own when Vd = V). Greedy output equals the target's; sampling verifies deterministic
drafts losslessly (`verify_tree_sampling`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from vocabjax import sharding
from vocabjax.decoding.drafter import DraftVocab, PolicyHead
from vocabjax.decoding.proposer import Context, Counted, Drafts, Prefilled, TreeGrower
from vocabjax.decoding.tree import TreeBounds, TreeParams, drop_rows, grow_tree
from vocabjax.lowering import lowering_of, with_lowering
from vocabjax.sampling import SamplingParams
from vocabjax.vocab.policy import POLICY_STATE, full_policy
from vocabjax.models.cache import KVCache
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.eagle import EagleConfig, eagle_forward, fuse_features, head_output
from vocabjax.models.llamalike import float_dtype, is_int8, lm_head_matrix, with_mlp_layout
from vocabjax.vocab.subset import HeadRows

HEAD_KEY = "eagle"  # the head's own params inside the decoder's drafter pytree
GATE_KEY = "gate"  # a gated decoder's threshold (f32 scalar) inside the drafter pytree


@struct.dataclass
class EagleState:
  """An EAGLE head's state (the engine keeps the target cache and `last`, the next root)."""

  head_cache: KVCache  # one layer; entries 0 .. Nt - 1 - pend_count
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


def _confident(dp, x_root, head_config, policy, gated: bool):
  """(keep [B] bool: rows whose root confidence reaches the threshold `dp[GATE_KEY]`, the
  policy's output at the root, which the tree's growth reuses); (None, None) when not gated."""
  if not gated:
    return None, None
  root = _root_policy(dp, x_root, head_config, policy)
  return _top_probability(root[1]) >= dp[GATE_KEY], root


def _no_nodes(last):
  """An empty tree (tokens, parent, depth [B, 0])."""
  e = jnp.zeros((last.shape[0], 0), jnp.int32)
  return e, e, e


def head_prefill(dp, pre: Prefilled, *, head_config: EagleConfig, pend_width: int) -> EagleState:
  """The head over the prompt's entries 0 .. P - 2 (tokens x_1 .. x_{P-1} with the target's
  features f_0 .. f_{P-2}); entry P - 1 = (first, f_{P-1}) stays pending."""
  tokens, lengths, feats = pre.tokens, pre.lengths, pre.features
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  shifted = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))  # entry p reads token p + 1
  head = _head(dp)
  _, hcache = eagle_forward(head, dp["embed"], shifted, fuse_features(head, feats), positions,
                            pre.caches["head"], config=head_config)
  feat = jnp.take_along_axis(feats, (lengths - 1)[:, None, None], axis=1)[:, 0]
  P, F = pend_width, head_config.fused_width
  return EagleState(head_cache=hcache.with_lengths(lengths - 1),
                    pend_tokens=jnp.broadcast_to(pre.first[:, None], (B, P)).astype(jnp.int32),
                    pend_feats=jnp.broadcast_to(feat[:, None], (B, P, F)),
                    pend_count=jnp.ones_like(pre.first))


class EagleProposer(TreeGrower, PolicyHead, Counted):
  """An EAGLE(-3) head on the target's features growing an EAGLE-2 tree (module doc).

  `lm_head`: "own" (the head's Vd rows with d2t, default) or "target" (the target's LM head,
  frozen); `draft_vocab` restricts a full-V head. `min_confidence` > 0 gates each row on the
  head's top probability at its root (`root_confidence`)."""

  method = "eagle"
  draft_block_calls = True  # the head runs top_k tokens per tree level, as the target's blocks
  parallel_head = False  # a P-EAGLE head is `PEagleProposer`'s

  def __init__(self, target_params, target_config: LlamaLikeConfig, head_params,
               head_config: EagleConfig, *, tree: TreeParams = TreeParams(),
               lm_head: str = "own", draft_vocab: DraftVocab | None = None,
               min_confidence: float = 0.0):
    head_config.check_target(target_config)
    if head_config.parallel and not self.parallel_head:
      raise ValueError("a P-EAGLE head (mask_token_id set) drafts its depths in parallel: "
                       "`vocabjax.decoding.peagle.PEagleProposer` (method peagle)")
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
    self.head_config, self.tree, self.lm_head_source = head_config, tree, lm_head
    self.bounds = TreeBounds(tree.top_k, tree.depth)
    self.feature_layers = head_config.feature_layers
    # the drafting LM head the policies read: the target's frozen head, or the head's own
    # rows; as a model config, the target's with that head untied (`head_vocab_config`)
    self.head_vocab_config = dataclasses.replace(target_config, tie_word_embeddings=False)
    U = lm_head_matrix(target_params, target_config) if lm_head == "target" \
        else head_params["lm_head"]
    # the head's own LM head lives at "lm_head" (or as `HeadRows`' rows below), not also under
    # the head's key: a second argument of the same [Vd, D] rows, which a slice would place
    # twice and a projection would count twice
    self.params = {HEAD_KEY: {k: v for k, v in head_params.items() if k != "lm_head"},
                   "embed": target_params["embed"], "lm_head": U}
    if min_confidence > 0:  # an input of the step, not a constant: thresholds share programs
      self.params[GATE_KEY] = jnp.asarray(min_confidence, jnp.float32)
    if draft_vocab is None and lm_head == "own" and Vd < V:
      # the head's own static subset: its rows, ids = j + d2t
      ids = jnp.arange(Vd, dtype=jnp.int32) + head_params["d2t"].astype(jnp.int32)
      draft_vocab = HeadRows(head_params["lm_head"], ids)
    self.draft_vocab = draft_vocab
    self.policy = full_policy(self.head_vocab_config)
    self.min_confidence = float(min_confidence)
    self.gated = self.min_confidence > 0
    self.pend_width = tree.depth + 1  # P: a step's accepted tokens + the next, at most
    self.drafted_per_step = tree.total_tokens
    self.extra_slots = tree.total_tokens + tree.draft_slots + tree.depth + 2

  def key(self):
    return ("eagle", self.head_config, self.tree, self.policy, self.gated, self.pend_width)

  def prepare(self, *, layout: str, lowering, mesh=None) -> None:
    """The head's one decoder layer in `layout` (the embedding and LM head have no MLP), and
    the vocabulary policy's arrays."""
    dp = self.params
    layer = with_mlp_layout({"layers": [dp[HEAD_KEY]["layer"]]}, layout)["layers"][0]
    self.params = {**dp, HEAD_KEY: {**dp[HEAD_KEY], "layer": layer}}
    if self.draft_vocab is not None:
      self.params, self.policy = self.draft_vocab.attach(self.params, self.head_vocab_config,
                                                         mesh=mesh)

  def place(self, mesh, target_config) -> None:
    """On a mesh: the target's embedding split by rows as the target's own, a policy's arrays
    by `sharding.place_policy` (a trimmed head's rows split too), the head's decoder layer by
    the target's layer rules (`sharding.shard_layer`: replicated, every chip streamed the whole
    layer on each drafting call), its fc, norms and own LM head replicated."""
    def head(tree):
      return {k: sharding.shard_layer(v, self.head_config.layer, mesh) if k == "layer"
              else sharding.replicate(v, mesh) for k, v in tree.items()}

    self.params = {k: sharding.shard_rows(v, mesh) if k in ("embed", "lm_head")
                   else sharding.place_policy(v, mesh) if k == POLICY_STATE
                   else head(v) if k == HEAD_KEY
                   else sharding.replicate(v, mesh) for k, v in self.params.items()}

  def caches(self) -> dict:
    return {"head": self.head_config.layer}

  def prefill(self, params, target_params, pre: Prefilled) -> EagleState:
    return head_prefill(params, pre, head_config=self.head_config, pend_width=self.pend_width)

  def gate(self, params, state: EagleState, ctx: Context):
    x_root, cache = _head_root(params, state, head_config=self.head_config)
    keep, root = _confident(params, x_root, self.head_config, self.policy, self.min_confidence > 0)
    return keep, (state, x_root, cache, root)

  def grow(self, params, pre, keep):
    """(tokens, parent, depth [B, n] of the head's tree, its state for `commit`); rows not in
    `keep` made padding."""
    state, x_root, cache, root = pre
    tok, parent, depth, hcache = _grow(params, x_root, cache, head_config=self.head_config,
                                       tree=self.tree, policy=self.policy, root=root)
    return (*drop_rows(tok, parent, depth, keep), (state, hcache))

  def skip(self, pre):
    """Its state when it grew no tree: the pending entries read (`gate`)."""
    return pre[0], pre[2]

  def propose(self, params, pre, ctx: Context, key, *, sampling: SamplingParams, keep=None):
    del key, sampling  # deterministic drafts
    tok, parent, depth, carry = self.grow(params, pre, keep)
    return Drafts(tokens=tok, parent=parent, depth=depth, bounds=self.bounds), carry

  def fallback(self, params, pre, ctx: Context):
    """No row's head is sure: the roots alone (a plain step that still captures the features
    the head reads next)."""
    tok, parent, depth = _no_nodes(ctx.last)
    return (Drafts(tokens=tok, parent=parent, depth=depth,
                   bounds=TreeBounds(1, self.tree.depth)), self.skip(pre))

  def commit(self, params, carry, ctx: Context, drafts: Drafts, v) -> EagleState:
    state, hcache = carry
    return EagleState(head_cache=hcache, pend_tokens=v.pend_tokens,
                      pend_feats=v.features.astype(state.pend_feats.dtype),
                      pend_count=v.accepted + 1)

  def record(self, stats) -> dict:
    """Totals for an eval record (gated only): (row) steps where the head drafted, and all
    verifications."""
    if not self.gated:
      return {}
    return {"head_steps": sum(1 for row in stats.drafted for d in row if d),
            "verifications": len(stats.drafted)}

  def drafter_calls(self):
    t = self.tree
    return [(t.depth + 1, 1)] + [(t.top_k, t.top_k)] * (t.depth - 1)

  def drafter_body(self):
    """(fn(params, tokens, positions, cache) -> (output, cache), params, cache config) of the
    head's layer alone (for profiling; the feature input is zeros)."""
    hc = self.head_config

    def body(dp, tokens, positions, cache):
      head = _head(dp)
      feats = jnp.zeros(tokens.shape + (hc.fused_width,), float_dtype(dp["embed"]))
      return eagle_forward(head, dp["embed"], tokens, fuse_features(head, feats), positions,
                           cache, config=hc)

    return body, self.params, hc.layer

  def draft_width(self) -> int:
    return self.head_vocab_config.hidden_size
