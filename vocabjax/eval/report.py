"""Summary JSON (stable, documented schema), markdown and CSV tables, PNG plots.

summary.json, schema version 1 (`SUMMARY_SCHEMA`, checked by `validate_summary`):
  schema_version  1
  suite, fingerprint, config        the suite and its full config
  environment     commit, record_commits (every commit that produced a record: a resumed run
                  may span several), reused_from ({directory: records taken from it by
                  --reuse}), machine, backend, jax, dtype, date, command, report_only
                  (true: written by --report-only from recorded records; machine, cpu and
                  cpu_count then the records')
  models          target / draft: source, vocab_size, params_per_token (embedding excluded);
                  own_drafts (optional) {suite's name: the same + methods}: methods' own drafters
  groups          task groups in table order
  methods[]       name, method, framework ("vocabjax" | "torch"), params, draft_vocab_size,
                  overall and by_group[group]: the metrics of `vocabjax.eval.metrics.aggregate`
                  (questions, tokens, wall_s, tokens_per_s, tau, acceptance_rate, mbsu, speedup,
                  match_rate, time_split); torch rows' speedup is against transformers' own plain
                  decoding, their match_rate against vocabjax's autoregressive output
  time_split_per_step  {method: vocabjax.decoding.profile.StepSplit.as_dict()}
  torch           versions of torch / transformers, or null
  mbsu_unavailable (optional, --report-only) {method: why}: methods whose MBSU and head rows
                  could not be computed (their head / ranker / subset files are not at hand)
  partial         (optional) null, or for a report of an unfinished run (--report-only):
                  questions (x seeds) every method finished and counted, of (the suite's),
                  records_left_out, left_out ("qid/seed s" not counted)
  reference       (optional) the recorded reference run this one is set beside
                  (`attach_reference`): path, commit, machine, cpu, date, same_config, and
                  per method in both runs {speedup, tokens_per_s, tau, match_rate} for each
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import os
import re
import platform
import subprocess
import sys
from pathlib import Path

from vocabjax.eval.metrics import aggregate
from vocabjax.eval.provenance import cpu_model
from vocabjax.io import atomic_write_json, atomic_write_text
from vocabjax.methods import METHODS
from vocabjax.plots import save_png, subplots
from vocabjax.prompts import GROUP_ORDER

SCHEMA_VERSION = 1
_NUM = {"type": ["number", "null"]}
_METRICS = {
    "type": "object",
    "required": ["questions", "tokens", "wall_s", "tokens_per_s", "tau", "acceptance_rate",
                 "mbsu", "time_split"],
    "properties": {"questions": {"type": "integer", "minimum": 1},
                   "tokens": {"type": "integer", "minimum": 0}, "wall_s": _NUM,
                   "tokens_per_s": _NUM, "tau": _NUM, "acceptance_rate": _NUM, "mbsu": _NUM,
                   "speedup": _NUM, "match_rate": _NUM, "decode_tokens_per_s": _NUM,
                   "decode_speedup": _NUM,
                   "time_split": {"type": ["object", "null"]}},
}
SUMMARY_SCHEMA = {
    "type": "object",
    "required": ["schema_version", "suite", "fingerprint", "config", "environment", "models",
                 "groups", "methods", "time_split_per_step", "torch"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "suite": {"type": "string"}, "fingerprint": {"type": "string"},
        "config": {"type": "object"},
        "environment": {"type": "object",
                        "required": ["commit", "machine", "backend", "jax", "dtype", "date",
                                     "command"]},
        "models": {"type": "object", "required": ["target"]},
        "groups": {"type": "array", "items": {"type": "string"}},
        "methods": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["name", "method", "framework", "params", "overall", "by_group"],
            "properties": {"framework": {"enum": ["vocabjax", "torch"]},
                           "overall": _METRICS,
                           "by_group": {"type": "object", "additionalProperties": _METRICS}}}},
        "time_split_per_step": {"type": "object"},
        "torch": {"type": ["object", "null"]},
        "skipped": {"type": "array", "items": {"type": "object",
                                               "required": ["qid", "source", "reason"]}},
        "partial": {"type": ["object", "null"], "required": ["questions", "of"]},
        "mbsu_unavailable": {"type": "object", "additionalProperties": {"type": "string"}},
        "reference": {"type": ["object", "null"],
                      "required": ["path", "commit", "machine", "same_config", "methods"]},
    },
}

# The recorded reference run of each shipped suite, trimmed to what a comparison reads
# (`trim_reference`): references/<suite>.json, shipped with the package. The runs themselves are
# recorded in the source tree's eval/results/<suite>/; `write_reference` makes the trimmed copy.
REFERENCE_ROOT = Path(__file__).parent / "references"
_REF_METRICS = ("speedup", "tokens_per_s", "tau", "match_rate")
_REF_ENV = ("commit", "machine", "cpu", "cpu_count", "date", "dtype")


def reference_summary_path(suite: str, out: Path, reference: str | None = None) -> Path | None:
  """The reference to set a run beside: `reference` (a results directory or a summary.json;
  "none" for no comparison), else the shipped reference of the same suite
  (references/<suite>.json). None when there is none, or when `out` is the given directory
  itself (recording it)."""
  if reference is not None and reference.lower() == "none":
    return None
  if reference is None:
    path = REFERENCE_ROOT / f"{suite}.json"
    return path if path.is_file() else None
  path = Path(reference)
  path = path / "summary.json" if path.is_dir() else path
  if not path.is_file():
    raise FileNotFoundError(f"--reference {reference}: no summary.json there")
  if path.parent.resolve() == Path(out).resolve():
    return None
  return path


def trim_reference(summary: dict, source: str) -> dict:
  """What a later run's comparison reads of a recorded run's summary: its fingerprint, its
  environment's provenance and each method's overall speedup, tokens/s, tau and match rate.
  `source` names the recorded run (a path in the source tree)."""
  validate_summary(summary)
  env = summary["environment"]
  return {"reference_of": summary["suite"], "source": source,
          "fingerprint": summary["fingerprint"],
          "environment": {k: env.get(k) for k in _REF_ENV},
          "methods": {m["name"]: {k: m["overall"].get(k) for k in _REF_METRICS}
                      for m in summary["methods"]}}


def write_reference(summary_path: str | os.PathLike, root: str | os.PathLike = REFERENCE_ROOT,
                    source: str | None = None) -> Path:
  """Write the trimmed reference (`trim_reference`) of the recorded run whose summary.json is
  `summary_path` to `root`/<suite>.json, atomically. Returns the file written."""
  summary_path = Path(summary_path)
  summary = json.loads(summary_path.read_text())
  ref = trim_reference(summary, source or str(summary_path.parent))
  dest = Path(root) / f"{summary['suite']}.json"
  dest.parent.mkdir(parents=True, exist_ok=True)
  atomic_write_text(dest, json.dumps(ref, indent=1, sort_keys=True) + "\n")
  return dest


def load_reference(path: Path) -> dict:
  """A reference as `trim_reference` writes it, from a trimmed file or a full summary.json."""
  data = json.loads(Path(path).read_text())
  if "reference_of" in data:
    missing = [k for k in ("source", "fingerprint", "environment", "methods") if k not in data]
    if missing:
      raise ValueError(f"a trimmed reference without {missing}")
    return data
  return trim_reference(data, str(Path(path).parent))


def attach_reference(summary: dict, ref_path: Path) -> dict:
  """`summary` plus a `reference` entry: the reference run's overall metrics per method,
  beside this run's. A reference that cannot be read is reported, never fatal."""
  try:
    ref = load_reference(ref_path)
  except Exception as e:  # noqa: BLE001 -- a broken reference must not lose this run's report
    print(f"[vocabjax.eval] the reference run {ref_path} cannot be read ({e}); no comparison",
          file=sys.stderr)
    return summary
  renv = ref["environment"]
  methods = {}
  for m in summary["methods"]:
    r = ref["methods"].get(m["name"])
    if r is not None:
      methods[m["name"]] = {k: {"this": m["overall"].get(k), "reference": r.get(k)}
                            for k in _REF_METRICS}
  summary = {**summary, "reference": {
      "path": ref["source"], "commit": renv.get("commit"), "machine": renv.get("machine"),
      "cpu": renv.get("cpu"), "cpu_count": renv.get("cpu_count"), "date": renv.get("date"),
      "dtype": renv.get("dtype"), "same_config": ref["fingerprint"] == summary["fingerprint"],
      "methods": methods}}
  validate_summary(summary)
  return summary


