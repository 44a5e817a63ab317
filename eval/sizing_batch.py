"""Speculation that sizes itself, by batch size: where verification turns compute bound the
rule (`vocabjax.decoding.sizing`) shortens the drafts or steps aside, and a per-batch-size table
learned from the rule's own figures makes each batch size take its best length.

The registry pair (Qwen2.5-Coder-1.5B target and 0.5B drafter, each in `--target-dtype` /
`--draft-dtype`: default the target's GGUF blocks, the drafter int8), greedy, no EOS stop. For
each batch size every method runs on the same rows (Spec-Bench prompts, chat-wrapped, at most
`--max-prompt-tokens` tokens, round-robin over the task groups), in consecutive batches of that
size: fixed, self-sized (the online rule; plain steps in the plain decoder's program), and with
`sizing_table` = the table the self-sized run just measured at that batch size
(`SpeculativeEngine.learned_table`: a calibration run, then the table). Reported per batch size
and method: decode tokens/s (new tokens of all rows / decode time summed over the batches;
prefill and compilation left out), speedup over plain decoding at the same batch size, tau, and
for a sized method the rule's inputs as it left them (acceptance, the measured step cost c(n)
per length) and its choices. Greedy outputs are checked equal to plain decoding's.

    python eval/sizing_batch.py --out eval/results/sizing_batch
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from vocabjax.eval.provenance import cpu_model
from vocabjax.io import atomic_write_text
from vocabjax.methods import METHODS

from pair_study import add_pair_args, pair_setup  # noqa: E402 (the script's directory)

# (name, registry method, parameters): each drafter with and without the rule
RUNS = (
    ("ar", "ar", {}),
    ("chain_g3", "chain", {"gamma": 3}),
    ("chain_g3_sized", "chain", {"gamma": 3, "self_sizing": True}),
    ("chain_g3_table", "chain", {"gamma": 3, "sizing_table": "chain_g3_sized"}),
    ("tree_k2_d4_n8", "tree", {"top_k": 2, "depth": 4, "total_tokens": 8}),
    ("tree_sized", "tree", {"top_k": 2, "depth": 4, "total_tokens": 8, "self_sizing": True}),
    ("tree_table", "tree", {"top_k": 2, "depth": 4, "total_tokens": 8,
                            "sizing_table": "tree_sized"}),
    ("suffix", "suffix", {}),
    ("suffix_sized", "suffix", {"self_sizing": True}),
    ("suffix_table", "suffix", {"sizing_table": "suffix_sized"}),
)
# a run's "sizing_table" names the self-sized run whose learned table (so far: this batch size's
# entry and the smaller ones') it takes; that run must come first in --methods


def _rule(r: dict) -> str:
  """A result row's sizing cell: its table, the rule's acceptance and costs, its choices."""
  parts = [f"table {r['table']}"] if r.get("table") else []
  sz = r.get("sizing") or {}
  order = lambda d: sorted(d.items(), key=lambda x: int(x[0]))  # noqa: E731
  if sz.get("cost_s"):
    parts.append(f"a {sz['acceptance']:.2f}; c(n) " +
                 ", ".join(f"{n}: {1000 * c:.0f}" for n, c in order(sz["cost_s"])))
  if sz.get("choices"):
    parts.append("chose " + ", ".join(f"{n}: {c}" for n, c in order(sz["choices"])))
  return "; ".join(parts)


def _decode(decs, rows, B, max_new_tokens, interleave=False):
  """{name: (outputs, decode seconds summed over the batches, steps, accepted, stats of each
  batch)} for `decs` ({name: decoder}): each method over every batch in turn, or with
  `interleave` every method on a batch before the next batch (the order rotated batch by batch,
  so the host's drift over minutes falls on every method alike)."""
  got = {name: ([], 0.0, 0, 0, []) for name in decs}
  names = list(decs)
  chunks = list(range(0, len(rows), B))
  plan = ([(name, i) for j, i in enumerate(chunks)
           for name in names[j % len(names):] + names[:j % len(names)]] if interleave else
          [(name, i) for name in names for i in chunks])
  for name, i in plan:
    outs, secs, steps, acc, stats = got[name]
    res = decs[name].generate(rows[i:i + B], max_new_tokens=max_new_tokens, eos_token_ids=())
    outs.extend(res.tokens)
    secs += res.decode_s
    s = res.stats
    if s is not None and hasattr(s, "accepted"):
      steps += sum(1 for row in s.active for a in row if a)
      acc += sum(map(sum, s.accepted))
      stats.append(s)
    got[name] = (outs, secs, steps, acc, stats)
  return got


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  add_pair_args(ap, RUNS, prompts_flag="--rows", prompts=8, max_new_tokens=48)
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
  ap.add_argument("--tables", nargs="+", default=[], metavar="RUN=TABLE",
                  help="a *_table run's table given, not learned (e.g. chain_g3_table=1:3,4:2): "
                  "its self-sized run need not come first")
  ap.add_argument("--repeats", type=int, default=1,
                  help="rounds over every batch size and method, interleaved; the table gives "
                  "each cell's median and its spread")
  ap.add_argument("--interleave", action="store_true",
                  help="run every method on a batch before the next batch (the order rotated): "
                  "the host's drift falls on every method alike; a *_table run then needs its "
                  "table given (--tables)")
  ap.add_argument("--pooled", metavar="JSON", help="print a recorded run's pooled speedups "
                  "(its sizing_batch.json, --repeats > 1) and exit")
  a = ap.parse_args(argv)
  if a.pooled:
    got = pooled(json.loads(Path(a.pooled).read_text())["results"])
    print("| batch | method | speedup over AR, rounds pooled |\n|---|---|---|")
    for (B, name), x in got.items():
      print(f"| {B} | {name} | {x:.3f}x |")
    return 0
  runs, out, target, draft, rows, qids, commit = pair_setup(a, RUNS)
  given = {}
  for item in a.tables:
    name, sep, table = item.partition("=")
    if not sep or name not in {r[0] for r in runs if "sizing_table" in r[2]}:
      raise SystemExit(f"--tables {item!r}: give RUN=TABLE for a *_table run of --methods")
    given[name] = table
  if a.repeats < 1:
    raise SystemExit(f"--repeats {a.repeats}: at least 1")
  for name, _, params in runs:
    if name in given:
      continue
    if "sizing_table" in params and a.interleave:
      raise SystemExit(f"--interleave: give {name}'s table (--tables {name}=BATCH:LENGTH,...); "
                       f"it cannot learn it from a run beside it")
    if "sizing_table" in params and params["sizing_table"] not in a.methods[:a.methods.index(name)]:
      raise SystemExit(f"--methods: {name} takes the table {params['sizing_table']} learns; "
                       f"run that one before it")
  cmd = (f"python eval/sizing_batch.py --batches {' '.join(map(str, a.batches))} "
         f"--rows {a.prompts} --max-prompt-tokens {a.max_prompt_tokens} --max-new-tokens "
         f"{a.max_new_tokens} --methods {' '.join(a.methods)}"
         + (f" --target-dtype {a.target_dtype}" if a.target_dtype else "")
         + f" --draft-dtype {a.draft_dtype}"
         + (f" --tables {' '.join(a.tables)}" if a.tables else "")
         + (f" --repeats {a.repeats}" if a.repeats > 1 else "")
         + (" --interleave" if a.interleave else "") + f" --out {a.out}")
  results, learned = [], {}  # learned: a self-sized run's table, batch size by batch size

  def make(name, method, params):
    """(params with its table resolved, the decoder): a given table, or the one its
    calibration run measured so far."""
    if name in given:
      params = {**params, "sizing_table": given[name]}
    elif "sizing_table" in params:
      params = {**params, "sizing_table": ",".join(
          f"{b}:{n}" for b, n in sorted(learned[params["sizing_table"]].items()))}
    return params, METHODS[method].make(target, draft if METHODS[method].needs_draft else None,
                                        params)

  for rnd, B in [(r, B) for r in range(a.repeats) for B in a.batches]:
    ref = None
    if a.interleave:  # every table given: the decoders made at once, run side by side
      made = {name: make(name, method, params) for name, method, params in runs}
      t0 = time.perf_counter()
      got = _decode({name: dec for name, (_, dec) in made.items()}, rows, B,
                    a.max_new_tokens, interleave=True)
      wall = time.perf_counter() - t0  # the round's, every method's together
    for name, method, params in runs:
      if a.interleave:
        params, dec = made[name]
      else:  # one method after another: a *_table run takes what the runs before it learned
        params, dec = make(name, method, params)
        t0 = time.perf_counter()
        got = _decode({name: dec}, rows, B, a.max_new_tokens)
        wall = time.perf_counter() - t0
      outs, secs, steps, acc, stats = got[name]
      if ref is None:
        ref = outs
      if params.get("self_sizing"):
        learned.setdefault(name, {}).update(dec.learned_table())
      row = {"round": rnd, "batch": B, "method": name,
             "tok_s": len(rows) * (a.max_new_tokens - 1) / secs,
             "decode_s": secs, "wall_s": wall, "equal_ar": outs == ref,
             "tau": (acc + steps) / steps if steps else None}
      if "sizing_table" in params:
        row["table"] = params["sizing_table"]
      sized = [s.record().get("sizing") for s in stats if s.record().get("sizing")]
      if sized:
        row["sizing"] = sized[-1]  # the rule's inputs as the last batch left them
        choices: dict = {}
        for rec in sized:
          for n, c in rec["choices"].items():
            choices[n] = choices.get(n, 0) + c
        row["sizing"]["choices"] = choices  # every batch's
      results.append(row)
      print(f"[sizing_batch] round {rnd + 1}/{a.repeats} B={B} {name}: {row['tok_s']:.2f} "
            f"tok/s, tau {row['tau']}, "
            f"equal {row['equal_ar']}, {row.get('sizing', {}).get('choices', '')}", flush=True)
  results = merged(results) if a.repeats > 1 else results
  by = {(r["batch"], r["method"]): r for r in results}
  lines = ["# Self-sizing by batch size", "",
           f"Command: `{cmd}`; commit `{commit}`; host {platform.processor() or platform.machine()}"
           f" ({cpu_model()}); target {a.target} {a.target_dtype or 'gguf (its file)'}, "
           f"drafter {a.draft} {a.draft_dtype}, "
           f"greedy, no EOS stop. Rows ({len(rows)}, prompt lengths {min(map(len, rows))}-"
           f"{max(map(len, rows))} tokens): {', '.join(qids)}; every batch size decodes all of "
           f"them in consecutive batches. tok/s = new tokens of all rows / decode time summed "
           f"over the batches (prefill and compilation left out).", "",
           "| batch | method | tok/s | speedup over AR | tau | equal AR | sizing: acceptance, "
           "c(n) ms, choices |", "|---|---|---|---|---|---|---|"]
  pooled_x = pooled(results) if any("rounds" in r for r in results) else {}
  for r in results:
    ar = by[(r["batch"], "ar")]["tok_s"]
    rule = _rule(r)
    tau = f"{r['tau']:.2f}" if r["tau"] else "-"
    tok = f"{r['tok_s']:.2f}"
    speed = f"{r['tok_s'] / ar:.2f}x"
    if "rounds" in r:  # the median of the rounds, then their range; speedups round by round,
      # and pooled: every round's decode time summed
      tok += f" ({min(r['rounds']):.2f}-{max(r['rounds']):.2f})"
      sp = [t / a_ for t, a_ in zip(r["rounds"], by[(r["batch"], "ar")]["rounds"])]
      speed = (f"{sorted(sp)[len(sp) // 2]:.2f}x ({min(sp):.2f}-{max(sp):.2f}; pooled "
               f"{pooled_x[(r['batch'], r['method'])]:.3f}x)")
    lines.append(f"| {r['batch']} | {r['method']} | {tok} | {speed} | "
                 f"{tau} | {r['equal_ar']} | {rule} |")
  if learned:  # what a calibration run hands a later one (--tables)
    lines += ["", "Learned tables (BATCH:LENGTH, for `--tables`): " + " ".join(
        f"`{name.replace('_sized', '_table')}={','.join(f'{b}:{n}' for b, n in sorted(t.items()))}`"
        for name, t in learned.items())]
  atomic_write_text(out / "sizing_batch.md", "\n".join(lines) + "\n")
  atomic_write_text(out / "sizing_batch.json", json.dumps(
      {"command": cmd, "commit": commit, "rows": qids, "results": results,
       "learned_tables": learned}, indent=1,
      default=str) + "\n")
  print("\n".join(lines))
  return 0


def pooled(results: list[dict]) -> dict:
  """{(batch, method): speedup over plain decoding over all rounds together}: plain decoding's
  decode seconds summed over the rounds over the method's (every round decodes the same
  tokens, so the sums are 1 / tok/s summed), from `merged` rows."""
  ar = {r["batch"]: r["rounds"] for r in results if r["method"] == "ar"}
  return {(r["batch"], r["method"]): sum(1 / t for t in ar[r["batch"]]) /
          sum(1 / t for t in r["rounds"]) for r in results if "rounds" in r}


def merged(results: list[dict]) -> list[dict]:
  """One row per (batch, method) from the rounds' rows: tok/s the median round's (its other
  fields with it), `rounds` every round's tok/s in order, equal_ar only if every round's was."""
  cells: dict = {}
  for r in results:
    cells.setdefault((r["batch"], r["method"]), []).append(r)
  out = []
  for rows in cells.values():
    mid = sorted(rows, key=lambda r: r["tok_s"])[len(rows) // 2]
    out.append({**mid, "rounds": [r["tok_s"] for r in rows],
                "equal_ar": all(r["equal_ar"] for r in rows)})
  return out


if __name__ == "__main__":
  raise SystemExit(main())
