"""Trimmed drafter LM head over a static vocabulary subset (VocabTrim, FR-Spec).

Letters: B batch, D drafter hidden size, K subset size, V target vocabulary.

`attach_subset` stores, beside the drafter's params (one pytree, so the compiled step takes the
trimmed rows as an argument and not as a baked-in constant):
  head [K, D]  the drafter's LM-head rows of the subset's ids (a copy: K*D values)
  ids  [K]     int32 target ids of those rows, ascending (d2t applied: ids = arange(K) + d2t)
`static_policy(params, h)` is the vocabulary policy (`vocabjax.vocab.policy`): the K subset
logits z = h . head^T (K*D multiply-adds instead of V*D) and their target ids. Drafting picks
among the K, maps the pick to its target id and embeds that target id next step; q is the
trimmed distribution, zero outside the subset once scattered into the full vocabulary.

Why this stays lossless: a token outside the subset is never drafted (q = 0), and the residual
max(p - q, 0) hands it the target's probability p(x) in full; greedy verification ignores q.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.kernels.cpu_matmul import linear
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head_rows
from vocabjax.vocab.subset import SubsetError, VocabSubset

SUBSET_KEY = "vocab_subset"


def attach_subset(params: dict, config: LlamaLikeConfig, subset: VocabSubset) -> dict:
  """The drafter's params plus its trimmed head for `subset` (see the module doc)."""
  if subset.vocab_size != config.vocab_size:
    raise SubsetError(f"the subset is over a vocabulary of {subset.vocab_size} tokens but the "
                      f"drafter has V={config.vocab_size}: counted with another tokenizer?")
  ids = jnp.asarray(np.asarray(subset.ids), jnp.int32)
  U, scale = lm_head_rows(params, config)
  sub = {"head": jnp.take(U, ids, axis=0), "ids": ids}
  if scale is not None:  # int8 rows keep their scales
    sub["scale"] = jnp.take(scale, ids, axis=0)
  return {**params, SUBSET_KEY: sub}


def subset_rows(params: dict) -> int | None:
  """K of an attached subset, or None for a full head."""
  sub = params.get(SUBSET_KEY)
  return None if sub is None else int(sub["head"].shape[0])


def static_policy(params: dict, hidden: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(target ids [..., K], logits [..., K]) over the attached subset (f32 accumulation)."""
  sub = params[SUBSET_KEY]
  z = linear(hidden, sub["head"], sub.get("scale"))  # the CPU kernel streams the K rows once (f32 out)
  return jnp.broadcast_to(sub["ids"], z.shape), z