def reference_markdown(ref: dict) -> list[str]:
  """The comparison section of the markdown report."""
  lines = ["", f"This run beside the recorded reference run (`{ref['path']}`: commit "
           f"{str(ref['commit'])[:7]}, {ref.get('cpu') or ref['machine']}, "
           f"{ref.get('cpu_count') or '?'} CPUs, {ref['date']}, {ref.get('dtype')}):", ""]
  if not ref["same_config"]:
    lines += ["(the reference was run with another configuration of this suite: models, "
              "questions, methods or settings differ, so compare with care)", ""]
  if not ref["methods"]:
    return lines + ["(no method of this run is in the reference run)"]
  lines += ["| method | speedup | reference speedup | tok/s | reference tok/s | tok/s ratio | "
            "tau | reference tau | match AR | reference match AR |", "|---" * 10 + "|"]
  for name, v in ref["methods"].items():
    t, r = v["tokens_per_s"]["this"], v["tokens_per_s"]["reference"]
    ratio = t / r if t and r else None
    lines.append(
        f"| {name} | {_f(v['speedup']['this'], suffix='x')} | "
        f"{_f(v['speedup']['reference'], suffix='x')} | {_f(t)} | {_f(r)} | "
        f"{_f(ratio, suffix='x')} | {_f(v['tau']['this'])} | {_f(v['tau']['reference'])} | "
        f"{_f(v['match_rate']['this'], '{:.0%}')} | {_f(v['match_rate']['reference'], '{:.0%}')} |")
  lines += ["", "tok/s ratio: this machine's tokens/s over the reference's (the machines' speed); "
            "the speedups are each run's own ratio to plain decoding, so they compare across "
            "machines; tau and match AR should agree whatever the machine (greedy runs)."]
  return lines


