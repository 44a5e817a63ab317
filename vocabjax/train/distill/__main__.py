"""`python -m vocabjax.train.distill`: see the package doc."""

from __future__ import annotations

import json
import sys

from vocabjax.train import distill
from vocabjax.train.distill.job import job_from_dict
from vocabjax.train.distill.online import online
from vocabjax.train.distill.trainer import train
from vocabjax.train.loop import TrainError, run_job_cli


def _online_flag(p):
  p.add_argument("--online", action="store_true",
                 help="online mode: generate over the config's `online` prompts, update the "
                      "drafter every `online_every` sequences, write online.jsonl/png")

  def before(a, job):
    if not a.online:
      return None
    summary = online(job, show_progress=not a.quiet)
    print(json.dumps({k: summary[k] for k in ("sequences", "updates", "identical",
                                               "first_half", "second_half")}, indent=1))
    return 0
  return before


def main(argv=None) -> int:
  return run_job_cli(argv, prog="python -m vocabjax.train.distill", doc=distill.__doc__,
                     configs="configs/train/distill_*.yaml", what="distillation",
                     job_from_dict=job_from_dict, train=train,
                     report=("step", "complete", "last"), extra=_online_flag,
                     errors=(TrainError,))


if __name__ == "__main__":
  sys.exit(main())
