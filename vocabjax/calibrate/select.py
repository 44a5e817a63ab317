"""From calibration counts to a saved static subset, checked against the target's tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vocabjax.calibrate.counts import CalibrationError, Counts, special_ids, tokenizer_identity
from vocabjax.checkpoints.convert import CheckpointError
from vocabjax.checkpoints.eagle2 import load_head_config
from vocabjax.checkpoints.known import resolve_config
from vocabjax.checkpoints.loader import load_tokenizer_and_vocab
from vocabjax.vocab.incontext import save_index, successor_index
from vocabjax.vocab.subset import VocabSubset, coverage_latency, select


def subset_for(counts: Counts, tokenizer, vocab_size: int, eos_token_ids=(), *, k=None,
               top_p=None, min_count=None) -> VocabSubset:
  """Select a subset from `counts` for a model with this tokenizer and V, keeping EOS and the
  tokenizer's special tokens. Counts of another tokenizer or vocabulary are refused."""
  tok_id = tokenizer_identity(tokenizer)
  if counts.meta.get("tokenizer_id") != tok_id:
    raise CalibrationError(f"counts made with tokenizer {counts.meta.get('tokenizer_id')!r} "
                           f"cannot select a subset for a model with tokenizer {tok_id!r}")
  if counts.vocab_size != vocab_size:
    raise CalibrationError(f"counts over {counts.vocab_size} tokens, the model has "
                           f"V={vocab_size}")
  keep = [i for i in special_ids(tokenizer, eos_token_ids) if i < vocab_size]
  return select(counts.counts, k=k, top_p=top_p, min_count=min_count, keep=keep,
                tokenizer_id=tok_id,
                meta={"counts_source": counts.meta.get("source", ""),
                      "counts_kind": counts.meta.get("kind", ""),
                      "counts_fingerprint": counts.meta.get("fingerprint", "")})


def subset_from_counts(counts_path: str | Path, model: str, **rule) -> VocabSubset:
  """`subset_for` with the tokenizer and V of `model` (a registry name, HF dir or GGUF)."""
  tokenizer, V = load_tokenizer_and_vocab(model)
  eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
  return subset_for(Counts.load(counts_path), tokenizer, V, eos, **rule)


def load_or_select(counts_path: str | Path, tokenizer, vocab_size: int, eos_token_ids=(), *,
                   k: int) -> VocabSubset:
  """The top-k subset of a counts file, saved beside it as `subset-k{k}.npz` on first use and
  reloaded afterwards; a saved subset that no longer matches the counts is an error, never
  silently regenerated (delete it to reselect)."""
  counts_path = Path(counts_path)
  fresh = subset_for(Counts.load(counts_path), tokenizer, vocab_size, eos_token_ids, k=k)
  path = counts_path.with_name(f"subset-k{k}.npz")
  if path.exists():
    saved = VocabSubset.load(path, tokenizer_id=fresh.tokenizer_id)
    if saved.size != fresh.size or (saved.ids != fresh.ids).any():
      raise CalibrationError(f"{path} differs from the top-{k} subset of {counts_path} (the "
                             f"counts changed?); delete it to reselect")
    return saved
  fresh.save(path)
  return fresh


def drafter_body_rows(config) -> int:
  """A drafter's weights read per drafted token besides its LM head, in D-wide rows (its
  layers, no embedding lookup): the cost `coverage_latency` weighs the head's k rows against.
  `config`: a model's `LlamaLikeConfig`, or a head's config with `num_params(head_rows)`."""
  D = config.hidden_size
  try:
    body = config.num_params(include_embedding=False, head_rows=0)
  except TypeError:  # an EAGLE / DFlash head's config: its own layers, no embedding
    body = config.num_params(head_rows=0)
  return -(-body // D)


def coverage_latency_subset(counts_path: str | Path, model: str, drafter: str, *,
                            alpha: float = 0.5, min_coverage: float = 0.0, k_min: int = 50,
                            k_max: int | None = None, head: bool = False
                            ) -> tuple[VocabSubset, dict]:
  """(the top-k* subset of `counts_path` for `model`'s tokenizer, the choice): k* from
  `coverage_latency` with the cost of `drafter` (a KNOWN name, config.json, GGUF or cached
  registry model: `vocabjax.checkpoints.known.resolve_config`; with `head`, an EAGLE-1/2/3 or
  P-EAGLE head directory, whose cost per drafted token is its one layer and fc)."""
  counts = Counts.load(counts_path)
  if head:
    try:
      config = load_head_config(drafter)
    except CheckpointError as e:
      raise ValueError(f"--head {drafter}: {e}") from None
  else:
    _, config = resolve_config(drafter)
  choice = coverage_latency(counts.counts, body_rows=drafter_body_rows(config), alpha=alpha,
                            min_coverage=min_coverage, k_min=k_min, k_max=k_max)
  sub = subset_from_counts(counts_path, model, k=choice["k"])
  meta = {**dict(sub.meta), "rule": f"coverage_latency(alpha={alpha}, "
          f"min_coverage={min_coverage}) k={choice['k']}", "coverage": choice["coverage"],
          "saved": choice["saved"], "drafter": drafter, "body_rows": choice["body_rows"],
          **({"drafter_kind": "head"} if head else {})}
  return VocabSubset(ids=sub.ids, vocab_size=sub.vocab_size, tokenizer_id=sub.tokenizer_id,
                     meta=tuple(sorted(meta.items()))), choice


def completion_sequences(paths) -> list[list[int]]:
  """The `completion_ids` of completion records (jsonl: what `python -m vocabjax.calibrate
  count --generate` and the training data builders write); a bad line names its file and line."""
  import json

  out = []
  for p in paths:
    p = Path(p)
    if not p.is_file():
      raise CalibrationError(f"no completions file at {p}")
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
      if not line.strip():
        continue
      try:
        ids = json.loads(line)["completion_ids"]
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
          raise TypeError("completion_ids must be integers")
      except (ValueError, KeyError, TypeError) as e:
        raise CalibrationError(f"{p}:{i + 1} is not a completion record ({e})") from None
      out.append(ids)
  if not out:
    raise CalibrationError(f"no completion records in {[str(p) for p in paths]}: an empty "
                           f"calibration set")
  return out


def successor_index_from(paths, model: str, counts_path: str | Path, core: int, n: int,
                         out: str | Path) -> tuple[Path, dict]:
  """EvoSpec's successor index of the completions in `paths` for `model`'s tokenizer, the core
  (the top-`core` subset of `counts_path`, whose tokens are always candidates) left out; saved
  atomically to `out`. Returns (path, summary)."""
  tokenizer, V = load_tokenizer_and_vocab(model)
  sub = subset_from_counts(counts_path, model, k=core)
  seqs = completion_sequences(paths)
  exclude = np.zeros(V, bool)
  exclude[np.asarray(sub.ids)] = True
  idx = successor_index(seqs, V, n, exclude=exclude)
  summary = {"n": n, "core": core, "sequences": len(seqs),
             "tokens": int(sum(len(s) for s in seqs)),
             "indexed_tokens": int((idx[:, 0] >= 0).sum()),
             "sources": [str(p) for p in paths], "counts": str(counts_path)}
  return save_index(out, idx, tokenizer_id=tokenizer_identity(tokenizer), meta=summary), summary