def validate_summary(summary: dict) -> None:
  """Raise jsonschema.ValidationError when `summary` breaks the documented schema."""
  import jsonschema

  jsonschema.validate(summary, SUMMARY_SCHEMA)


def git_commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def _clean(x):
  """JSON-safe: NaN/inf become null."""
  if isinstance(x, float) and not math.isfinite(x):
    return None
  if isinstance(x, dict):
    return {k: _clean(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_clean(v) for v in x]
  return x


def models_info(models) -> dict:
  """What the summary needs of the loaded models (so the weights can be freed before it)."""
  return {"target_config": models.target.config, "target_source": models.target.source,
          "draft_config": models.draft.config if models.draft else None,
          "draft_source": models.draft.source if models.draft else None,
          # a method's own drafter (`MethodSpec.draft`), by the name the suite gives
          "own_drafts": {src: (d.config, d.source)
                         for src, d in models.own_drafts.items()},
          "dtype": weights_label(models.target.dtype,
                                 models.draft.dtype if models.draft else None)}


def weights_label(target_dtype, draft_dtype=None) -> str:
  """The weights a run loaded, in words: the target's dtype name ('float32', 'gguf': a GGUF
  file's blocks, ...), and the drafter's where it differs."""
  from vocabjax.checkpoints.loader import dtype_name  # local: the loader imports jax and models

  t = dtype_name(target_dtype)
  d = dtype_name(draft_dtype) if draft_dtype is not None else t
  return t if d == t else f"{t} (drafter {d})"


def build_summary(config, records: list[dict], info: dict, splits: dict, meta: dict) -> dict:
  """The summary dict (schema above) from the records; `info` from `models_info`."""
  import jax

  tcfg, dcfg = info["target_config"], info["draft_config"]
  t_params = tcfg.num_params(include_embedding=False, head_rows=tcfg.vocab_size)
  groups = sorted({r["group"] for r in records},
                  key=lambda g: (GROUP_ORDER.index(g) if g in GROUP_ORDER else 99, g))
  greedy = config.greedy
  # SPEED-Bench's prompts: their categories (the later turns of a multi-turn prompt counted
  # with the first) for the per-category acceptance matrix
  speed_cats = sorted({c for r in records if (c := _speed_category(r))})
  ar_name = next(m.name for m in config.methods if m.method == "ar")
  by = {}
  for r in records:
    by.setdefault((r["framework"], r["method"]), []).append(r)
  vj_ar = {(r["qid"], r["seed"]): r for r in by.get(("vocabjax", ar_name), [])}
  torch_ar = {(r["qid"], r["seed"]): r for r in by.get(("torch", "ar"), [])}

  methods, unavailable = [], {}
  own = info.get("own_drafts") or {}
  rows = [("vocabjax", m.name, m.method, m.kwargs, m.draft) for m in config.methods]
  rows += [("torch", n, n, {}, None) for n in ("ar", "assisted", "uag") if ("torch", n) in by]
  for fw, name, method, params, own_draft in rows:
    mcfg = own[own_draft][0] if own_draft in own else dcfg  # the drafter this method used
    recs = by.get((fw, name), [])
    if not recs:
      continue
    c = gamma = vocab = None
    spec = METHODS.get(method) if fw == "vocabjax" else None
    full = spec.params(**params) if spec is not None else None  # the run validated them
    try:
      if spec is not None and spec.drafter_params is not None:  # a drafter of its own (EAGLE)
        vocab = spec.head_rows(full) if spec.head_rows else None
        c = spec.drafter_params(full) / t_params
        gamma = spec.drafter_passes(full)
      elif spec is not None and spec.drafter_passes and mcfg is not None:
        vocab = spec.head_rows(full) if spec.head_rows else mcfg.vocab_size
        c = mcfg.num_params(include_embedding=False, head_rows=vocab) / t_params
        gamma = spec.drafter_passes(full)
    except Exception as e:  # noqa: BLE001 (whatever a missing or unreadable file raises)
      if not meta.get("files_may_be_missing"):
        raise
      c = gamma = vocab = None  # MBSU and the head's rows need the method's files
      unavailable[name] = f"{type(e).__name__}: {e}"
    base = vj_ar if fw == "vocabjax" else torch_ar

    def agg(rs):
      a = aggregate(rs, base, greedy=greedy, c=c, gamma=gamma)
      if fw == "torch" and greedy and vj_ar:
        same = [r["output_ids"] == vj_ar[(r["qid"], r["seed"])]["output_ids"]
                for r in rs if (r["qid"], r["seed"]) in vj_ar]
        a["match_rate"] = sum(same) / len(same) if same else None
      return a

    methods.append({
        "name": name if fw == "vocabjax" else f"torch:{name}", "method": method,
        "framework": fw, "params": params, "draft_vocab_size": vocab,
        "overall": agg(recs),
        "by_group": {g: agg([r for r in recs if r["group"] == g]) for g in groups
                     if any(r["group"] == g for r in recs)},
        **({"by_speed_bench_category": {
            c: agg(rs) for c in speed_cats
            if (rs := [r for r in recs if _speed_category(r) == c])}} if speed_cats else {})})

  env = {"commit": git_commit(),
         "record_commits": sorted({str(r.get("commit")) for r in records}),
         "reused_from": {src: sum(r.get("reused_from") == src for r in records)
                         for src in sorted({r["reused_from"] for r in records
                                            if r.get("reused_from")})},
         "machine": platform.node() or platform.machine(),
         "backend": jax.default_backend(), "jax": jax.__version__,
         "dtype": info["dtype"],
         "date": datetime.datetime.now().isoformat(timespec="seconds"),
         "command": meta.get("command") or " ".join(["python -m vocabjax.eval", *sys.argv[1:]]),
         "cpu_count": __import__("os").cpu_count(), "cpu": cpu_model(),
         "load_s": meta.get("load_s"), **(meta.get("environment") or {})}
  model_info = {"target": {"source": info["target_source"], "vocab_size": tcfg.vocab_size,
                           "params_per_token": t_params}}
  if dcfg is not None:
    model_info["draft"] = {"source": info["draft_source"], "vocab_size": dcfg.vocab_size,
                           "params_per_token": dcfg.num_params(include_embedding=False,
                                                               head_rows=dcfg.vocab_size)}
  for src, (cfg, source) in own.items():  # methods' own drafters
    model_info.setdefault("own_drafts", {})[src] = {
        "source": source, "vocab_size": cfg.vocab_size,
        "params_per_token": cfg.num_params(include_embedding=False, head_rows=cfg.vocab_size),
        "methods": [m.name for m in config.methods if m.draft == src]}
  summary = {"schema_version": SCHEMA_VERSION, "suite": config.name,
             "fingerprint": config.fingerprint(), "config": config.as_dict(),
             "environment": env, "models": model_info, "groups": groups, "methods": methods,
             "time_split_per_step": splits, "torch": meta.get("torch_versions"),
             "skipped": meta.get("skipped") or [], "partial": meta.get("partial"),
             **({"mbsu_unavailable": unavailable} if unavailable else {})}
  summary = _clean(summary)
  validate_summary(summary)
  return summary


def _speed_category(record: dict) -> str | None:
  """A SPEED-Bench record's category: its group, without a later turn's `/turn<n>`; None for
  a record of another dataset."""
  if not str(record["qid"]).startswith("speed_bench/"):
    return None
  return re.sub(r"/turn\d+$", "", record["group"])


def speed_bench_matrix(summary: dict) -> list[str]:
  """The per-category acceptance matrix of SPEED-Bench's prompts (categories x methods, the
  mean accepted length per step, as SPEED-Bench's own report lays it out), with the number of
  answers (each turn of a multi-turn prompt is one); [] when the suite has none of its
  prompts."""
  methods = [m for m in summary["methods"]
             if m.get("by_speed_bench_category") and m["method"] != "ar"]
  if not methods:
    return []
  cats = sorted({c for m in methods for c in m["by_speed_bench_category"]})
  lines = ["", "Acceptance length per SPEED-Bench category (tau: tokens per target step):", "",
           "| category | answers | " + " | ".join(m["name"] for m in methods) + " |",
           "|---" * (len(methods) + 2) + "|"]
  for c in cats:
    n = max(m["by_speed_bench_category"].get(c, {}).get("questions", 0) for m in methods)
    cells = [_f(m["by_speed_bench_category"].get(c, {}).get("tau")) for m in methods]
    lines.append(f"| {c} | {n} | " + " | ".join(cells) + " |")
  return lines


def _f(x, fmt="{:.2f}", suffix=""):
  return "-" if x is None else fmt.format(x) + suffix


def markdown(summary: dict) -> str:
  env, groups = summary["environment"], summary["groups"]
  lines = [f"# vocabjax eval: {summary['suite']}", "",
           f"- command: `{env['command']}`", f"- commit: `{env['commit']}`",
           f"- machine: {env['machine']} ({env['cpu_count']} CPUs, {env.get('cpu') or 'CPU model unknown'}), backend {env['backend']}, "
           f"jax {env['jax']}, {env['dtype']}", f"- date: {env['date']}",
           *([f"- **partial run**: {summary['partial']['questions']} of "
              f"{summary['partial']['of']} questions (x seeds) finished by every method, and "
              f"only those are counted ({summary['partial']['records_left_out']} record(s) of "
              f"unfinished questions left out: "
              f"{', '.join(summary['partial']['left_out'][:20])}"
              f"{' ...' if len(summary['partial']['left_out']) > 20 else ''})"]
             if summary.get("partial") else []),
           *([f"- MBSU and head rows not computed for {', '.join(summary['mbsu_unavailable'])}: "
              f"their files are not here ("
              + "; ".join(f"{k}: {v[:160]}" for k, v in
                          list(summary["mbsu_unavailable"].items())[:3])
              + (" ..." if len(summary["mbsu_unavailable"]) > 3 else "") + ")"]
             if summary.get("mbsu_unavailable") else []),
           *([f"- reports written from the recorded records (--report-only) on "
              f"{platform.node() or platform.machine()}; machine and CPU above are the "
              f"records'"] if env.get("report_only") else []),
           *(["- records reused from other result directories (--reuse): "
              + ", ".join(f"{n} from {d}" for d, n in env["reused_from"].items())]
             if env.get("reused_from") else []),
           f"- target: {summary['models']['target']['source']}"
           + (f"; draft: {summary['models']['draft']['source']}"
              if "draft" in summary["models"] else "")
           + "".join(f"; {', '.join(d['methods'])}'s draft: {d['source']}"
                     for d in (summary["models"].get("own_drafts") or {}).values()),
           f"- {summary['config']['max_new_tokens']} new tokens, temperature "
           f"{summary['config']['temperature']}, seeds {summary['config']['seeds']}; tokens/s "
           "excludes compilation; speedup = ratio of total tokens / total time against plain "
           "decoding of the same framework on the same questions in this run; decode x = the "
           "same ratio over the decoding phase alone (prefill of both models left out)", *(
               [f"- skipped (--skip-bad-prompts), {len(summary['skipped'])} questions: "
                + "; ".join(f"{q['qid']} ({q['source'] or 'no file'}): {q['reason']}"
                            for q in summary["skipped"])] if summary.get("skipped") else []),
           "",
           "Speedup per task group (Spec-Bench layout):", "",
           "| method | " + " | ".join(groups) + " | overall | decode x | tau | accept rate | "
           "tok/s | match AR | MBSU |",
           "|---" * (len(groups) + 8) + "|"]
  for m in summary["methods"]:
    o = m["overall"]
    cells = [_f(m["by_group"].get(g, {}).get("speedup"), suffix="x") for g in groups]
    lines.append(f"| {m['name']} | " + " | ".join(cells) + f" | {_f(o.get('speedup'), suffix='x')}"
                 f" | {_f(o.get('decode_speedup'), suffix='x')} | {_f(o['tau'])} | {_f(o['acceptance_rate'])} | {_f(o['tokens_per_s'])} | "
                 f"{_f(o.get('match_rate'), '{:.0%}')} | {_f(o['mbsu'])} |")
  lines += ["", "Per task group (questions, tau, tok/s):", "",
            "| method | " + " | ".join(groups) + " |", "|---" * (len(groups) + 1) + "|"]
  for m in summary["methods"]:
    cells = []
    for g in groups:
      a = m["by_group"].get(g)
      cells.append("-" if not a else f"{a['questions']}q, {_f(a['tau'])}, {_f(a['tokens_per_s'])}")
    lines.append(f"| {m['name']} | " + " | ".join(cells) + " |")
  lines += speed_bench_matrix(summary)
  splits = summary["time_split_per_step"]
  if splits:
    lines += ["", "Time split of one step (each part timed as its own program, batch 1):", "",
              "| method | drafter body ms | drafter LM head ms | verification ms | step ms | "
              "LM head share of drafter | AR step ms | run: drafter / head / verify / other s |",
              "|---|---|---|---|---|---|---|---|"]
    excess = []
    for m in summary["methods"]:
      s = splits.get(m["name"]) if m["framework"] == "vocabjax" else None
      if not s:
        continue
      ts = m["overall"]["time_split"] or {}
      run = " / ".join(_f(ts.get(k), "{:.1f}") for k in ("drafter_s", "drafter_head_s",
                                                          "verification_s", "other_s"))
      if (ts.get("parts_excess_s") or 0) > 0:  # parts timed apart exceed the run somewhere
        excess.append(f"{m['name']} ({ts['parts_excess_s']:.1f} s)")
      lines.append(f"| {m['name']} | {1e3 * s['drafter_s']:.1f} | {1e3 * s['drafter_head_s']:.1f}"
                   f" | {1e3 * s['verification_s']:.1f} | {1e3 * s['step_s']:.1f} | "
                   f"{s['drafter_head_share']:.0%} | {1e3 * s['target_step_s']:.1f} | {run} |")
    if excess:
      lines += ["", f"The parts, each timed as a program of its own (the step fuses them), add "
                f"up to more than the run took in some questions of {', '.join(excess)}: there "
                f"they are upper bounds and 'other' counts 0."]
  sizes = sorted({m["draft_vocab_size"] for m in vocab_points(summary)})
  if len(sizes) == 1:
    lines += ["", f"tau_vs_vocab.png is not drawn: every method drafts over {sizes[0]:,} LM-head "
              f"rows (tau against the drafting vocabulary needs two sizes or more)."]
  if summary.get("reference"):
    lines += reference_markdown(summary["reference"])
  return "\n".join(lines) + "\n"


CSV_FIELDS = ("method", "framework", "group", "questions", "tokens", "wall_s", "tokens_per_s",
              "tau", "acceptance_rate", "speedup", "match_rate", "mbsu")


def to_csv(summary: dict) -> str:
  buf = io.StringIO()
  w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
  w.writeheader()
  for m in summary["methods"]:
    for g, a in [("overall", m["overall"]), *m["by_group"].items()]:
      w.writerow({"method": m["name"], "framework": m["framework"], "group": g, **a})
  return buf.getvalue()


# drafter families: one colour each (methods of a family share it; a marker / hatch each)
FAMILIES = {"chain": "drafter model", "tree": "drafter model", "vocabtrim": "drafter model",
            "frspec": "drafter model", "specvocab": "drafter model", "eagle": "EAGLE head",
            "eagle_pld": "EAGLE head + lookup", "medusa": "Medusa heads", "pld": "prompt lookup",
            "crossvocab": "other-tokenizer drafter"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*", "d", "1", "2", "+")
HATCHES = ("", "//", "..", "xx", "\\\\", "--", "oo", "++", "**", "||", "OO", "//..", "xx..",
           "--..", "++..", "oo//")


def family(m: dict) -> str:
  """A summary method's drafter family (its colour in the plots): the drafter it drafts with,
  whatever vocabulary policy it applies; the papers' suites name the EAGLE head's methods
  full_* and the small drafter's lm_*, which are families of their own there."""
  if m.get("framework") == "torch":
    return "transformers"
  name = m.get("name", "")
  if name.startswith("full_"):
    return "EAGLE head, full vocabulary"
  if name.startswith("lm_"):
    return "drafter model"
  return FAMILIES.get(m.get("method"), m.get("method", "?"))


def method_styles(methods) -> dict:
  """name -> (colour, marker, hatch): a colour per family (tab10, then tab20), a marker and a
  hatch per method within its family, in the summary's order: with 18 methods no two share
  a style (matplotlib's 10-colour cycle repeats)."""
  from matplotlib import colormaps

  fams = list(dict.fromkeys(family(m) for m in methods))
  cmap = colormaps["tab10" if len(fams) <= 10 else "tab20"]
  seen: dict = {}
  out = {}
  for m in methods:
    f = family(m)
    i = seen[f] = seen.get(f, -1) + 1
    out[m["name"]] = (cmap(fams.index(f) % cmap.N), MARKERS[i % len(MARKERS)],
                      HATCHES[i % len(HATCHES)])
  return out


def vocab_points(summary: dict) -> list[dict]:
  """The methods tau_vs_vocab.png draws: those with a drafting vocabulary and a tau."""
  return [m for m in summary["methods"] if m["method"] != "ar" and m.get("draft_vocab_size")
          and m["overall"]["tau"] is not None]


def plots(summary: dict, out: Path, extra_points=None) -> list[Path]:
  """speedup_by_group.png (bars per task group and overall, a colour per drafter family, a
  hatch per method) and tau_vs_vocab.png (tau against the drafting vocabulary's LM-head rows on
  a log axis, a marker per method); legends outside the axes. `extra_points`: (label, [(rows,
  tau), ...]) drawn beside ours (a paper's published points). tau_vs_vocab.png is drawn only
  when the points have at least two vocabulary sizes (one x carries nothing to read)."""
  groups = summary["groups"] + ["overall"]
  ms = [m for m in summary["methods"] if m["method"] != "ar"]
  styles = method_styles(ms)
  paths = []
  fig, ax = subplots(figsize=(max(7, 1.3 * len(groups)) + 3, 4.5))
  width = 0.8 / max(1, len(ms))
  for j, m in enumerate(ms):
    vals = [(m["overall"] if g == "overall" else m["by_group"].get(g, {})).get("speedup")
            for g in groups]
    color, _, hatch = styles[m["name"]]
    ax.bar([i + j * width for i in range(len(groups))], [v or 0 for v in vals], width,
           label=m["name"], color=color, hatch=hatch, edgecolor="white", linewidth=0.3)
  ax.axhline(1.0, color="k", lw=0.8, ls="--")
  ax.set_xticks([i + width * (len(ms) - 1) / 2 for i in range(len(groups))], groups,
                rotation=30, ha="right")
  ax.set_ylabel("speedup over plain decoding")
  ax.set_title(f"{summary['suite']}: speedup per task group")
  if ms:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
  paths.append(out / "speedup_by_group.png")
  save_png(fig, paths[-1], dpi=120)

  pts = vocab_points(summary)
  stale = out / "tau_vs_vocab.png"
  if len({m["draft_vocab_size"] for m in pts} | {x for _, xy in extra_points or () for x, _ in xy}
         ) < 2:  # one x: nothing to read (summary.md says so); an earlier run's figure goes
    stale.unlink(missing_ok=True)
    return paths
  fig, ax = subplots(figsize=(8, 4.5))
  for m in pts:
    color, marker, _ = styles[m["name"]]
    ax.scatter(m["draft_vocab_size"], m["overall"]["tau"], label=m["name"], color=color,
               marker=marker, s=40)
  for label, xy in extra_points or ():
    ax.scatter([x for x, _ in xy], [y for _, y in xy], label=label, facecolors="none",
               edgecolors="k", marker="o", s=50)
    ax.plot([x for x, _ in xy], [y for _, y in xy], color="k", lw=0.6, ls=":")
  ax.set_xscale("log")
  ax.set_xlabel("drafter vocabulary (LM-head rows, log)")
  ax.set_ylabel("tau (tokens per target forward)")
  ax.set_title("acceptance length vs drafter vocabulary")
  if pts or extra_points:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
  paths.append(out / "tau_vs_vocab.png")
  save_png(fig, paths[-1], dpi=120)
  return paths


def write_reports(out: Path, summary: dict) -> None:
  atomic_write_json(out / "summary.json", summary)
  atomic_write_text(out / "summary.md", markdown(summary))
  atomic_write_text(out / "summary.csv", to_csv(summary))
  plots(summary, out)
