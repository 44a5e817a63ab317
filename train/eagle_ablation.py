"""What limits an EAGLE head's held-out accuracy: a data-size ablation read from training runs.

Each `--run` is the output directory of a finished `python -m vocabjax.train.eagle` job
(`summary.json` and `log.jsonl`); runs that differ only in `train_fraction` form the ablation.
Per run: its training label positions, the best held-out depth-0 accuracy and the step it was
reached, the held-out loss at its lowest and at the end (a held-out loss that rises while the
training loss falls is overfitting: the data, not the training time, is then the limit). Then
a least-squares line of the best acc_0 against log10(training positions) and the positions it
would need to reach `--target-acc` (an extrapolation over the runs given, labelled as one).
`--reference` runs (e.g. the full-corpus head) are listed beside, outside the fit.

    python train/eagle_ablation.py --run train/eagle/ablation/data25 \
        --run train/eagle/ablation/data50 --run train/eagle/ablation/data100 \
        --reference train/eagle/qwen15b_mix --out train/eagle/ablation/results.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def read_run(path: Path) -> dict:
  """A finished run's figures (ValueError naming the file when it is missing or unfinished)."""
  summary_path, log_path = path / "summary.json", path / "log.jsonl"
  for f in (summary_path, log_path):
    if not f.exists():
      raise ValueError(f"{f} does not exist: {path} is not a train.eagle output directory")
  summary = json.loads(summary_path.read_text())
  rows = [json.loads(x) for x in log_path.read_text().splitlines() if x.strip()]
  evals = [r for r in rows if r.get("acc_0") is not None and r["step"] > 0]
  if not evals:
    raise ValueError(f"{log_path} holds no held-out evaluation after step 0")
  best = max(evals, key=lambda r: r["acc_0"])
  low = min(evals, key=lambda r: r["heldout_loss"])
  trained = [r for r in rows if r.get("train_loss") is not None]
  return {"name": path.name, "path": str(path), "positions": summary["train_label_positions"],
          "records": summary["train_records"], "fraction": summary["job"].get(
              "train_fraction", 1.0), "ttt_steps": summary["job"]["ttt_steps"],
          "steps": summary["steps_done"], "complete": summary["complete"],
          "best_acc_0": best["acc_0"], "best_step": best["step"],
          "final_acc_0": evals[-1]["acc_0"], "low_loss": low["heldout_loss"],
          "low_step": low["step"], "final_loss": evals[-1]["heldout_loss"],
          "final_train_loss": trained[-1]["train_loss"] if trained else None,
          "curve": [(r["step"], r["acc_0"], r["heldout_loss"]) for r in evals]}


def fit(runs: list[dict], target: float) -> dict | None:
  """acc_0 = a + b log10(positions) over the runs, and the positions it gives `target` at."""
  if len({r["positions"] for r in runs}) < 2:
    return None
  x = np.log10([r["positions"] for r in runs])
  y = np.asarray([r["best_acc_0"] for r in runs])
  b, a = np.polyfit(x, y, 1)
  pred = a + b * x
  out = {"a": float(a), "b": float(b), "rmse": float(np.sqrt(np.mean((pred - y) ** 2)))}
  out["positions_at_target"] = float(10 ** ((target - a) / b)) if b > 0 else float("inf")
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--run", action="append", required=True, help="an ablation run (repeatable)")
  p.add_argument("--reference", action="append", default=[],
                 help="a run listed beside the ablation, outside the fit (repeatable)")
  p.add_argument("--target-acc", type=float, default=0.6)
  p.add_argument("--out", required=True, help="a markdown file (a .png plot is written beside)")
  a = p.parse_args(argv)
  try:
    runs = [read_run(Path(r)) for r in a.run]
    refs = [read_run(Path(r)) for r in a.reference]
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  runs.sort(key=lambda r: r["positions"])
  f = fit(runs, a.target_acc)
  cmd = "python train/eagle_ablation.py " + " ".join(
      [f"--run {r}" for r in a.run] + [f"--reference {r}" for r in a.reference]
      + ([f"--target-acc {a.target_acc}"] if a.target_acc != 0.6 else []) + [f"--out {a.out}"])
  lines = ["# EAGLE head: held-out depth-0 accuracy against training data", "",
           f"Command: `{cmd}`", "",
           "| run | train records | train label positions | TTT steps | steps | best acc_0 "
           "(step) | final acc_0 | lowest held-out loss (step) | final held-out loss | "
           "final train loss |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in runs + refs:
    tl = "" if r["final_train_loss"] is None else f"{r['final_train_loss']:.3f}"
    lines.append(
        f"| {r['name']}{'' if r in runs else ' (reference)'} | {r['records']} | "
        f"{r['positions']:,} | {r['ttt_steps']} | {r['steps']}{'' if r['complete'] else ' (unfinished)'} | "
        f"{r['best_acc_0']:.3f} ({r['best_step']}) | {r['final_acc_0']:.3f} | "
        f"{r['low_loss']:.3f} ({r['low_step']}) | {r['final_loss']:.3f} | {tl} |")
  lines.append("")
  if f is not None:
    lines += [f"Fit over the {len(runs)} ablation runs: best acc_0 = {f['a']:.3f} + "
              f"{f['b']:.3f} log10(positions) (rmse {f['rmse']:.3f}). EXTRAPOLATED: acc_0 = "
              f"{a.target_acc} at about {f['positions_at_target']:,.0f} training label "
              f"positions of this kind of data.", ""]
  out = Path(a.out)
  png = out.with_suffix(".png")
  from vocabjax.plots import save_png, subplots

  fig, (ax1, ax2) = subplots(1, 2, figsize=(11, 4))
  for r in runs + refs:
    s, acc, _ = zip(*r["curve"])
    ax1.plot(s, acc, marker=".", label=f"{r['name']} ({r['positions']:,} pos)")
  ax1.set_xlabel("training step")
  ax1.set_ylabel("held-out acc_0")
  ax1.legend(fontsize=8)
  ax2.semilogx([r["positions"] for r in runs], [r["best_acc_0"] for r in runs], "o",
               label="ablation (best acc_0)")
  for r in refs:
    ax2.semilogx([r["positions"]], [r["best_acc_0"]], "s", label=f"{r['name']} (reference)")
  if f is not None:
    xs = np.logspace(np.log10(runs[0]["positions"]),
                     np.log10(max(f["positions_at_target"], runs[-1]["positions"]) * 1.2)
                     if np.isfinite(f["positions_at_target"]) else np.log10(
                         runs[-1]["positions"] * 10), 50)
    ax2.semilogx(xs, f["a"] + f["b"] * np.log10(xs), "--", label="fit (extrapolated)")
    ax2.axhline(a.target_acc, color="grey", lw=0.5)
  ax2.set_xlabel("training label positions")
  ax2.set_ylabel("best held-out acc_0")
  ax2.legend(fontsize=8)
  save_png(fig, png, dpi=110)
  lines.append(f"Plot: `{png.name}` (left: held-out acc_0 over training; right: best acc_0 "
               f"against training positions, with the fit).")
  from vocabjax.io import atomic_write_text

  atomic_write_text(out, "\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
