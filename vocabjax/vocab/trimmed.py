"""Trimmed drafter LM head over a static vocabulary subset (VocabTrim, FR-Spec).

Letters: B batch, D drafter hidden size, K subset size, V target vocabulary.

`attach_subset` stores, beside the drafter's params (one pytree, so the compiled step takes the
trimmed rows as an argument and not as a baked-in constant):
  head [K, D]   the drafter's LM-head rows of the subset's ids (a copy: K*D values)
  expand [V]    int32, for each target id its draft index, or K for "outside the subset"
`trimmed_head(params, h)` then computes z = h . head^T, only K rows (the expensive part: K*D
multiply-adds instead of V*D), and returns logits over the target vocabulary with -inf outside
the subset, z padded with one -inf column gathered by `expand` (V reads, no multiply-adds). A
draft index never leaves the head: the drafter samples/argmaxes a target id directly, embeds that
target id with its own (full) embedding at the next step, and its q is exactly the trimmed
distribution with q(x) = 0 for x outside the subset.

Why this stays lossless: verification sees the draft's q over the full vocabulary. A token
outside the subset is never drafted (q = 0), and the residual max(p - q, 0) hands it the
target's probability p(x) in full; greedy verification ignores q altogether.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.vocab.subset import SubsetError, VocabSubset

SUBSET_KEY = "vocab_subset"


def attach_subset(params: dict, config: LlamaLikeConfig, subset: VocabSubset) -> dict:
  """The drafter's params plus its trimmed head for `subset` (see the module doc)."""
  if subset.vocab_size != config.vocab_size:
    raise SubsetError(f"the subset is over a vocabulary of {subset.vocab_size} tokens but the "
                      f"drafter has V={config.vocab_size}: counted with another tokenizer?")
  ids = np.asarray(subset.ids, np.int64)
  K = ids.size
  expand = np.full(config.vocab_size, K, np.int32)
  expand[ids] = np.arange(K, dtype=np.int32)
  U = lm_head_weight(params, config)
  return {**params, SUBSET_KEY: {"head": jnp.take(U, jnp.asarray(ids, jnp.int32), axis=0),
                                 "expand": jnp.asarray(expand)}}


def subset_rows(params: dict) -> int | None:
  """K of an attached subset, or None for a full head."""
  sub = params.get(SUBSET_KEY)
  return None if sub is None else int(sub["head"].shape[0])


def trimmed_logits(params: dict, hidden: jax.Array) -> jax.Array:
  """The K subset logits [..., K] (f32 accumulation), in ascending target-id order."""
  return jnp.einsum("...D,KD->...K", hidden, params[SUBSET_KEY]["head"],
                    preferred_element_type=jnp.float32)


def trimmed_head(params: dict, hidden: jax.Array) -> jax.Array:
  """Logits [..., V] over the target vocabulary, -inf outside the subset (only K rows are
  multiplied)."""
  z = trimmed_logits(params, hidden)
  z = jnp.concatenate([z, jnp.full(z.shape[:-1] + (1,), -jnp.inf, z.dtype)], axis=-1)
  return jnp.take(z, params[SUBSET_KEY]["expand"], axis=-1)
