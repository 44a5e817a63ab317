"""The OmniDraft table 1 / 5 analog from a `crossvocab` eval run: per method the acceptance
rate, tau, n-gram merges per verification (proposed / accepted), drafter tokens per step,
tokens/s and speedup over autoregressive (same run), exact match with AR, transformers' AR and
UAG side by side; and the n-gram cache's size and memory (OmniDraft table 4) at the end.

    python eval/crossvocab_report.py eval/results/crossvocab/eval   # writes crossvocab.md/.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def table(run: Path) -> tuple[str, dict]:
  summary = json.loads((run / "summary.json").read_text())
  records = [json.loads(line) for line in (run / "questions.jsonl").read_text().splitlines()
             if line.strip()]
  by: dict = {}
  for r in records:
    by.setdefault((r["framework"], r["method"]), []).append(r)
  ar = {r["qid"]: r for r in by.get(("vocabjax", "ar"), [])}
  t_ar = {r["qid"]: r for r in by.get(("torch", "ar"), [])}
  rows, out = [], {"methods": [], "ngram_cache": {}}
  head = ("| framework | method | params | acceptance rate | tau | n-gram merges / step "
          "(proposed / accepted) | drafter tokens / step | tok/s | speedup vs AR | "
          "output = AR |\n|---|---|---|---|---|---|---|---|---|---|")
  for m in summary["methods"]:
    fw, name = m["framework"], m["name"]
    recs = by.get((fw, name.split(":")[-1]), [])  # the summary names torch rows "torch:<m>"
    o = m["overall"]
    extra = [r["extra"] for r in recs if r.get("extra")]
    steps = sum(e["verifications"] for e in extra)
    ng = (f"{sum(e['ngram_drafted'] for e in extra) / steps:.3f} / "
          f"{sum(e['ngram_accepted'] for e in extra) / steps:.3f}" if steps else "-")
    dts = f"{sum(e['drafter_tokens'] for e in extra) / steps:.2f}" if steps else "-"
    base = ar if fw == "vocabjax" else t_ar
    same = sum(r["output_ids"] == base[r["qid"]]["output_ids"] for r in recs if r["qid"] in base)
    tok = sum(r["num_tokens"] for r in recs)
    wall = sum(r["wall_s"] for r in recs)
    base_tok = sum(base[r["qid"]]["num_tokens"] for r in recs if r["qid"] in base)
    base_wall = sum(base[r["qid"]]["wall_s"] for r in recs if r["qid"] in base)
    speed = (tok / wall) / (base_tok / base_wall) if base_wall and wall else float("nan")
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    params = ", ".join(f"{k}={v}" for k, v in m.get("params", {}).items()
                       if k != "drafter") + (" (distilled)" if m.get("params", {}).get("drafter")
                                             else "")
    rows.append(f"| {fw} | {name} | {params} | {f(o.get('acceptance_rate'))} | "
                f"{f(o.get('tau'))} | {ng} | {dts} | {tok / wall:.2f} | {speed:.2f} | "
                f"{same}/{len(recs)} |")
    out["methods"].append({"framework": fw, "name": name, "params": m.get("params", {}),
                           "acceptance_rate": o.get("acceptance_rate"), "tau": o.get("tau"),
                           "tokens_per_s": tok / wall, "speedup": speed,
                           "identical": same, "questions": len(recs),
                           "ngram_merges_per_step": (sum(e["ngram_drafted"] for e in extra)
                                                     / steps if steps else None),
                           "ngram_accepted_per_step": (sum(e["ngram_accepted"] for e in extra)
                                                       / steps if steps else None)})
    caches = [r["extra"]["ngram_cache"] for r in recs if r.get("extra", {}).get("ngram_cache")]
    if caches:
      out["ngram_cache"][name] = max(caches, key=lambda c: c["entries"])
  cache_rows = "\n".join(f"| {k} | {c['entries']} | {c['ids']} | {c['bytes_int64']} |"
                         for k, c in out["ngram_cache"].items())
  md = (f"# Cross-vocabulary drafting: {summary['models'].get('draft', {}).get('source', '')} "
        f"-> {summary['models'].get('target', {}).get('source', '')}\n\n"
        f"Run: `{run}` (suite `{summary['suite']}`, fingerprint {summary['fingerprint']}).\n\n"
        + head + "\n" + "\n".join(rows)
        + "\n\nn-gram cache at the end of the run (entries: drafter runs of >= 2 tokens -> one "
        "target token; memory as int64 ids, keys + values):\n\n| method | entries | ids | "
        "bytes |\n|---|---|---|---|\n" + cache_rows + "\n")
  return md, out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("run", type=Path)
  args = p.parse_args(argv)
  md, out = table(args.run)
  (args.run / "crossvocab.md").write_text(md)
  (args.run / "crossvocab.json").write_text(json.dumps(out, indent=1))
  print(md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
