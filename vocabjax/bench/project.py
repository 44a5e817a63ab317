"""Projected decoding speed: a recorded eval run's steps (how many tokens each method's steps
produced, which does not depend on the machine for greedy decoding) combined with the engine
benchmark's program times on another device (`vocabjax.bench.run`).

For each method of the run, one step on the benchmark's device costs
  ar                         target(T=1)
  pld                        target(T = candidates * gamma + 1)        (host lookup not counted)
  chain, tree, vocabtrim,    target(T = verified tokens) + for each drafter call (T, rows) of a
  frspec, specvocab          step (the run's `splits.json`): drafter_body(T) + drafter_head(rows)
                             with the method's head (full, trim:K, specvocab:k)
and its projected decode speed is sum(tokens - 1) / (sum(steps) x step time) over the run's
questions (a question's first token comes from the prefill, which is left out on both sides).
Program times come from the benchmark's rows of the same batch size and dtype, linearly
interpolated in T, head rows and K between measured points (said in the `note` column).
EAGLE / Medusa heads and cross-vocabulary drafters are not among the benchmark's programs:
those methods are listed as not projected. Everything here is a projection: it leaves out the
host loop, acceptance and cache bookkeeping between programs, and dispatch gaps, which the
real engine (one compiled program per step) has in its own measure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from vocabjax.bench.engine import BenchError
from vocabjax.io import read_jsonl

_DRAFTED = ("chain", "tree", "vocabtrim", "frspec", "specvocab")
_NOT_BENCHED = {"eagle": "an EAGLE-3 head drafts (not among the benchmark's programs)",
                "eagle_pld": "an EAGLE-3 head and prompt lookup draft (not among the "
                             "benchmark's programs)",
                "medusa": "Medusa heads draft (not among the benchmark's programs)",
                "crossvocab": "a cross-vocabulary drafter with its translation (not among the "
                              "benchmark's programs)"}


def interpolate(points: dict[float, float], x: float) -> tuple[float, str]:
  """(y at x, "" | "interpolated" | "extrapolated") from measured points {x: y}, linear."""
  if not points:
    raise BenchError("no measured points to interpolate")
  if x in points:
    return points[x], ""
  xs = sorted(points)
  if len(xs) == 1:
    return points[xs[0]], "extrapolated"
  lo = max([p for p in xs if p < x], default=None)
  hi = min([p for p in xs if p > x], default=None)
  how = "interpolated"
  if lo is None:
    lo, hi, how = xs[0], xs[1], "extrapolated"
  elif hi is None:
    lo, hi, how = xs[-2], xs[-1], "extrapolated"
  y = points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
  return max(y, 0.0), how


class BenchTimes:
  """Lookups of program times in a benchmark's rows, for one batch size."""

  def __init__(self, rows: list[dict], B: int):
    self.rows = [r for r in rows if r["B"] == B]
    self.B = B
    if not self.rows:
      raise BenchError(f"the benchmark has no rows at batch size B={B}; measured: "
                       f"{sorted({r['B'] for r in rows})}")

  def _points(self, model, dtype, program, head="") -> dict[int, float]:
    return {r["T"]: r["s"] for r in self.rows if r["model"] == model and r["dtype"] == dtype
            and r["program"] == program and r["head"] == head}

  def _need(self, pts, what):
    if not pts:
      have = sorted({(r["model"], r["dtype"], r["program"], r["head"]) for r in self.rows})
      raise BenchError(f"the benchmark has no rows for {what} at B={self.B}; it has {have}")
    return pts

  def target(self, model, dtype, T) -> tuple[float, str]:
    return interpolate(self._need(self._points(model, dtype, "target"),
                                  f"target {model} {dtype}"), T)

  def body(self, model, dtype, T) -> tuple[float, str]:
    return interpolate(self._need(self._points(model, dtype, "drafter_body"),
                                  f"drafter body {model} {dtype}"), T)

  def head(self, model, dtype, rows, kind, size, vocab_size) -> tuple[float, str]:
    """The drafter head `kind` (full | trim | specvocab) of `size` candidates over `rows`."""
    heads = {r["head"] for r in self.rows if r["model"] == model and r["dtype"] == dtype
             and r["program"] == "drafter_head"}
    if kind == "full" or (kind == "trim" and size >= vocab_size):
      return interpolate(self._need(self._points(model, dtype, "drafter_head", "full"),
                                    f"full head {model} {dtype}"), rows)
    # time over K (or k) at these rows: every measured size of this kind (full = K of V)
    by_size, notes = {}, set()
    for h in heads:
      hk, _, hs = h.partition(":")
      if hk == kind or (kind == "trim" and hk == "full"):
        n = vocab_size if hk == "full" else int(hs)
        by_size[n], how = interpolate(self._points(model, dtype, "drafter_head", h), rows)
        notes.add(how)
    self._need(by_size, f"{kind} heads {model} {dtype}")
    y, how = interpolate(by_size, size)
    notes.add(how and f"{how} in K")
    return y, " ".join(sorted(n for n in notes if n))


