"""What the text an EAGLE head trains on costs: heads trained on different completions of the
same prompts, scored on the same held-out records (to measure the difference).

Each `--run` is a finished `python -m vocabjax.train.eagle` output directory (`summary.json`,
`head/`), e.g. one trained on the target's own completions and one on the drafter's
(configs/train/eagle_source/{target,drafter}.yaml). Every head is scored (held-out loss and
top-1 accuracy per depth, `evaluate_heldout`) on the held-out records of the `--eval-on` run:
the target's own text is what a head drafts for at decoding time. No run may have trained on
those prompts (checked): runs holding out the same prompts compare, and so does a run on other
data that never saw them (e.g. a small ablation run scored on the long run's held-out set).
Beside it, per run and per data source of `--mix` (a train.eagle config whose features exist),
how often the text's next token is the target's teacher-forced argmax (the head's label): 1.0
for the target's own greedy completions, lower for text the target did not write.

    python train/eagle_data_source.py --run train/eagle/source/target \\
        --run train/eagle/source/drafter --eval-on train/eagle/source/target \\
        --mix configs/train/eagle_qwen15b_mix_f32.yaml \\
        --out train/eagle/source/results.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from vocabjax.checkpoints.eagle3 import head_target_ids, load_eagle3
from vocabjax.checkpoints.loader import load_model
from vocabjax.io import atomic_write_text
from vocabjax.models.eagle import default_feature_layers
from vocabjax.train.eagle import EagleJob, job_from_dict
from vocabjax.train.eagle_step import evaluate_heldout, target_to_head
from vocabjax.train.eagle_data import load_eagle_features, record_sources
from vocabjax.train.features import heldout_records, prompt_key
from vocabjax.train.loop import read_job_yaml


def run_job(run: Path) -> EagleJob:
  """The job a finished run was trained with (ValueError naming what is missing)."""
  path = run / "summary.json"
  if not path.exists():
    raise ValueError(f"{path} does not exist: {run} is not a train.eagle output directory")
  if not (run / "head" / "config.json").exists():
    raise ValueError(f"{run / 'head'} holds no exported head (run the job to its end)")
  return job_from_dict(json.loads(path.read_text())["job"], where=str(path))


def agreement(data, sources: list[str]) -> dict:
  """Per source: (completion positions whose next text token is the label, positions)."""
  out: dict = {}
  for (rec, toks, first), lab in zip(data.seqs, data.labels):
    nxt, pred = np.asarray(toks[first + 1:]), np.asarray(lab[first:len(toks) - 1])
    a, n = out.get(sources[rec], (0, 0))
    out[sources[rec]] = (a + int(np.sum(nxt == pred)), n + len(nxt))
  return out


def held_out(data, job: EagleJob) -> tuple[list, set, set]:
  """(indices into data.seqs of the held-out records, their prompts, the other records'
  prompts: those a run may have trained on)."""
  held = set(heldout_records(data, job.heldout, job.heldout_split, job.seed).tolist())
  idx = [i for i, (rec, _, _) in enumerate(data.seqs) if rec in held]
  rest = {prompt_key(toks, first) for rec, toks, first in data.seqs if rec not in held}
  return idx, {prompt_key(*data.seqs[i][1:]) for i in idx}, rest


def compare(runs: list[Path], eval_on: Path, *, depth: int = 1, mix: str | None = None,
            target=None) -> dict:
  """Every run's head scored on `eval_on`'s held-out records, and the text/label agreements."""
  jobs = {r: run_job(r) for r in runs + [eval_on]}
  ev = jobs[eval_on]
  target = target or load_model(ev.target, dtype="float32")
  tc = target.config
  layers = tuple(ev.feature_layers or default_feature_layers(tc.num_layers))
  datas = {r: load_eagle_features(j.feature_location, target, layers) for r, j in jobs.items()}
  held_idx, held, _ = held_out(datas[eval_on], ev)
  rows = []
  for r in runs:
    seen = held & held_out(datas[r], jobs[r])[2]
    if seen:
      raise ValueError(f"{r} trained on {len(seen)} of the {len(held)} prompts {eval_on} holds "
                       f"out: its head cannot be scored on them")
    hc, head, _ = load_eagle3(r / "head", target_config=tc)
    if tuple(hc.feature_layers) != layers:
      raise ValueError(f"{r}'s head reads layers {list(hc.feature_layers)}, {eval_on}'s "
                       f"features are of {list(layers)}")
    summary = json.loads((r / "summary.json").read_text())
    score = evaluate_heldout(head, {"embed": target.params["embed"]}, datas[eval_on], held_idx,
                             dataclasses.replace(ev, ttt_steps=depth),
                             target_to_head(head_target_ids(head["d2t"]), tc.vocab_size), hc, {})
    agree = agreement(datas[r], [r.name] * (1 + max(s[0] for s in datas[r].seqs)))[r.name]
    rows.append({"run": r.name, "data": [str(p) for p in jobs[r].data],
                 "train_positions": summary["train_label_positions"],
                 "own_heldout": summary.get("exported"), "on_eval": score,
                 "text_is_label": agree[0] / max(agree[1], 1)})
  out = {"eval_on": str(eval_on), "heldout_records": len(held_idx),
         "heldout_positions": int(sum(len(datas[eval_on].labels[i]) - datas[eval_on].seqs[i][2]
                                      for i in held_idx)), "depth": depth, "runs": rows}
  if mix:
    mj = job_from_dict(read_job_yaml(mix, "EAGLE", {}), where=mix)
    md = load_eagle_features(mj.feature_location, target, layers)
    out["mix"] = {"config": mix, "by_source": {
        s: {"agree": a / max(n, 1), "positions": n}
        for s, (a, n) in sorted(agreement(md, record_sources(mj.data, mj.max_records)).items())}}
  return out


def report(res: dict, command: str) -> str:
  lines = ["# What the training text costs an EAGLE head", "",
           f"Command: `{command}`", "",
           f"Every head scored on the held-out records of `{res['eval_on']}` "
           f"({res['heldout_records']} records, {res['heldout_positions']} completion positions; "
           f"no run trained on their prompts), depth 0..{res['depth'] - 1}.", "",
           "| run | training text | training positions | text's next token = label | "
           "best own held-out acc_0 (step) | " +
           " | ".join(f"acc_{j} on eval records" for j in range(res["depth"])) +
           " | labels outside the head's vocabulary |",
           "|---|---|---|---|---|" + "---|" * res["depth"] + "---|"]
  for r in res["runs"]:
    own = r["own_heldout"] or {}
    lines.append(f"| {r['run']} | {', '.join(r['data'])} | {r['train_positions']} | "
                 f"{r['text_is_label']:.3f} | {own.get('acc_0', float('nan')):.3f} "
                 f"({own.get('step')}) | " +
                 " | ".join(f"{r['on_eval'][f'acc_{j}']:.3f}" for j in range(res["depth"])) +
                 f" | {r['on_eval']['labels_outside_vocab']:.3f} |")
  if "mix" in res:
    lines += ["", f"Per source of `{res['mix']['config']}`'s data: how often the text's next "
              "token is the target's teacher-forced argmax (the label a head learns):", "",
              "| source | completion positions | text's next token = label |", "|---|---|---|"]
    lines += [f"| {s} | {v['positions']} | {v['agree']:.3f} |"
              for s, v in res["mix"]["by_source"].items()]
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--run", action="append", required=True, help="a finished run (repeatable)")
  p.add_argument("--eval-on", required=True, help="the run whose held-out records score all")
  p.add_argument("--depth", type=int, default=1, help="TTT depths to score (<= the heads')")
  p.add_argument("--mix", help="a train.eagle config: per-source text/label agreement")
  p.add_argument("--out", required=True, help="a markdown file (a .json is written beside)")
  a = p.parse_args(argv)
  try:
    res = compare([Path(r) for r in a.run], Path(a.eval_on), depth=a.depth, mix=a.mix)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  command = "python train/eagle_data_source.py " + " ".join(sys.argv[1:] if argv is None
                                                           else argv)
  out = Path(a.out)
  atomic_write_text(out.with_suffix(".json"), json.dumps(res, indent=1))
  atomic_write_text(out, report(res, command))
  print(report(res, command))
  return 0


if __name__ == "__main__":
  sys.exit(main())
