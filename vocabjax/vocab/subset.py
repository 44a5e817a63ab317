"""Static drafter-vocabulary subsets (VocabTrim, FR-Spec) in the EAGLE-3 / SGLang convention.

Letters: V target vocabulary, K subset size.

A subset of K target token ids, ascending, is stored two ways:
  d2t [K] int64 offsets:  target_id = draft_id + d2t[draft_id]
  t2d [V] bool mask:      t2d[target_id] is True iff the token is in the subset
Selection keeps the K most frequent tokens by calibration counts (or the smallest set holding
`top_p` of the mass, or every token counted at least `min_count` times), and always the EOS and
chat-template special tokens. A subset is saved beside the drafter with the tokenizer identity
it was counted with, and reloaded as is (never silently regenerated: SpecForge PR 534).
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.errors import clip
from vocabjax.io import atomic_write_bytes
from vocabjax.kernels.cpu_matmul import linear
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.kernels.blocks import is_blocks
from vocabjax.models.llamalike import lm_head_rows
from vocabjax.lowering import lowering_of
from vocabjax.vocab.policy import policy_state, with_policy_state


class SubsetError(ValueError):
  """A subset that cannot be built or loaded; the message names the value."""


@dataclasses.dataclass(frozen=True)
class VocabSubset:
  ids: np.ndarray  # [K] int64 ascending target ids in the subset
  vocab_size: int  # V of the target vocabulary
  tokenizer_id: str = ""  # identity of the tokenizer the counts were made with
  meta: tuple = ()  # ((key, value), ...) provenance: source, rule, token total

  def __post_init__(self):
    ids = np.asarray(self.ids)
    if ids.ndim != 1 or ids.size == 0:
      raise SubsetError(f"a subset needs a non-empty 1-D id list, got shape {ids.shape}")
    if np.any(np.diff(ids) <= 0):
      raise SubsetError("subset ids must be strictly ascending (the d2t convention)")
    if ids[0] < 0 or ids[-1] >= self.vocab_size:
      raise SubsetError(f"subset ids must lie in [0, {self.vocab_size}), got {ids[0]}..{ids[-1]}")

  @property
  def size(self) -> int:
    return int(np.asarray(self.ids).size)

  @property
  def head_rows(self) -> int:  # LM-head rows a trimmed head multiplies per row
    return self.size

  def attach(self, params: dict, config: LlamaLikeConfig, mesh=None):
    """(the drafter's params with the trimmed head over this subset beside them, the static
    policy): the draft-vocabulary interface `SpeculativeVocab.attach` shares (`mesh`: unused,
    the trimmed head is replicated)."""
    del mesh
    return attach_subset(params, config, self), static_policy

  @property
  def d2t(self) -> np.ndarray:
    """[K] offsets: target = draft + d2t[draft]."""
    ids = np.asarray(self.ids, np.int64)
    return ids - np.arange(ids.size, dtype=np.int64)

  @property
  def t2d(self) -> np.ndarray:
    """[V] bool membership mask."""
    mask = np.zeros(self.vocab_size, bool)
    mask[np.asarray(self.ids)] = True
    return mask

  @classmethod
  def from_d2t(cls, d2t, vocab_size: int, **kw) -> "VocabSubset":
    d2t = np.asarray(d2t, np.int64)
    return cls(ids=d2t + np.arange(d2t.size, dtype=np.int64), vocab_size=vocab_size, **kw)

  def save(self, path: str | Path) -> Path:
    """Atomically write `d2t`, `t2d` and metadata as one .npz."""
    path = Path(path)
    buf = io.BytesIO()
    np.savez_compressed(buf, d2t=self.d2t, t2d=self.t2d, meta=np.asarray(json.dumps(
        {"vocab_size": self.vocab_size, "tokenizer_id": self.tokenizer_id,
         **dict(self.meta)})))
    atomic_write_bytes(path, buf.getvalue())
    return path

  @classmethod
  def from_frspec(cls, path, vocab_size: int | None = None) -> "VocabSubset":
    """FR-Spec's released frequency-ranked token list (`fr/fr.py`: `torch.save` of the K most
    frequent ids, most frequent first, EOS appended when it was not among them; e.g.
    `thunlp/LLaMA3-Instruct-8B-FR-Spec/freq_32768.pt`) as a subset of a V-token vocabulary. It is
    pickled: read with `torch.load(weights_only=True)` only when pickles are allowed
    (`--allow-bin`). It records no tokenizer: only that its ids lie in [0, V) can be checked."""
    path = Path(path)
    ids = _frspec_ids(path)
    if not ids:
      raise SubsetError(f"{path}: the FR-Spec token list is empty")
    if len(set(ids)) != len(ids):
      raise SubsetError(f"{path}: the FR-Spec token list repeats ids")
    V = int(vocab_size) if vocab_size is not None else max(ids) + 1
    if min(ids) < 0 or max(ids) >= V:
      raise SubsetError(f"{path}: FR-Spec token ids {min(ids)}..{max(ids)} do not fit the target's "
                        f"vocabulary of V={V} (a list for another model?)")
    return cls(ids=np.asarray(sorted(ids), np.int64), vocab_size=V,
               meta=(("k", len(ids)), ("source", f"fr-spec:{path.name}")))

  @classmethod
  def load(cls, path: str | Path, *, tokenizer_id: str | None = None,
           vocab_size: int | None = None) -> "VocabSubset":
    """Reload a saved subset; `tokenizer_id` (when given) must match the one it was made with.
    A `.pt` file is FR-Spec's released token list (`from_frspec`; `vocab_size`: the target's
    V, which such a list does not record)."""
    path = Path(path)
    if not path.is_file():
      raise SubsetError(f"no vocabulary subset at {path}")
    if path.suffix in (".pt", ".pth"):
      return cls.from_frspec(path, vocab_size)
    try:
      with np.load(path, allow_pickle=False) as z:
        d2t, t2d, meta = z["d2t"], z["t2d"], json.loads(str(z["meta"]))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
      raise SubsetError(f"{path} is not a readable vocabulary subset (truncated or corrupt?): "
                        f"{type(e).__name__}: {e}") from None
    V = int(meta.pop("vocab_size"))
    tok = meta.pop("tokenizer_id", "")
    if tokenizer_id is not None and tok != tokenizer_id:
      raise SubsetError(f"{path} was counted with tokenizer {tok!r}, not {tokenizer_id!r}")
    sub = cls.from_d2t(d2t, V, tokenizer_id=tok, meta=tuple(sorted(meta.items())))
    if t2d.shape != (V,) or not np.array_equal(sub.t2d, t2d):
      raise SubsetError(f"{path}: t2d does not match d2t (inconsistent file)")
    return sub


def _frspec_ids(path: Path) -> list:
  from vocabjax.checkpoints.hub import allow_bin_default, bin_refusal  # local: checkpoints sits
  #   above vocab in the import order; only FR-Spec's pickled lists need it

  if not allow_bin_default(None):
    raise SubsetError(bin_refusal(str(path), [path.name]))
  import torch  # local: torch is optional, and only FR-Spec's .pt lists need it

  try:
    ids = torch.load(str(path), map_location="cpu", weights_only=True)
  except Exception as e:  # pickle errors, a truncated zip, a refused global
    raise SubsetError(f"{path} is not a readable FR-Spec token list "
                      f"({type(e).__name__}: {clip(str(e), 200)})") from None
  if isinstance(ids, torch.Tensor):
    ids = ids.reshape(-1).tolist()
  if not isinstance(ids, (list, tuple)) or not all(
      isinstance(i, int) and not isinstance(i, bool) for i in ids):
    raise SubsetError(f"{path}: an FR-Spec token list is a list (or tensor) of token ids, got "
                      f"{type(ids).__name__}")
  return list(ids)


def select(counts, *, k: int | None = None, top_p: float | None = None,
           min_count: int | None = None, keep=(), tokenizer_id: str = "",
           meta: dict | None = None) -> VocabSubset:
  """A subset from per-token counts [V] by exactly one rule, plus the `keep` ids.

  k: the K most frequent (ties: lower id first). top_p: the fewest most frequent tokens holding
  at least that share of all occurrences. min_count: every token counted at least that often.
  `keep` (EOS, chat-template specials) is always added; with `k` they count within K.
  """
  counts = np.asarray(counts)
  if counts.ndim != 1 or counts.size == 0:
    raise SubsetError(f"counts must be a non-empty [V] vector, got shape {counts.shape}")
  V = counts.size
  if counts.min() < 0:
    bad = int(np.argmin(counts))
    raise SubsetError(f"the counts hold negative values (token {bad}: {int(counts[bad])}): a "
                      f"corrupt counts file, not a calibration result")
  total = int(counts.sum())
  if total <= 0:
    raise SubsetError("the counts are all zero: empty calibration set?")
  if sum(x is not None for x in (k, top_p, min_count)) != 1:
    raise SubsetError(f"give exactly one of k, top_p, min_count (got {k=}, {top_p=}, "
                      f"{min_count=})")
  keep = np.unique(np.asarray(list(keep), np.int64))
  if keep.size and (keep.min() < 0 or keep.max() >= V):
    raise SubsetError(f"keep ids must lie in [0, {V}), got {keep.tolist()}")
  order = np.lexsort((np.arange(V), -counts))  # by count descending, then id ascending
  if k is not None:
    if not 1 <= k <= V:
      raise SubsetError(f"{k=} must be in [1, vocabulary size {V}]")
    if keep.size > k:
      raise SubsetError(f"{k=} is smaller than the {keep.size} tokens that must be kept")
    rest = order[~np.isin(order, keep)][:k - keep.size]
    chosen = np.concatenate([keep, rest])
  elif top_p is not None:
    if not 0 < top_p <= 1:
      raise SubsetError(f"{top_p=} must be in (0, 1]")
    mass = np.cumsum(counts[order]) / total
    n = int(np.searchsorted(mass, top_p - 1e-12) + 1)
    chosen = np.concatenate([keep, order[:n]])
  else:
    if min_count < 1:
      raise SubsetError(f"{min_count=} must be >= 1")
    if not (counts >= min_count).any():
      raise SubsetError(f"no token is counted {min_count=} times or more (the most frequent "
                        f"is counted {int(counts.max())} times): the subset would hold only "
                        f"the kept special tokens; lower min_count")
    chosen = np.concatenate([keep, np.nonzero(counts >= min_count)[0]])
  info = {"rule": f"k={k}" if k is not None else (f"top_p={top_p}" if top_p is not None
                                                   else f"min_count={min_count}"),
          "token_total": total, **(meta or {})}
  return VocabSubset(ids=np.unique(chosen).astype(np.int64), vocab_size=V,
                     tokenizer_id=tokenizer_id, meta=tuple(sorted(info.items())))


def coverage_latency(counts, *, body_rows: int, alpha: float = 0.5, min_coverage: float = 0.0,
                     k_min: int = 50, k_max: int | None = None) -> dict:
  """The subset size that balances coverage against drafting cost (Ben Shoham 2026, arXiv
  2603.05210; the rule of its reference code, `optimize_vocab_size.py`):

      C(k) = share of counted tokens among the k most frequent      (coverage)
      R(k) = 1 - (body + k) / (body + V)                            (drafting cost saved)
      k*   = argmax_k  alpha C(k) + (1 - alpha) R(k)   over k_min <= k <= k_max with C(k) >=
             min_coverage (none: the smallest k that reaches it, else k_max)

  with the drafter's cost counted in D-wide weight rows read per token (`body_rows`: its
  layers' parameters / D; the head adds k rows; the paper counts FLOPs, 2x both). The paper
  searches k with Optuna's TPE; the utility is one-dimensional and cheap, so every k is
  evaluated here and the argmax is exact. Returns {"k", "coverage", "saved", "utility"} at k*
  and the inputs."""
  counts = np.asarray(counts, np.float64)
  V = counts.size
  if counts.ndim != 1 or V == 0 or counts.sum() <= 0:
    raise SubsetError("the counts are empty or all zero: empty calibration set?")
  if not 0 <= alpha <= 1:
    raise SubsetError(f"{alpha=} must be in [0, 1] (the weight of coverage)")
  if not 0 <= min_coverage <= 1:
    raise SubsetError(f"{min_coverage=} must be in [0, 1]")
  if body_rows < 0:
    raise SubsetError(f"{body_rows=} must be >= 0")
  k_max = V if k_max is None else k_max
  if not 1 <= k_min <= k_max <= V:
    raise SubsetError(f"the k range [{k_min}, {k_max}] must lie in [1, V={V}]")
  cov = np.cumsum(np.sort(counts)[::-1]) / counts.sum()  # C(k) at index k - 1
  ks = np.arange(k_min, k_max + 1)
  C = cov[ks - 1]
  R = 1.0 - (body_rows + ks) / (body_rows + V)
  U = alpha * C + (1 - alpha) * R
  ok = C >= min_coverage - 1e-12
  if ok.any():
    i = int(np.argmax(np.where(ok, U, -np.inf)))
  else:  # the range cannot reach the coverage asked for: its largest k
    i = len(ks) - 1
  return {"k": int(ks[i]), "coverage": float(C[i]), "saved": float(R[i]),
          "utility": float(U[i]), "alpha": alpha, "min_coverage": min_coverage,
          "body_rows": int(body_rows), "k_range": [int(k_min), int(k_max)]}


# --- the trimmed drafter head (VocabTrim, FR-Spec) ---------------------------------------
# Trimmed drafter LM head over a static vocabulary subset (VocabTrim, FR-Spec).
#
# Letters: B batch, D drafter hidden size, K subset size, V target vocabulary.
#
# `attach_subset` stores, beside the drafter's params (one pytree, so the compiled step takes the
# trimmed rows as an argument and not as a baked-in constant):
#   head [K, D]  the drafter's LM-head rows of the subset's ids (a copy: K*D values)
#   ids  [K]     int32 target ids of those rows, ascending (d2t applied: ids = arange(K) + d2t)
# `static_policy(params, h)` is the vocabulary policy (`vocabjax.vocab.policy`): the K subset
# logits z = h . head^T (K*D multiply-adds instead of V*D) and their target ids. Drafting picks
# among the K, maps the pick to its target id and embeds that target id next step; q is the
# trimmed distribution, zero outside the subset once scattered into the full vocabulary.
#
# Why this stays lossless: a token outside the subset is never drafted (q = 0), and the residual
# max(p - q, 0) hands it the target's probability p(x) in full; greedy verification ignores q.

@dataclasses.dataclass(frozen=True)
class HeadRows:
  """A drafter head that is a subset already: its own LM-head `rows` [K, D] for target `ids`
  [K] (an EAGLE-3 head's reduced vocabulary, ids = j + d2t[j]). The same `attach` as
  `VocabSubset`, without taking rows out of a full head."""

  rows: jax.Array
  ids: jax.Array

  @property
  def size(self) -> int:
    return int(self.rows.shape[0])

  @property
  def head_rows(self) -> int:
    return self.size

  def attach(self, params: dict, config: LlamaLikeConfig, mesh=None):
    del config, mesh  # the rows are given (and replicated on a mesh)
    return attach_rows(params, self.rows, self.ids), static_policy


def attach_subset(params: dict, config: LlamaLikeConfig, subset: VocabSubset) -> dict:
  """The drafter's params plus its trimmed head for `subset` (see the trimmed-head notes)."""
  if subset.vocab_size != config.vocab_size:
    raise SubsetError(f"the subset is over a vocabulary of {subset.vocab_size} tokens but the "
                      f"drafter has V={config.vocab_size}: counted with another tokenizer?")
  ids = jnp.asarray(np.asarray(subset.ids), jnp.int32)
  U, scale = lm_head_rows(params, config)
  rows = U.take(ids) if is_blocks(U) else jnp.take(U, ids, axis=0)  # blocks stay blocks
  return attach_rows(params, rows, ids,
                     None if scale is None else jnp.take(scale, ids, axis=0))


def attach_rows(params: dict, rows: jax.Array, ids: jax.Array,
                scale: jax.Array | None = None) -> dict:
  """`params` plus a trimmed head of given LM-head `rows` [K, D] for target `ids` [K] (and
  int8 rows' `scale` [K]): what `attach_subset` stores, for a head whose rows are already the
  subset's (an EAGLE-3 head's own reduced vocabulary)."""
  sub = {"head": rows, "ids": jnp.asarray(ids, jnp.int32)}
  if scale is not None:  # int8 rows keep their scales
    sub["scale"] = scale
  return with_policy_state(params, sub)


def subset_rows(params: dict) -> int | None:
  """K of an attached subset, or None for a full head."""
  sub = policy_state(params)
  return None if sub is None or "head" not in sub else int(sub["head"].shape[0])


def static_policy(params: dict, hidden: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(target ids [..., K], logits [..., K]) over the attached subset (f32 accumulation)."""
  sub = policy_state(params)
  # the CPU kernel streams the K rows once (f32 out)
  z = linear(hidden, sub["head"], sub.get("scale"), lowering=lowering_of(params))
  return jnp.broadcast_to(sub["ids"], z.shape), z