def _pld_step_s(times: BenchTimes, model: str, dtype: str, params: dict, recs: list[dict],
                steps: int) -> tuple[float, str]:
  """Mean seconds of a PLD step: per step target(1 + drafts) where the records list each
  step's drafts; else matched steps at their mean drafts and the others at T = 1 (records
  with the method's match counts); else every step at the largest block."""
  if steps and all(r.get("step_drafted") is not None for r in recs):
    total, hows = 0.0, set()
    for r in recs:
      for g in r["step_drafted"]:
        t, how = times.target(model, dtype, 1 + g)
        total += t
        hows.add(how)
    return total / steps, "per-step blocks" + (", target T interpolated" if any(hows) else "")
  matched = [r.get("extra", {}).get("matched_steps") for r in recs]
  if steps and all(m is not None for m in matched) and sum(matched):
    n_m = sum(matched)
    g = sum(r["drafted"] for r in recs) / n_m
    t1, _ = times.target(model, dtype, 1)
    tg, _ = times.target(model, dtype, 1 + g)
    return ((steps - n_m) * t1 + n_m * tg) / steps, (
        f"approximate: {n_m} of {steps} steps matched, at their mean {g:.2f} drafts")
  T = int(params.get("candidates", 1)) * int(params.get("gamma", 4)) + 1
  t, _ = times.target(model, dtype, T)
  return t, f"upper bound: every step at the largest block T={T} (no per-step drafts recorded)"


def _head_of(method: dict) -> tuple[str, int]:
  """(kind, size) of a drafting method's head from its summary entry."""
  m, p = method["method"], method.get("params") or {}
  if m == "specvocab":
    return "specvocab", int(p["k"])
  if m in ("vocabtrim", "frspec") or (m in ("chain", "tree") and p.get("subset")):
    return "trim", int(method["draft_vocab_size"])
  return "full", 0


