"""EAGLE heads (EAGLE-3 and EAGLE-1/2 checkpoints) drafting an EAGLE-2 tree from the target's
features (`eagle`), with prompt lookup (`eagle_pld`) or SuffixDecoding (`eagle_suffix`) merged
into the tree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp

from vocabjax.checkpoints.eagle2 import load_head, load_head_config
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.hybrid import HostTreeHybrid, LookupTrie
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams
from vocabjax.errors import ConfigError
from vocabjax.methods import model_blocks, read_head_config, register, tree_params
from vocabjax.methods.lookup import PldParams
from vocabjax.methods.suffix import SuffixHybridParams
from vocabjax.methods.vocab import check_head_policy, head_policy, head_policy_rows
from vocabjax.models.llamalike import compute_dtype, float_dtype


# An EAGLE-3 head directory (`python -m vocabjax.train.eagle`, the authors' `yuhuili/EAGLE3-*`,
# or one exported by SpecForge for SGLang / vLLM) or an EAGLE-1/2 head (`yuhuili/EAGLE-*`, over
# the target's own LM head: FR-Spec's and VocabTrim's setting) drafts an EAGLE-2 tree from the
# target's own features; no separate drafter.

def _eagle_config(path: str, where: str):
  return read_head_config(path, where, "eagle.head", load_head_config)


@dataclasses.dataclass(frozen=True)
class EagleParams:
  head: str  # an EAGLE head directory (EAGLE-3 or EAGLE-1/2) or hub id
  top_k: int = 4  # the tree (EAGLE's own evaluation defaults are 10, 6, 59: for GPUs)
  depth: int = 4
  total_tokens: int = 16
  lm_head: str = "own"  # own: the head's rows (d2t); target: the target's LM head (an
  #   EAGLE-1/2 head's own is the target's: both the same)
  subset: str = ""  # a saved static subset for the head's drafting vocabulary
  ranker: str = ""  # or a SpecVocab ranker's per-step candidates (with k)
  k: int = 2048
  vocab: str = ""  # or a newer policy: "NAME:key=value,..." (microspec, evospec, dynaspec,
  #   slimspec, covtrim with their method's parameters: `methods.vocab.parse_vocab`)
  min_confidence: float = 0.0  # draft only when the head's top probability reaches it

  def check(self, where: str) -> None:
    if self.lm_head not in ("own", "target"):
      raise ConfigError(f"{where}: eagle.lm_head={self.lm_head!r} must be 'own' or 'target'")
    if not 0.0 <= self.min_confidence < 1.0:
      raise ConfigError(f"{where}: eagle.min_confidence={self.min_confidence} must lie in "
                        f"[0, 1) (the head's top probability at the root; 0 drafts always)")
    tree_params(where, "eagle", self.top_k, self.depth, self.total_tokens)
    hc = _eagle_config(self.head, where)
    if self.lm_head == "own" and self.top_k > hc.draft_vocab_size:
      raise ConfigError(f"{where}: eagle.top_k={self.top_k} exceeds the head's vocabulary of "
                        f"{hc.draft_vocab_size} tokens")
    check_head_policy(where, "eagle", self.subset, self.ranker, self.k, self.vocab)


def _eagle_rows(p: EagleParams, method: str = "eagle") -> int:
  """LM-head rows the head drafts over per step: a subset's K, a ranker's k + its cost in rows,
  else the head's own rows or the target's V (`method` names the parameters in errors: `eagle`,
  or a method on the same head's parameters)."""
  rows = head_policy_rows(method, p.subset, p.ranker, p.k, p.vocab)
  if rows is not None:
    return rows
  hc = _eagle_config(p.head, method)
  return hc.draft_vocab_size if p.lm_head == "own" else hc.layer.vocab_size


@register("eagle", EagleParams, needs_draft=False, drafter_passes=lambda p: p.depth,
          head_rows=_eagle_rows,
          drafter_params=lambda p: _eagle_config(p.head, "eagle").num_params(_eagle_rows(p)))
def _eagle(target, draft, p: EagleParams, mesh=None):
  """EAGLE-2 tree drafting with an EAGLE-3 head trained for `target` (refused otherwise)."""
  del draft
  blocks = model_blocks(target, mesh)
  return SpeculativeEngine(blocks, target.config, _eagle_proposer(blocks, target, p), mesh=mesh)


def _eagle_proposer(blocks, target, p: EagleParams) -> EagleProposer:
  """The EAGLE proposer of `p` (its tree, LM head, vocabulary policy and gate) on `blocks`."""
  return EagleProposer(blocks, target.config, *_eagle_head(target, p),
                       tree=TreeParams(p.top_k, p.depth, p.total_tokens), lm_head=p.lm_head,
                       draft_vocab=_eagle_vocab(target, p), min_confidence=p.min_confidence)


def head_dtype(target_params) -> jnp.dtype:
  """The dtype an EAGLE head on this target loads in: its embedding's float dtype (bf16 beside
  a bf16 target), f32 beside a target whose embedding is quantized (GGUF blocks store bytes:
  their dtype, uint8, is storage, not what the model computes in)."""
  d = float_dtype(target_params["embed"])
  return d if jnp.issubdtype(d, jnp.floating) else jnp.dtype(compute_dtype(target_params))


_HEADS: list = []  # the last few loaded EAGLE heads: (key, target params, (params, config))
_HEADS_KEPT = 2


def _eagle_head(target, p: EagleParams):
  """(head params, head config) of `p.head`, refused when trained for another target.

  A suite's methods on one head (the papers' suite: 13 on the full-vocabulary head) share one
  loaded copy: the last `_HEADS_KEPT` heads are kept, keyed by the file (path, size, mtime),
  the dtype and whether the head's own LM head is read, for the same target params object.
  With `lm_head: target` the head's own rows (in a full-vocabulary head, a copy of the
  target's head) are not read at all."""
  path = Path(p.head).resolve()
  try:
    weights = path / "model.safetensors"
    st = (weights if weights.exists() else path / "pytorch_model.bin").stat()
    key = (str(path), st.st_size, st.st_mtime_ns, str(head_dtype(target.params)),
           p.lm_head == "own")
  except OSError:
    key = None  # load_head names the problem
  for k, params_ref, loaded in _HEADS:
    if key is not None and k == key and params_ref is target.params:
      return loaded
  hc, params, _ = load_head(p.head, target_config=target.config, target_params=target.params,
                              dtype=head_dtype(target.params), lm_head=p.lm_head == "own")
  if key is not None:
    _HEADS.insert(0, (key, target.params, (params, hc)))
    del _HEADS[_HEADS_KEPT:]
  return params, hc


def release_loaded_heads() -> None:
  """Forget the shared EAGLE heads (`_eagle_head`): they hold the target's params too, so a
  caller that frees its models (the eval before `--compare-torch` loads transformers' copy)
  must drop these references as well, or neither is freed."""
  _HEADS.clear()


def _eagle_vocab(target, p: EagleParams):
  return head_policy(target, p.subset, p.ranker, p.k, p.vocab)


@dataclasses.dataclass(frozen=True)
class EaglePldParams(EagleParams):
  gamma: int = 4  # prompt lookup: most tokens per continuation
  max_ngram: int = 3  # longest context n-gram matched
  min_ngram: int = 1  # shortest
  candidates: int = 1  # continuations merged into the head's tree

  def check(self, where: str) -> None:
    super().check(where)
    PldParams(self.gamma, self.max_ngram, self.min_ngram, self.candidates).check(where)


@register("eagle_pld", EaglePldParams, needs_draft=False, drafter_passes=lambda p: p.depth,
          head_rows=_eagle_rows,
          drafter_params=lambda p: _eagle_config(p.head, "eagle").num_params(_eagle_rows(p)))
def _eagle_pld(target, draft, p: EaglePldParams, mesh=None):
  """The EAGLE head's tree with prompt lookup's continuations merged into it, one verification
  (`hybrid.HostTreeHybrid` of an `EagleProposer` and a `LookupTrie`); one device."""
  del draft
  blocks = model_blocks(target, mesh)
  return SpeculativeEngine(blocks, target.config, HostTreeHybrid(
      _eagle_proposer(blocks, target, p),
      LookupTrie(gamma=p.gamma, max_ngram=p.max_ngram, min_ngram=p.min_ngram,
                 candidates=p.candidates)), mesh=mesh)


@dataclasses.dataclass(frozen=True)
class EagleSuffixParams(SuffixHybridParams, EagleParams):
  """EAGLE's fields, then SuffixDecoding's (`SuffixHybridParams`)."""


@register("eagle_suffix", EagleSuffixParams, needs_draft=False,
          drafter_passes=lambda p: p.depth, head_rows=_eagle_rows,
          drafter_params=lambda p: _eagle_config(p.head, "eagle").num_params(_eagle_rows(p)))
def _eagle_suffix(target, draft, p: EagleSuffixParams, mesh=None):
  """The EAGLE head's tree with SuffixDecoding's proposal merged into it (or, with
  `score_threshold`, alone where it scores that much), one verification
  (`hybrid.HostTreeHybrid` of an `EagleProposer` and `SuffixTrees`); one device."""
  del draft
  if mesh is not None:
    raise ValueError("eagle_suffix runs on one device (its suffix trees are the host's)")
  blocks = model_blocks(target, mesh)
  return SpeculativeEngine(blocks, target.config, HostTreeHybrid(
      _eagle_proposer(blocks, target, p), p.host_tree()))
