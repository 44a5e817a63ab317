"""The papers' experiment in the papers' layout, from a `papers` eval run (configs/eval/papers*.yaml):

    python eval/papers_report.py eval/results/papers/greedy \
        [--out eval/results/papers/greedy/report.md]

Writes report.md (and tau_vs_vocab.png beside it):
- SpecVocab's layout (its tables 1-2): tau per Spec-Bench group and overall for every method,
  throughput (tokens/s) per group, and overall relative to the full-vocabulary head
  (`full_chain`) and to EAGLE-3's own 32K head (`eagle3_32k`), all from the same run;
- FR-Spec's layout: the drafting step's LM-head share (the run's timed step split) and each
  method's speedup over plain decoding and over the full-vocabulary drafter of its setting
  (`full_chain` for the EAGLE head, `lm_chain_g3` for the 0.5B drafter), and its MBSU;
- greedy identity per method (match rate against plain decoding);
- the papers' published headline figures beside ours (abstracts of the arXiv versions cited),
  with the differences of setting that matter (model size, GPU vs this CPU, head strength);
- a plot of tau and the drafter's step time against the drafting vocabulary's size (head rows).

The paragraph on where the results agree with the papers is written from the numbers by hand
after a run; this script lays the numbers out and never invents one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vocabjax.eval.published import (FRSPEC_GROUPS, FRSPEC_HEAD_SHARE, FRSPEC_TAU,
                                     FRSPEC_TAU_QWEN, FRSPEC_TOKS, PUBLISHED, SPECVOCAB_GAIN,
                                     VOCABTRIM_MBSU_GAIN)
from vocabjax.io import atomic_write_text

FULL = {"full": "full_chain", "lm": "lm_chain_g3"}  # each setting's full-vocabulary drafter



def _f(x, fmt="{:.2f}"):
  return "-" if x is None else fmt.format(x)


def _drafting_ms(split: dict | None) -> float | None:
  """One drafting step of a timed step split, the drafter's layers plus its LM head (ms)."""
  return None if not split else 1e3 * (split["drafter_s"] + split["drafter_head_s"])


def _setting(name: str) -> str:
  return "lm" if name.startswith("lm_") else "full"


def report(summary: dict) -> str:
  methods = summary["methods"]
  by = {m["name"]: m for m in methods}
  groups = summary["groups"]
  splits = summary.get("time_split_per_step") or {}
  lines = [f"# The papers' experiment: {summary['suite']}", "",
           f"Run fingerprint {summary['fingerprint']}; machine: "
           f"{summary['environment'].get('cpu') or summary['environment'].get('device', '?')}.",
           *(["", f"**Partial run**: {summary['partial']['questions']} of "
              f"{summary['partial']['of']} questions (x seeds), those every method finished; "
              f"left out: {', '.join(summary['partial']['left_out'])}."]
             if summary.get("partial") else []),
           *(["", f"MBSU and head rows (`rows`, the plot) not computed for "
              f"{', '.join(summary['mbsu_unavailable'])}: their head / ranker / subset files "
              f"were not at hand when the report was written (`--report-only`)."]
             if summary.get("mbsu_unavailable") else []),
           "", "## Tau per Spec-Bench group and throughput (SpecVocab's layout)", "",
           "| method | rows | " + " | ".join(groups) + " | overall tau | tok/s | vs full | "
           "vs EAGLE-3 32K |", "|---" * (len(groups) + 6) + "|"]
  ref = {k: by[k]["overall"]["tokens_per_s"] for k in ("full_chain", "eagle3_32k") if k in by}
  for m in methods:
    o = m["overall"]
    cells = [_f(m["by_group"].get(g, {}).get("tau")) for g in groups]
    rel = [_f(o["tokens_per_s"] / ref[k], "{:.2f}x") if k in ref else "-"
           for k in ("full_chain", "eagle3_32k")]
    lines.append(f"| {m['name']} | {m.get('draft_vocab_size') or '-'} | " + " | ".join(cells)
                 + f" | {_f(o['tau'])} | {_f(o['tokens_per_s'])} | {rel[0]} | {rel[1]} |")
  lines += ["", "## Throughput per Spec-Bench group (tokens/s)", "",
            "| method | " + " | ".join(groups) + " | overall |", "|---" * (len(groups) + 2) + "|"]
  for m in methods:
    cells = [_f(m["by_group"].get(g, {}).get("tokens_per_s"), "{:.1f}") for g in groups]
    lines.append(f"| {m['name']} | " + " | ".join(cells)
                 + f" | {_f(m['overall']['tokens_per_s'], '{:.1f}')} |")
  lines += ["", "## The LM head's share of drafting and the speedups (FR-Spec's layout)", "",
            "| method | drafting ms per step | drafter layers ms | LM head ms | head share | "
            "speedup vs plain | "
            "speedup vs its full-vocabulary drafter | MBSU | greedy identity |",
            "|---|---|---|---|---|---|---|---|---|"]
  for m in methods:
    o, s = m["overall"], splits.get(m["name"])
    base = by.get(FULL[_setting(m["name"])])
    vs_full = (o["tokens_per_s"] / base["overall"]["tokens_per_s"]
               if base is not None and m["method"] != "ar" else None)
    lines.append(
        f"| {m['name']} | {_f(_drafting_ms(s), '{:.1f}')} | "
        f"{_f(s and 1e3 * s['drafter_s'], '{:.1f}')} | "
        f"{_f(s and 1e3 * s['drafter_head_s'], '{:.1f}')} | "
        f"{_f(s and s['drafter_head_share'], '{:.0%}')} | {_f(o.get('speedup'), '{:.2f}x')} | "
        f"{_f(vs_full, '{:.2f}x')} | {_f(o.get('mbsu'))} | {_f(o.get('match_rate'), '{:.0%}')} |")
  lines += beside_the_papers(summary)
  lines += ["", "## Published headline figures", "",
            "| paper | setting | published |", "|---|---|---|"]
  lines += [f"| {p} | {s} | {c} |" for p, s, c in PUBLISHED]
  lines += ["", "Ours differ in setting: a 1.5B target and a one-layer head on a CPU (a GPU's "
            "memory-bound step is not a 2-core CPU's), heads trained for minutes on ~100K "
            "positions (the papers' for days), greedy and temperature-1 runs of a few questions "
            "per group.", ""]
  return "\n".join(lines)