def project(run_dir: str | os.PathLike, bench: dict, *, batch: int = 1,
            target_model: str | None = None, draft_model: str | None = None,
            dtype: str | None = None, draft_dtype: str | None = None) -> dict:
  """Projected decode tokens/s and speedup over plain decoding of every method of the eval run
  in `run_dir` (its summary.json, splits.json and questions.jsonl), from `bench` (a
  bench.json). The models default to the run's; naming others applies the run's steps to
  them (e.g. the real pair's acceptance with an 8B target's step times)."""
  run_dir = Path(run_dir)
  try:
    summary = json.loads((run_dir / "summary.json").read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise BenchError(f"{run_dir}: no readable summary.json of an eval run ({e})") from None
  splits_path = run_dir / "splits.json"
  splits = json.loads(splits_path.read_text()) if splits_path.exists() else {}
  records = [r for r in read_jsonl(run_dir / "questions.jsonl", BenchError)
             if r.get("framework") == "vocabjax"]
  cfg = summary["config"]
  target_model = target_model or cfg["target"]
  draft_model = draft_model or cfg.get("draft")
  bench_dtypes = list(dict.fromkeys(r["dtype"] for r in bench["rows"]))
  dtype = dtype or (cfg.get("dtype") if cfg.get("dtype") in bench_dtypes else bench_dtypes[0])
  draft_dtype = draft_dtype or (cfg.get("draft_dtype") if cfg.get("draft_dtype") in bench_dtypes
                                else dtype)
  times = BenchTimes(bench["rows"], batch)
  models = bench["meta"].get("models", {})
  if draft_model and draft_model not in models:
    raise BenchError(f"the benchmark did not run the drafter {draft_model!r}; it ran "
                     f"{sorted(models)}")
  vocab = models[draft_model]["vocab_size"] if draft_model else 0
  out = []
  for m in summary["methods"]:
    if m["framework"] != "vocabjax":
      continue
    recs = [r for r in records if r["method"] == m["name"]]
    tokens = sum(r["num_tokens"] - 1 for r in recs)
    steps = sum(r["steps"] or 0 for r in recs)
    decode_s = sum(r["decode_s"] or 0.0 for r in recs)
    row = {"name": m["name"], "method": m["method"], "questions": len(recs), "tokens": tokens,
           "steps": steps, "tokens_per_step": tokens / steps if steps else None,
           "measured_decode_tok_s": tokens / decode_s if decode_s else None,
           "step_s": None, "projected_tok_s": None, "note": ""}
    notes = []
    kind = m["method"]
    if kind in _NOT_BENCHED:
      row["note"] = "not projected: " + _NOT_BENCHED[kind]
    elif kind == "ar":
      row["step_s"], how = times.target(target_model, dtype, 1)
      notes.append(how)
    elif kind == "pld":  # a block per step of 1 + that step's drafts (0 without a match)
      row["step_s"], note = _pld_step_s(times, target_model, dtype, m.get("params") or {},
                                        recs, steps)
      notes.append(note)
    elif kind in _DRAFTED:
      split = splits.get(m["name"])
      if split is None:
        row["note"] = "not projected: the run has no step split for it (time_split off)"
      else:
        T = split["verify_tokens"]
        s, how = times.target(target_model, dtype, T)
        notes.append(how and f"target T={T} {how}")
        hk, size = _head_of(m)
        for t_call, rows in split["drafter_calls"]:
          b, how = times.body(draft_model, draft_dtype, t_call)
          s += b
          notes.append(how and f"drafter T={t_call} {how}")
          if rows:
            h, how = times.head(draft_model, draft_dtype, rows, hk, size, vocab)
            s += h
            notes.append(how and f"head {how}")
        row["step_s"] = s
    else:
      row["note"] = f"not projected: unknown method {kind!r}"
    if row["step_s"] is not None and steps:
      row["projected_tok_s"] = batch * tokens / (steps * row["step_s"])
      row["note"] = "; ".join(sorted({n for n in notes if n}))
    out.append(row)
  ar = next((r for r in out if r["method"] == "ar"), None)
  for r in out:
    base = ar and ar["projected_tok_s"]
    r["projected_speedup"] = (r["projected_tok_s"] / base
                              if base and r["projected_tok_s"] else None)
    mb = ar and ar["measured_decode_tok_s"]
    r["measured_speedup"] = (r["measured_decode_tok_s"] / mb
                             if mb and r["measured_decode_tok_s"] else None)
  return {"run": str(run_dir), "run_target": cfg["target"], "run_draft": cfg.get("draft"),
          "run_machine": summary.get("environment", {}).get("cpu") or summary.get(
              "environment", {}).get("machine"),
          "run_dtype": cfg.get("dtype"), "run_draft_dtype": cfg.get("draft_dtype"),
          "target": target_model, "draft": draft_model, "dtype": dtype,
          "draft_dtype": draft_dtype, "batch": batch, "device": bench["meta"]["device"],
          "bench_command": bench["meta"].get("command"), "methods": out}


def render(proj: dict, command: str = "") -> str:
  """The projection as a markdown table, every figure labelled projected or measured."""
  dev = proj["device"]
  where = dev.get("host_cpu") if dev.get("backend") == "cpu" else dev.get("device")
  lines = [f"# PROJECTED decoding speed on {where} ({dev.get('backend')})", "",
           f"`{command}`  " if command else "",
           f"Steps and tokens from the eval run `{proj['run']}` ({proj['run_target']} <- "
           f"{proj['run_draft']}, {proj['run_dtype'] or 'default dtype'}, drafter "
           f"{proj['run_draft_dtype'] or 'same'}, recorded on "
           f"{proj['run_machine'] or 'its machine'}); program "
           f"times from `{proj['bench_command']}` for {proj['target']} <- {proj['draft']}, "
           f"{proj['dtype']} (drafter {proj['draft_dtype']}), batch {proj['batch']}. Projected "
           f"= tokens / (steps x one step's programs): not a measurement (module doc of "
           f"vocabjax.bench.project).", "",
           "| method | questions | tokens / step | projected step ms | PROJECTED tok/s | "
           "PROJECTED speedup | measured tok/s (run) | measured speedup (run) | note |",
           "|---|---|---|---|---|---|---|---|---|"]

  def f(v, fmt):
    return "-" if v is None else format(v, fmt)

  for r in proj["methods"]:
    lines.append(f"| {r['name']} | {r['questions']} | {f(r['tokens_per_step'], '.2f')} | "
                 f"{f(r['step_s'] and 1e3 * r['step_s'], '.2f')} | "
                 f"{f(r['projected_tok_s'], '.1f')} | {f(r['projected_speedup'], '.2f')} | "
                 f"{f(r['measured_decode_tok_s'], '.2f')} | {f(r['measured_speedup'], '.2f')} | "
                 f"{r['note']} |")
  return "\n".join(line for line in lines) + "\n"
