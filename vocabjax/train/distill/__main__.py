"""`python -m vocabjax.train.distill`: see the package doc."""

from __future__ import annotations

import json
import sys

from vocabjax.train import distill
from vocabjax.train.distill.job import job_from_dict
from vocabjax.train.distill.online import online
from vocabjax.train.distill.trainer import train
from vocabjax.train.loop import TrainError, job_argparser, read_job_yaml


def main(argv=None) -> int:
  p = job_argparser("python -m vocabjax.train.distill", distill.__doc__,
                    "configs/train/distill_*.yaml")
  p.add_argument("--online", action="store_true",
                 help="online mode: generate over the config's `online` prompts, update the "
                      "drafter every `online_every` sequences, write online.jsonl/png")
  args = p.parse_args(argv)
  try:
    raw = read_job_yaml(args.config, "distillation", {"out": args.out, "steps": args.steps})
    job = job_from_dict(raw, where=str(args.config))
    if args.online:
      summary = online(job, show_progress=not args.quiet)
      print(json.dumps({k: summary[k] for k in ("sequences", "updates", "identical",
                                                 "first_half", "second_half")}, indent=1))
      return 0
    summary = train(job, show_progress=not args.quiet, stop_after=args.stop_after)
  except TrainError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps({k: summary[k] for k in ("step", "complete", "last")}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