def _ratios(num, den):
  return [None if a is None or not b else a / b for a, b in zip(num, den)]


def _mean(xs):
  xs = [x for x in xs if x is not None]
  return sum(xs) / len(xs) if xs else None


def beside_the_papers(summary: dict) -> list[str]:
  """Ours next to FR-Spec's per-group tables, as ratios to each one's full-vocabulary drafter
  (absolute tau and tokens/s are not comparable across models and hardware; the ratios are
  what each method claims), and SpecVocab's and VocabTrim's headline gains."""
  by = {m["name"]: m for m in summary["methods"]}
  full = by.get("full_chain")

  def ours(name, key):
    m = by.get(name)
    if m is None or full is None:
      return [None] * len(FRSPEC_GROUPS)
    return _ratios([m["by_group"].get(g, {}).get(key) for g in FRSPEC_GROUPS],
                   [full["by_group"].get(g, {}).get(key) for g in FRSPEC_GROUPS])

  def row(label, xs):
    return (f"| {label} | " + " | ".join(_f(x, "{:.0%}") for x in xs)
            + f" | {_f(_mean(xs), '{:.0%}')} |")

  head = ("| | " + " | ".join(FRSPEC_GROUPS) + " | mean |", "|---" * (len(FRSPEC_GROUPS) + 2) + "|")
  lines = ["", "## Beside the papers' per-group figures", "",
           "FR-Spec's columns as our task groups (MT. = translation, Conv. = multi-turn, Math = "
           "GSM8K / math_reasoning, Code = HumanEval); every cell is a ratio to the same table's "
           "full-vocabulary drafter (EAGLE-2 in FR-Spec, `full_chain` in ours), computed from "
           "the published figures and from this run. Mean: of the groups' ratios.", "",
           "### tau of FR-Spec's subsets / tau of the full vocabulary", "", *head]
  for k in ("64k", "32k", "16k", "8k"):
    lines.append(row(f"FR-Spec Table 1, Llama-3-8B, FR {k}",
                     _ratios(FRSPEC_TAU[k], FRSPEC_TAU["full"])))
    if k == "32k":
      lines.append(row("FR-Spec Table 6, Qwen-2-7B, FR 32k",
                       _ratios(FRSPEC_TAU_QWEN["32k"], FRSPEC_TAU_QWEN["full"])))
    lines.append(row(f"ours, full_fr{k}", ours(f"full_fr{k}", "tau")))
  lines += ["", "### tokens/s of FR-Spec's subsets / tokens/s of the full vocabulary", "", *head]
  for k in ("64k", "32k", "16k", "8k"):
    lines.append(row(f"FR-Spec Table 2, Llama-3-8B, FR {k}",
                     _ratios(FRSPEC_TOKS[k], FRSPEC_TOKS["full"])))
    lines.append(row(f"ours, full_fr{k}", ours(f"full_fr{k}", "tokens_per_s")))
  split = (summary.get("time_split_per_step") or {}).get("full_chain")
  lines += ["", f"LM head's share of drafting: FR-Spec {FRSPEC_HEAD_SHARE}; ours (`full_chain`) "
            + (f"{split['drafter_head_share']:.0%}" if split else "not timed in this run") + ".",
            "", "### Headline gains", "", "| claim | published | ours (this run) |",
            "|---|---|---|"]
  e3 = by.get("eagle3_32k")
  for name in ("full_sv512", "full_sv1024", "full_sv2048"):
    m = by.get(name)
    gain = (m["overall"]["tokens_per_s"] / e3["overall"]["tokens_per_s"] - 1
            if m is not None and e3 is not None else None)
    lines.append(f"| SpecVocab throughput over EAGLE-3 32K (`{name}` / `eagle3_32k`) | "
                 + ", ".join(f"{k} {v:+.1%}" for k, v in SPECVOCAB_GAIN.items())
                 + f" (k = 2048) | {_f(gain, '{:+.1%}')} |")
  for name, base in (("full_vt32k", "full_chain"), ("lm_vt32k", "lm_chain_g3")):
    m, b = by.get(name), by.get(base)
    gain = (m["overall"]["mbsu"] / b["overall"]["mbsu"] - 1
            if m is not None and b is not None and m["overall"].get("mbsu")
            and b["overall"].get("mbsu") else None)
    lines.append(f"| VocabTrim 32K MBSU over the full drafter (`{name}` / `{base}`) | "
                 f"{VOCABTRIM_MBSU_GAIN:+.0%} (Llama-3.2-3B, EAGLE drafter) | "
                 f"{_f(gain, '{:+.1%}')} |")
  return lines


