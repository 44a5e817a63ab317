"""python -m vocabjax.calibrate {count,select,plot}

  count   count a source's tokens in a model's vocabulary (resumable; see run.py)
            --text DIR_OR_FILE... | --jsonl F... | --dataset PATH  (raw corpus: FR-Spec)
            --generate [--generator MODEL] [--prompts spec_bench humaneval ...]  (VocabTrim)
                       [--backend torch [--torch-dtype bfloat16]]  (transformers generates)
  select  pick a subset from counts (--k | --top-p | --min-count; EOS and specials kept) and
          save it (d2t / t2d .npz) beside the drafter
  plot    overlay rank-frequency and top-K coverage plots of several counts files
Exit status 2 on bad input, with the reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vocabjax import distributed
from vocabjax.calibrate.counts import CalibrationError, Counts, plot
from vocabjax.calibrate.run import BACKENDS, CountJob, run_count
from vocabjax.checkpoints.hub import add_allow_bin_argument, allow_bin_from_args
from vocabjax.checkpoints.torch_model import TORCH_DTYPES
from vocabjax.calibrate.select import (coverage_latency_subset, subset_from_counts,
                                      successor_index_from)
from vocabjax.io import check_output_dir, check_output_file
from vocabjax.prompts import seed_arg


def _parser():
  ap = argparse.ArgumentParser(prog="python -m vocabjax.calibrate", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  c = sub.add_parser("count", help="count tokens of a calibration source")
  c.add_argument("--model", required=True, help="the target (tokenizer + vocabulary size)")
  c.add_argument("--out", required=True, help="result directory (resumable)")
  c.add_argument("--text", nargs="+", default=[], help="text files or directories; corpus:stdlib, corpus:shakespeare")
  c.add_argument("--glob", nargs="+", default=list(CountJob.glob),
                 help="file patterns searched in directories")
  c.add_argument("--skip-dirs", nargs="*", default=list(CountJob.skip_dirs),
                 help="directory names not searched (site-packages under the stdlib, ...)")
  c.add_argument("--jsonl", nargs="+", default=[])
  c.add_argument("--dataset", help="a local datasets directory (save_to_disk) or data file")
  c.add_argument("--field", default="text", help="jsonl/dataset field with the text")
  c.add_argument("--num-proc", type=int, default=1,
                 help="datasets.map worker processes for --dataset (default 1: tokenize in this "
                      "process, where the fast tokenizer already runs threads; more fork this "
                      "process, which runs JAX's threads, and measured slower on 2 cores: "
                      "docs/measurements.md)")
  c.add_argument("--docs-per-unit", type=int, default=256)
  c.add_argument("--generate", action="store_true", help="count generated completions")
  c.add_argument("--generator", help="model writing the completions (default: --model)")
  c.add_argument("--prompts", nargs="+", default=["spec_bench"],
                 help="spec_bench | humaneval | gsm8k | a Spec-Bench-format .jsonl")
  c.add_argument("--exclude-suites", nargs="*", default=list(CountJob.exclude_suites),
                 help="eval suites whose prompts are left out (disjoint calibration)")
  c.add_argument("--max-new-tokens", type=int, default=128)
  c.add_argument("--batch-size", type=int, default=8,
                 help="prompts per unit (resumable step), decoded as one batch unless --rows")
  c.add_argument("--rows", type=int,
                 help="continuous batching: decode each unit's prompts with this many rows, a "
                      "finished row taking the next prompt (answers of unequal length waste "
                      "no steps)")
  c.add_argument("--backend", choices=BACKENDS, default="vocabjax",
                 help="what generates: vocabjax (f32 on the CPU), or transformers' generate "
                      "(--torch-dtype, bf16 by default: ~4x faster on a CPU with AMX)")
  c.add_argument("--torch-dtype", default="bfloat16", choices=TORCH_DTYPES,
                 help="the torch backend's dtype")
  c.add_argument("--temperature", type=float, default=0.0)
  c.add_argument("--seed", type=seed_arg, default=0)
  c.add_argument("--max-len", type=int, default=1024)
  c.add_argument("--limit", type=int, help="at most this many documents / prompts")
  c.add_argument("--max-units", type=int, help="stop after this many units (rerun resumes)")
  c.add_argument("--finish", action="store_true",
                 help="write the final counts from the units done so far, run no more")
  c.add_argument("--overwrite", action="store_true", help="replace another job's results")
  c.add_argument("--quiet", action="store_true")
  add_allow_bin_argument(c)
  distributed.add_arguments(c)

  s = sub.add_parser("select", help="select a static subset from counts")
  s.add_argument("counts")
  s.add_argument("--model", required=True, help="the target (tokenizer identity, specials)")
  g = s.add_mutually_exclusive_group(required=True)
  g.add_argument("--k", type=int)
  g.add_argument("--top-p", type=float)
  g.add_argument("--min-count", type=int)
  g.add_argument("--coverage-latency", action="store_true",
                 help="k balancing coverage against the drafter's cost (--drafter, --alpha)")
  s.add_argument("--drafter", help="--coverage-latency: the drafter whose cost per token is "
                 "weighed (a KNOWN name, config.json, GGUF or registry model)")
  s.add_argument("--head", action="store_true", help="--coverage-latency: --drafter is an "
                 "EAGLE-1/2/3 or P-EAGLE head directory (its one layer and fc are the cost)")
  s.add_argument("--alpha", type=float, default=0.5, help="--coverage-latency: coverage's weight")
  s.add_argument("--min-coverage", type=float, default=0.0)
  s.add_argument("--k-min", type=int, default=50)
  s.add_argument("--k-max", type=int, default=None)
  s.add_argument("--out", required=True, help="subset file (.npz)")

  x = sub.add_parser("index", help="EvoSpec's successor index of generated completions")
  x.add_argument("completions", nargs="+", help="completion records (jsonl, completion_ids)")
  x.add_argument("--model", required=True, help="the target (tokenizer identity, V)")
  x.add_argument("--counts", required=True, help="counts whose top --core tokens are the core")
  x.add_argument("--core", type=int, required=True)
  x.add_argument("--n", type=int, default=4, help="successors kept per token")
  x.add_argument("--out", required=True, help="index file (.npz)")

  p = sub.add_parser("plot", help="overlay plots of counts files")
  p.add_argument("counts", nargs="+", help="NAME=PATH or PATH")
  p.add_argument("--out", required=True)
  return ap


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  allow_bin_from_args(args)  # (count's --allow-bin: a model with pickled weights)
  try:
    # the output is checked before a model or a corpus is read
    if args.cmd == "select" and args.head and not args.coverage_latency:
      raise ValueError("--head says what --drafter is for --coverage-latency; give both")
    if args.cmd in ("select", "index"):
      check_output_file(args.out, "--out")
    else:
      check_output_dir(args.out, "--out")
    if args.cmd == "count":
      distributed.initialize_from_args(args)  # before any JAX computation
      job = CountJob(
          model=args.model, out=args.out, kind="generated" if args.generate else "text",
          text=tuple(args.text), jsonl=tuple(args.jsonl), dataset=args.dataset,
          field=args.field, glob=tuple(args.glob), skip_dirs=tuple(args.skip_dirs), docs_per_unit=args.docs_per_unit,
          num_proc=args.num_proc, generator=args.generator, prompts=tuple(args.prompts),
          exclude_suites=tuple(args.exclude_suites), max_new_tokens=args.max_new_tokens,
          batch_size=args.batch_size, rows=args.rows, backend=args.backend,
          torch_dtype=args.torch_dtype, temperature=args.temperature, seed=args.seed,
          max_len=args.max_len, limit=args.limit)
      run_count(job, overwrite=args.overwrite, max_units=args.max_units, finish=args.finish,
                progress=not args.quiet)
    elif args.cmd == "index":
      path, info = successor_index_from(args.completions, args.model, args.counts, args.core,
                                        args.n, args.out)
      print(f"{path}: {info['indexed_tokens']} tokens with successors, n={info['n']}, from "
            f"{info['sequences']} completions ({info['tokens']} tokens)")
    elif args.cmd == "select" and args.coverage_latency:
      if not args.drafter:
        raise ValueError("--coverage-latency weighs the drafter's cost: name it with --drafter")
      sub, c = coverage_latency_subset(args.counts, args.model, args.drafter, alpha=args.alpha,
                                       min_coverage=args.min_coverage, k_min=args.k_min,
                                       k_max=args.k_max, head=args.head)
      sub.save(args.out)
      print(f"{args.out}: K={sub.size} of V={sub.vocab_size}: coverage {c['coverage']:.4f}, "
            f"drafting cost saved {c['saved']:.4f} (drafter body {c['body_rows']} rows + k "
            f"head rows), utility {c['utility']:.4f} at alpha={c['alpha']}")
    elif args.cmd == "select":
      sub = subset_from_counts(args.counts, args.model, k=args.k, top_p=args.top_p,
                               min_count=args.min_count)
      sub.save(args.out)
      print(f"{args.out}: K={sub.size} of V={sub.vocab_size} ({dict(sub.meta)['rule']})")
    else:
      named = {}
      for item in args.counts:
        name, _, path = item.rpartition("=")
        named[name or Path(path).parent.name] = Counts.load(path)
      for f in plot(named, args.out):
        print(f)
  except (CalibrationError, ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
