"""python -m vocabjax.bench: time the engine's programs on this machine's accelerator (or CPU)
with random weights of real shapes; `python -m vocabjax.bench project` turns an eval run's
recorded steps and those times into projected speedups; `python -m vocabjax.bench tpu` compiles
every method's whole step for a TPU topology on this host (no TPU: libtpu's compiler) and
projects its memory and roofline time (`vocabjax.bench.tpu`).

  python -m vocabjax.bench                                  # defaults for this backend
  python -m vocabjax.bench --pair llama-3.1-8b --dtypes bfloat16 --batch 1 4 16 64
  python -m vocabjax.bench --target path/to/config.json --draft qwen2.5-0.5b-instruct
  python -m vocabjax.bench project --run eval/results/default --bench kernels/results/bench/<dev>
  python -m vocabjax.bench tpu --topology v5e:1x1 --pair qwen2.5-coder --out DIR \
      [--run eval/results/eagle/gate] [--methods ar chain_g3 ...] [--context 1024]
  python -m vocabjax.bench tpu-matrix --out DIR   # the CI's TPU matrix, compiled and tabled

Defaults: on the CPU the registry's pair (Qwen2.5-Coder 1.5B <- 0.5B), float32 and bfloat16,
batch 1; on GPU/TPU every pair of `vocabjax.bench.shapes.PAIRS` (adding Qwen2.5-7B <- 0.5B,
Llama-3.1-8B <- Llama-3.2-1B, Qwen3-8B <- 0.6B and Gemma 3 1B / 4B <- 270M), bfloat16 and
float32, batch 1, 4, 16, 64. Output: runs/bench/<device>/ unless --out says otherwise
(bench.md, bench.json, rows.jsonl; a rerun resumes). Recorded tables: docs/bench.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from vocabjax.bench import run, shapes
from vocabjax.bench.engine import BenchError
from vocabjax.checkpoints.hf_config import UnsupportedConfigError
from vocabjax.io import (OutputPathError, atomic_write_json, atomic_write_text,
                         check_output_dir, check_output_file)


def _bench_parser() -> argparse.ArgumentParser:
  d = run.Settings(pairs=(), dtypes=(), batches=())
  p = argparse.ArgumentParser(prog="python -m vocabjax.bench", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--pair", nargs="+", choices=sorted(shapes.PAIRS),
                 help="target/drafter pairs by name (default: see above)")
  p.add_argument("--target", help="a target model (a name of vocabjax.bench.shapes.KNOWN, a "
                 "config.json or HF directory, a .gguf or cached registry model)")
  p.add_argument("--draft", help="its drafter (same forms); with --target")
  p.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16", "int8"))
  p.add_argument("--batch", nargs="+", type=int, help="batch sizes B")
  p.add_argument("--tokens", nargs="+", type=int, default=list(d.tokens),
                 help="T of the target programs (1 = a decoding step)")
  p.add_argument("--draft-tokens", nargs="+", type=int, default=list(d.draft_tokens),
                 help="T of the drafter's body")
  p.add_argument("--heads", nargs="+", default=list(d.heads),
                 help="drafter heads: full, trim:K, specvocab:k")
  p.add_argument("--head-rows", nargs="+", type=int, default=list(d.head_rows),
                 help="hidden rows per batch row of the head programs (a tree's top-k)")
  p.add_argument("--ranker-rank", type=int, default=d.ranker_rank,
                 help="rank R of the random SpecVocab ranker")
  p.add_argument("--context", type=int, default=d.context, help="cached tokens while timing")
  p.add_argument("--repeats", type=int, default=d.repeats)
  p.add_argument("--max-rows", type=int, default=d.max_rows,
                 help="skip programs of more than this many tokens (B x T)")
  p.add_argument("--bandwidth-mib", type=int, default=d.bandwidth_bytes >> 20,
                 help="size of the read-bandwidth probe")
  p.add_argument("--out", help="result directory (default runs/bench/<device>)")
  p.add_argument("--overwrite", action="store_true",
                 help="move rows of another device or other settings aside and start over")
  p.add_argument("--no-progress", action="store_true")
  return p


def _project_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m vocabjax.bench project",
                              description="Projected tokens/s and speedups of an eval run's "
                              "methods from a benchmark's program times (labelled projected).")
  p.add_argument("--run", required=True, help="an eval result directory (summary.json, "
                 "splits.json, questions.jsonl)")
  p.add_argument("--bench", required=True, help="a benchmark directory or its bench.json")
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--target", help="benchmark model to apply the run's steps to (default: the "
                 "run's target)")
  p.add_argument("--draft", help="benchmark drafter (default: the run's)")
  p.add_argument("--dtype", help="target dtype of the benchmark rows (default: the run's if "
                 "measured, else the benchmark's first)")
  p.add_argument("--draft-dtype")
  p.add_argument("--out", help="write <out>.md and <out>.json (default: print only)")
  return p


def _project(argv: list[str]) -> int:
  from vocabjax.bench import project  # local: the projection does not need JAX's programs

  a = _project_parser().parse_args(argv)
  path = Path(a.bench)
  path = path / "bench.json" if path.is_dir() else path
  try:
    if a.out:
      check_output_file(a.out + ".md", "--out")
    bench = json.loads(path.read_text())
    if not isinstance(bench, dict) or not isinstance(bench.get("rows"), list):
      raise BenchError(f"{path}: not a bench.json (no rows list); `python -m vocabjax.bench` "
                       f"writes one")
  except (OSError, json.JSONDecodeError, BenchError, OutputPathError) as e:
    print(f"error: {e}" if isinstance(e, (BenchError, OutputPathError))
          else f"error: {path}: not a readable bench.json ({e})", file=sys.stderr)
    return 2
  command = "python -m vocabjax.bench project " + shlex.join(argv)
  try:
    proj = project.project(a.run, bench, batch=a.batch, target_model=a.target,
                           draft_model=a.draft, dtype=a.dtype, draft_dtype=a.draft_dtype)
  except (BenchError, KeyError, TypeError, ValueError) as e:
    # a truncated or hand-edited input: one line naming it, not a traceback
    what = e if isinstance(e, BenchError) else f"{type(e).__name__}: {e}"
    print(f"error: cannot project {a.run} with {path}: {what}", file=sys.stderr)
    return 2
  md = project.render(proj, command)
  if a.out:
    atomic_write_json(a.out + ".json", {"command": command, **proj})
    atomic_write_text(a.out + ".md", md)
  print(md)
  return 0


def _tpu_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m vocabjax.bench tpu", formatter_class=argparse.RawDescriptionHelpFormatter,
      description="Compile every method's whole decoding step for a TPU topology on this "
      "host (deviceless: libtpu's compiler, abstract weights of the real shapes) and record "
      "per-chip memory against the chip's HBM, XLA's flops and bytes, the roofline time and "
      "PROJECTED speedups from a recorded run's tau (tpu.md, tpu.json in --out).",
      epilog="Method names: " + ", ".join(_tpu_names()))
  p.add_argument("--topology", required=True, help="a TPU topology: v5e:1x1, v5e:2x2, v6e:1x1, "
                 "v5p:1x1x1, ... (several chips: the model axis over all of them)")
  p.add_argument("--pair", choices=sorted(shapes.PAIRS), help="a target/drafter pair "
                 "(default qwen2.5-coder)")
  p.add_argument("--paper", choices=sorted(_paper_pairs()), help="a paper's pair at its "
                 "published sizes (vocabjax.bench.papers): its target, its published head's "
                 "shapes, its methods and tree, tau from the paper (PROJECTED speedups); "
                 "instead of --pair, --methods and --run")
  p.add_argument("--target", help="a target model instead of --pair (a name of "
                 "vocabjax.bench.shapes.KNOWN, a config.json, ...); with --draft")
  p.add_argument("--draft", help="its same-vocabulary drafter")
  p.add_argument("--cross-draft", help="crossvocab's drafter (default: the drafter)")
  p.add_argument("--out", required=True, help="result directory (tpu.md, tpu.json)")
  p.add_argument("--run", help="an eval result directory whose summary.json gives tau per "
                 "method (matched by name, else by registry method and step parameters)")
  p.add_argument("--methods", nargs="+", help="methods as the registry names them: NAME (its "
                 "defaults) or NAME:key=value,... (e.g. tree:top_k=4,depth=4,total_tokens=16; "
                 "files are stand-ins of the pair's shapes), or a short name (default: the gate "
                 "run's set; ar is always included: speedups are against it)")
  p.add_argument("--context", type=int, default=1024, help="cache slots S of the step programs "
                 "(their attention reads all S; default 1024, the gate run's max_len)")
  p.add_argument("--batch", type=int, default=1, help="batch rows B")
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                 help="the weights' and KV caches' dtype")
  p.add_argument("--weights", default="", choices=("", "int8", "int4"),
                 help="int8: weight-only int8 target and drafters (per-row scales; norms, "
                 "activations and caches stay --dtype; the bytes projected are int8's); int4: "
                 "grouped int4 (Q4_0's values: int4 codes, an f32 scale per 32 weights)")
  p.add_argument("--rolled-costs", action="store_true", help="take costs from the steps as "
                 "compiled (a loop body counted once) instead of a loop-unrolled copy (faster)")
  p.add_argument("--pad-draft-vocab", action="store_true", help="give a same-tokenizer drafter "
                 "with a shorter vocabulary the target's V (LM-head rows padded, never drafted), "
                 "e.g. Qwen2.5-0.5B (V=151936) for Qwen2.5-7B (V=152064): same-vocabulary "
                 "drafting refuses differing V")
  return p


def _paper_pairs() -> dict:
  from vocabjax.bench.papers import PAPER_PAIRS  # local: the published figures only for tpu

  return PAPER_PAIRS


def _tpu_names() -> list[str]:
  from vocabjax.bench.stand_ins import NAME_FORMS  # local: JAX's import only for this subcommand

  return list(NAME_FORMS)


@contextlib.contextmanager
def _libtpu_log():
  """libtpu's own C++ log lines (that no TPU host is found, compiler notes) go to a temporary
  file instead of stderr, which keeps this command's lines (its progress, one `error:` line);
  they are shown only when the command fails unexpectedly."""
  sys.stderr.flush()
  log = tempfile.TemporaryFile()
  saved = os.dup(2)
  os.dup2(log.fileno(), 2)
  ours = sys.stderr
  try:
    on_fd2 = ours.fileno() == 2
  except (AttributeError, OSError, ValueError):  # a captured stream (pytest's capsys)
    on_fd2 = False
  if on_fd2:  # Python's own lines go to the real stderr, not with libtpu's into the log
    sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1)
  failed = True
  try:
    yield
    failed = False
  finally:
    sys.stderr.flush()
    if on_fd2:
      sys.stderr.close()
    sys.stderr = ours
    os.dup2(saved, 2)
    os.close(saved)
    if failed:
      log.seek(0)
      tail = log.read().decode(errors="replace").splitlines()[-20:]
      print("libtpu's last log lines:\n" + "\n".join(tail), file=sys.stderr)
    log.close()


def _tpu(argv: list[str]) -> int:
  p = _tpu_parser()
  a = p.parse_args(argv)
  if (a.target is None) != (a.draft is None) or (a.target and a.pair):
    p.error("--target and --draft go together, without --pair")
  if a.context < 2 or a.batch < 1:
    p.error(f"--context {a.context} must be >= 2 and --batch {a.batch} >= 1")
  with _libtpu_log():
    return _tpu_run(a, argv)


def _tpu_run(a, argv: list[str]) -> int:
  import datetime
  import importlib.metadata
  import platform

  from vocabjax.bench import stand_ins, tpu, tpu_projection, tpu_report  # local: JAX, libtpu

  command = "python -m vocabjax.bench tpu " + shlex.join(argv)
  taus = labels = None
  try:
    if a.paper and (a.pair or a.target or a.draft or a.cross_draft or a.methods or a.run):
      raise ValueError("--paper names the models, methods and tau: without --pair, --target, "
                       "--draft, --cross-draft, --methods and --run")
    paper = _paper_pairs()[a.paper] if a.paper else None
    tname, dname = ((paper.target, paper.target) if paper else (a.target, a.draft) if a.target
                    else shapes.PAIRS[a.pair or "qwen2.5-coder"])
    tname, tc = shapes.resolve_config(tname)
    dname, dc = shapes.resolve_config(dname)
    xname, xc = shapes.resolve_config(a.cross_draft) if a.cross_draft else ("", None)
    if paper:  # no drafter model: the head is the paper's
      dname = f"no drafter model: {paper.head} ({paper.head_kind} head)"
      a.methods = [r.method for r in paper.rows]
      taus = {r.method: (r.tau, r.source) for r in paper.rows}
      labels = {r.method: r.label for r in paper.rows}
    if dc.vocab_size != tc.vocab_size:
      if not (a.pad_draft_vocab and dc.vocab_size < tc.vocab_size):
        raise ValueError(f"{dname} has V={dc.vocab_size}, {tname} V={tc.vocab_size}: "
                         f"same-vocabulary drafting needs one V; pass --pad-draft-vocab for a "
                         f"same-tokenizer drafter with fewer (padded) rows, or a --cross-draft")
      dname = f"{dname} (V {dc.vocab_size} padded to {tc.vocab_size})"
      dc = dataclasses.replace(dc, vocab_size=tc.vocab_size)
    methods = list(dict.fromkeys(["ar", *(a.methods or stand_ins.METHODS)]))
    for m in methods:
      stand_ins.method_spec(m)  # a bad name is refused before anything compiles
    heads = (dict(head_kind=paper.head_kind, head_vocab=paper.head_vocab,
                  head_intermediate=paper.head_intermediate, ranker_rank=paper.ranker_rank,
                  head_layers=paper.head_layers, head_layer_ids=paper.head_layer_ids)
             if paper else {})
    setup = stand_ins.Setup(tc, dc, cross_draft=xc, dtype=a.dtype, weights=a.weights,
                            target_name=tname, draft_name=dname, cross_draft_name=xname,
                            has_drafter=not paper, **heads)
    tpu.tpu_devices(a.topology)  # ValueError naming an unknown topology
    tpu.chip_of(a.topology)  # a topology libtpu knows but the chip table does not
    if a.run:
      tpu_projection.run_methods(a.run)  # a --run without a readable summary.json
    check_output_dir(a.out, "--out")  # before anything compiles
  except (ValueError, RuntimeError, shapes.ShapeError, UnsupportedConfigError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  out = Path(a.out)
  env = {"command": command,
         "date": datetime.datetime.now().isoformat(timespec="seconds"),
         "jax": importlib.metadata.version("jax"),
         "libtpu": importlib.metadata.version("libtpu"),
         "host": f"{platform.machine()} CPU, {os.cpu_count()} cores"}

  def save(result):
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "tpu.json", {**env, **result})
    atomic_write_text(out / "tpu.md", tpu_report.render({**env, **result}))

  try:
    result = tpu_projection.project(setup, a.topology, methods, B=a.batch, S=a.context, run=a.run,
                         unrolled_costs=not a.rolled_costs, on_row=save, taus=taus,
                         labels=labels, paper=paper.paper if paper else None,
                         progress=lambda text: print(text, file=sys.stderr, flush=True))
  except tpu_projection.TpuProjectionError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(tpu_report.render({**env, **result}))
  return 0


def _tpu_matrix(argv: list[str]) -> int:
  """Compile the TPU matrix (`tpu_projection.MATRIX_METHODS` x `MATRIX_TOPOLOGIES`, the
  shapes of tests/bench/test_tpu_steps.py: Qwen2.5-0.5B's layers, V = 151,936, a 2-layer
  target, 1-layer drafter, bf16, B = 1, S = 256) and write tpu_matrix.md / .json in --out."""
  import datetime
  import importlib.metadata

  p = argparse.ArgumentParser(prog="python -m vocabjax.bench tpu-matrix",
                              description=_tpu_matrix.__doc__)
  p.add_argument("--out", required=True, help="result directory")
  a = p.parse_args(argv)
  command = "python -m vocabjax.bench tpu-matrix " + shlex.join(argv)
  with _libtpu_log():
    from vocabjax.bench import tpu_projection, tpu_report  # local: JAX and libtpu only here

    setup = tpu_projection.matrix_setup()
    rows = []
    for method, topology, sharded in tpu_projection.matrix_cells():
      try:
        rows.append(tpu_projection.matrix_cell(method, setup, topology, sharded))
      except AssertionError as e:
        rows.append({"method": method, "topology": topology, "sharded": sharded,
                     "error": str(e)})
      print(f"{method} {topology}: {'error' if 'error' in rows[-1] else 'ok'}", flush=True)
  md = tpu_report.render_matrix(rows, setup, command)
  out = Path(a.out)
  atomic_write_json(out / "tpu_matrix.json", {
      "command": command, "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "libtpu": importlib.metadata.version("libtpu"), "rows": rows})
  atomic_write_text(out / "tpu_matrix.md", md)
  print(md)
  return 1 if any("error" in r for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["project"]:
    return _project(argv[1:])
  if argv[:1] == ["tpu"]:
    return _tpu(argv[1:])
  if argv[:1] == ["tpu-matrix"]:
    return _tpu_matrix(argv[1:])
  parser = _bench_parser()
  a = parser.parse_args(argv)
  import jax  # local: the backend decides the defaults

  accel = jax.default_backend() != "cpu"
  if a.target or a.draft:
    if not (a.target and a.draft) or a.pair:
      parser.error("--target and --draft go together, without --pair")
    pairs = ((a.target, a.draft),)
  else:
    names = a.pair or (sorted(shapes.PAIRS) if accel else ["qwen2.5-coder"])
    pairs = tuple(shapes.PAIRS[n] for n in names)
  settings = run.Settings(
      pairs=pairs, dtypes=tuple(a.dtypes or (("bfloat16", "float32") if accel else
                                              ("float32", "bfloat16"))),
      batches=tuple(a.batch or ((1, 4, 16, 64) if accel else (1,))), tokens=tuple(a.tokens),
      draft_tokens=tuple(a.draft_tokens), heads=tuple(a.heads), head_rows=tuple(a.head_rows),
      ranker_rank=a.ranker_rank, context=a.context, repeats=a.repeats, max_rows=a.max_rows,
      bandwidth_bytes=a.bandwidth_mib << 20)
  command = "python -m vocabjax.bench " + shlex.join(argv)
  try:
    if a.out:
      check_output_dir(a.out, "--out")  # before any program is compiled
    result = run.run_bench(settings, a.out, command=command, overwrite=a.overwrite,
                           progress=not a.no_progress)
  except (BenchError, shapes.ShapeError, UnsupportedConfigError, OutputPathError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(run.render(result))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