def frspec_points(table=None) -> list[tuple[int, float]]:
  """FR-Spec's published (LM-head rows, mean tau over its seven columns) for Llama-3-8B (its
  Table 1: the full 128,256-row head and 64K .. 8K)."""
  table = table or FRSPEC_TAU
  rows = {"full": 128256, "64k": 65536, "32k": 32768, "16k": 16384, "8k": 8192}
  return [(rows[k], sum(v) / len(v)) for k, v in table.items()]


def plot(summary: dict, path: Path) -> Path:
  """tau and the drafter's step time against the drafting vocabulary's size (head rows, log),
  a colour per drafter family and a marker per method (`vocabjax.eval.report.method_styles`),
  legends outside; FR-Spec's published tau (Llama-3-8B, mean of its groups) drawn beside."""
  from vocabjax.eval.report import method_styles
  from vocabjax.plots import save_png, subplots

  splits = summary.get("time_split_per_step") or {}
  ms = [m for m in summary["methods"] if m["method"] != "ar" and m.get("draft_vocab_size")]
  styles = method_styles(ms)
  fig, (a, b) = subplots(1, 2, figsize=(14, 4.8))
  for m in ms:
    color, marker, _ = styles[m["name"]]
    a.scatter(m["draft_vocab_size"], m["overall"]["tau"], color=color, marker=marker, s=40,
              label=m["name"])
    s = splits.get(m["name"])
    if s:
      b.scatter(m["draft_vocab_size"], _drafting_ms(s), color=color, marker=marker, s=40,
                label=m["name"])
  pts = frspec_points()
  a.scatter([x for x, _ in pts], [y for _, y in pts], facecolors="none", edgecolors="k", s=50,
            label="FR-Spec, published (Llama-3-8B, EAGLE-2; GPU)")
  a.plot([x for x, _ in pts], [y for _, y in pts], color="k", lw=0.6, ls=":")
  for ax, ylab in ((a, "tau (tokens per target step)"),
                   (b, "drafting per step, layers + LM head (ms)")):
    ax.set_xscale("log")
    ax.set_xlabel("drafting vocabulary (LM-head rows per step, log)")
    ax.set_ylabel(ylab)
  a.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
  save_png(fig, path, dpi=120)
  return path


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("run", help="a papers eval run's directory (its summary.json)")
  p.add_argument("--out", help="report path (default: <run>/report.md)")
  a = p.parse_args(argv)
  run = Path(a.run)
  path = run / "summary.json"
  if not path.is_file():
    print(f"error: {path} does not exist (run `python -m vocabjax.eval --config papers` first)",
          file=sys.stderr)
    return 2
  summary = json.loads(path.read_text())
  out = Path(a.out) if a.out else run / "report.md"
  out.parent.mkdir(parents=True, exist_ok=True)
  text = report(summary)
  png = plot(summary, out.with_name("tau_vs_vocab_rows.png"))
  atomic_write_text(out, text + f"\n![tau and drafter step time]({png.name})\n")
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
