"""OmniDraft fig. 2 analog from an online distillation run (`python -m vocabjax.train.distill
--online`) and, optionally, its control (the same stream with the drafter frozen,
`online_steps: 0`): acceptance rate, tau and speedup per prompt, their trailing means, and the
means per quarter of the stream; with a control, the paired difference per prompt (the
prompts' own difficulty cancels in it).

    python train/online_report.py train/crossvocab/online \\
        --control train/crossvocab/online_control   # writes online_report.md / .png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

KEYS = ("acceptance_rate", "tau", "speedup")


def read_rows(run: Path) -> list[dict]:
  path = run / "online.jsonl"
  if not path.exists():
    raise SystemExit(f"{path} does not exist: run `python -m vocabjax.train.distill --config ... "
                     f"--online` first")
  return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def quarters(x: np.ndarray) -> list[float]:
  return [float(q.mean()) for q in np.array_split(x, 4)]


def report(run: Path, control: Path | None) -> tuple[str, dict]:
  rows = read_rows(run)
  ctl = read_rows(control) if control else None
  if ctl is not None:
    if [r["qid"] for r in ctl] != [r["qid"] for r in rows]:
      raise SystemExit(f"{control} did not decode the same prompt stream as {run} "
                       f"({len(ctl)} vs {len(rows)} rows or another order)")
  out = {"run": str(run), "control": str(control) if control else None, "prompts": len(rows),
         "identical": sum(r["identical"] for r in rows), "quarters": {}}
  lines = [f"# Online distillation: {run}", "",
           f"{len(rows)} prompts, {rows[-1]['updates'] + ('train_loss' in rows[-1])} updates; "
           f"output = plain decoding for {out['identical']}/{len(rows)}"
           + (f" (control {sum(r['identical'] for r in ctl)}/{len(ctl)})" if ctl else "") + ".",
           "", "Means per quarter of the stream (prompts in order):", "",
           "| metric | run | Q1 | Q2 | Q3 | Q4 |", "|---|---|---|---|---|---|"]
  for k in KEYS:
    x = np.asarray([r[k] for r in rows], float)
    out["quarters"][k] = {"online": quarters(x)}
    lines.append(f"| {k} | online | " + " | ".join(f"{v:.3f}" for v in quarters(x)) + " |")
    if ctl:
      c = np.asarray([r[k] for r in ctl], float)
      out["quarters"][k].update(control=quarters(c), difference=quarters(x - c))
      lines.append(f"| {k} | frozen drafter | " + " | ".join(f"{v:.3f}" for v in quarters(c))
                   + " |")
      lines.append(f"| {k} | online - frozen | " + " | ".join(f"{v:+.3f}" for v in
                                                             quarters(x - c)) + " |")
  if ctl:
    d = np.asarray([r["acceptance_rate"] - c["acceptance_rate"] for r, c in zip(rows, ctl)])
    half = len(d) // 2
    second = d[half:]
    se = second.std(ddof=1) / np.sqrt(len(second)) if len(second) > 1 else float("nan")
    out["acceptance_difference_second_half"] = {"mean": float(second.mean()),
                                                "stderr": float(se),
                                                "positive": int((second > 0).sum()),
                                                "n": int(len(second))}
    lines += ["", f"Second half: acceptance online - frozen = {second.mean():+.3f} "
              f"(standard error {se:.3f}; online higher on {(second > 0).sum()}/{len(second)} "
              f"prompts)."]
  plot(rows, ctl, run / "online_report.png")
  return "\n".join(lines) + "\n", out


def plot(rows, ctl, path: Path) -> None:
  from vocabjax.plots import save_png, subplots

  x = np.arange(len(rows))
  w = max(1, min(8, len(rows) // 4))  # trailing window
  fig, axes = subplots(1, len(KEYS), figsize=(5 * len(KEYS), 3.4))
  for ax, k in zip(axes, KEYS):
    for rs, label, color in ((rows, "online", "C0"), (ctl, "frozen drafter", "C1")):
      if not rs:
        continue
      y = np.asarray([r[k] for r in rs], float)
      ax.plot(x, y, color=color, alpha=0.3, lw=1)
      c = np.concatenate([[0.0], np.cumsum(y)])
      trail = (c[x + 1] - c[np.maximum(x + 1 - w, 0)]) / np.minimum(x + 1, w)
      ax.plot(x, trail, color=color, lw=2, label=f"{label} (mean of the last {w})")
    ax.set_title(k)
    ax.set_xlabel("prompt in the stream")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  save_png(fig, path)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("run", type=Path, help="the online run's output directory")
  p.add_argument("--control", type=Path, help="the frozen-drafter control's output directory")
  args = p.parse_args(argv)
  md, data = report(args.run, args.control)
  from vocabjax.io import atomic_write_bytes
  from vocabjax.io import atomic_write_json

  atomic_write_bytes(args.run / "online_report.md", md.encode())
  atomic_write_json(args.run / "online_report.json", data)
  print(md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
