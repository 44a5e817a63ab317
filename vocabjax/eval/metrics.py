"""Every eval metric, defined once (DESIGN.md "Metrics").

Per question (one record of `questions.jsonl`) and aggregated over any set of records:
- tau, acceptance length: tokens emitted per target verification, bonus included (Spec-Bench's
  "mean accepted tokens"; autoregressive = 1.00). Aggregated over steps: sum(accepted + steps)
  / sum(steps).
- acceptance rate: accepted drafts / proposed drafts.
- tokens/s: generated tokens / (prefill + decode) wall time, compilation excluded.
- speedup: method throughput / autoregressive throughput on the same questions and seeds in the
  same run; aggregated as the ratio of total tokens / total time (Spec-Bench).
- decode speedup: the same ratio over the decoding phase alone (tokens after the first /
  decode time; prefill, the drafter's included, left out): what a method does per generated
  token once the prompt is in the caches. On a CPU, prefill of a long prompt is compute bound
  and can take a third of a question's time, which the end-to-end speedup dilutes by.
- MBSU (VocabTrim): tau / (c * gamma + 1), c = drafter / target parameters read per token
  (embedding excluded, LM head rows counted as the drafter uses them), gamma = drafter forward
  passes per block.
- time split: drafter body, drafter LM head, verification, and the remainder (seconds).
- match rate (greedy only, Spec-Bench's equal.py): share of questions whose output ids equal the
  autoregressive output exactly.
"""

from __future__ import annotations

import math

SPLIT_KEYS = ("drafter_s", "drafter_head_s", "verification_s", "other_s", "parts_excess_s")


def record_metrics(result) -> dict:
  """The metric fields of one question's record from a GenerationResult (batch 1)."""
  wall = result.prefill_s + result.decode_s
  n = len(result.tokens[0])
  st = result.stats
  steps = result.steps
  accepted = sum(a for row in st.accepted for a in row) if st else 0
  drafted = sum(d for row in st.drafted for d in row) if st else 0
  return {"num_tokens": n, "wall_s": wall, "prefill_s": result.prefill_s,
          "decode_s": result.decode_s, "tokens_per_s": n / wall if wall > 0 else float("nan"),
          "steps": steps, "accepted": accepted, "drafted": drafted,
          "finish_reason": result.finish_reasons[0],
          # per verification step: drafts proposed and accepted (what a projection of the run
          # onto another machine needs where a step's block varies: `vocabjax.bench.project`)
          "step_drafted": [int(row[0]) for row in st.drafted] if st else None,
          "step_accepted": [int(row[0]) for row in st.accepted] if st else None}


def _nan_div(a: float, b: float) -> float:
  return a / b if b else float("nan")


def mbsu(tau: float, c: float | None, gamma: int | None) -> float | None:
  if c is None or gamma is None:
    return None
  return tau / (c * gamma + 1)


def aggregate(records: list[dict], ar_records: dict | None = None, *, greedy: bool = True,
              c: float | None = None, gamma: int | None = None) -> dict:
  """Metrics over a set of records of one method.

  `ar_records`: {(qid, seed): autoregressive record} of the same run, for speedup and match.
  """
  if not records:
    return {}
  tokens = sum(r["num_tokens"] for r in records)
  wall = sum(r["wall_s"] for r in records)
  out = {"questions": len(records), "tokens": tokens, "wall_s": wall,
         "tokens_per_s": _nan_div(tokens, wall), "tau": None, "acceptance_rate": None,
         "mbsu": None, "decode_tokens_per_s": _decode_tps(records)}
  if all(r["steps"] is not None for r in records):  # (transformers does not report steps)
    steps = sum(r["steps"] for r in records)
    accepted = sum(r["accepted"] for r in records)
    drafted = sum(r["drafted"] for r in records)
    out["tau"] = _nan_div(accepted + steps, steps) if drafted else 1.0
    if drafted:
      out.update(acceptance_rate=_nan_div(accepted, drafted), mbsu=mbsu(out["tau"], c, gamma))
  splits = [r["time_split"] for r in records if r.get("time_split")]
  out["time_split"] = ({k: sum(s.get(k, 0.0) for s in splits) for k in SPLIT_KEYS}
                       if splits and len(splits) == len(records) else None)
  if ar_records is not None:
    base = [ar_records.get((r["qid"], r["seed"])) for r in records]
    if all(b is not None for b in base):
      ar_tps = _nan_div(sum(b["num_tokens"] for b in base), sum(b["wall_s"] for b in base))
      out["speedup"] = _nan_div(out["tokens_per_s"], ar_tps)
      ar_dec = _decode_tps(base)
      out["decode_speedup"] = (_nan_div(out["decode_tokens_per_s"], ar_dec)
                               if out["decode_tokens_per_s"] is not None and ar_dec else None)
      if greedy:
        same = sum(r["output_ids"] == b["output_ids"] for r, b in zip(records, base))
        out["match_rate"] = same / len(records)
    else:
      out["speedup"] = None
  return out


def _decode_tps(records: list[dict]) -> float | None:
  """Tokens after each question's first / decode seconds (None without decode times)."""
  if not all(r.get("decode_s") is not None for r in records):
    return None
  dec = sum(r["decode_s"] for r in records)
  return _nan_div(sum(r["num_tokens"] - 1 for r in records), dec)


def is_finite(x) -> bool:
  return isinstance(x, (int, float)) and math.isfinite(x)
