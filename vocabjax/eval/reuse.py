"""Records of another result directory that a suite would make identically (`--reuse DIR`).

A larger suite often repeats a smaller one: `papers` runs `papers_small`'s questions and more,
with the same methods. Instead of generating those answers again, a run can take them from the
smaller suite's directory, but only where nothing that changes a record differs:

  the whole source    its run.json is readable; the same decoding settings (every config field
                      but name, datasets, methods and seeds), the same models' content, the
                      same vocabjax version and the same machine (timings of one machine only);
                      else refused with a ConfigError that names the difference
  a method            the same name with the same method and parameters, and the same content
                      in each of its files (head, subset, ranker); else left to run, with the
                      reason printed
  a question          the same id and text (the source's questions are loaded from its own
                      dataset specs and checked against its recorded hash first); seed in this
                      suite's seeds

    reusable(source, config, inputs, prompts, done) -> Reuse(records, splits, skipped)

Reused records keep their commit and gain `reused_from` (the source directory); the summary's
environment counts them per source. The source's step time split of a reused method comes with
its records, so their time_split stays consistent.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vocabjax.errors import ConfigError
from vocabjax.eval.provenance import questions_hash
from vocabjax.io import read_jsonl
from vocabjax.prompts import DatasetSpec, load_prompts

# config fields that may differ between a source and this run (per-record checks cover them)
_PER_RECORD = ("name", "datasets", "methods", "seeds")


@dataclasses.dataclass
class Reuse:
  records: list[dict]
  splits: dict  # method name -> the source's StepSplit dict
  skipped: list[str]  # why a method or question of the source was not reused


def _settings(config: dict) -> dict:
  d = {k: v for k, v in config.items() if k not in _PER_RECORD}
  d.setdefault("mesh", None)  # run.json files written before meshes lack the field
  return d


def _method_specs(config: dict) -> dict:
  return {m["name"]: (m["method"], json.dumps(m["params"], sort_keys=True, default=str))
          for m in config["methods"]}


def _source_prompts(source: Path, config: dict, recorded_hash: str | None) -> dict:
  """qid -> text of the questions the source ran, checked against its recorded hash."""
  specs = []
  for d in config["datasets"]:
    d = dict(d)
    if isinstance(d.get("categories"), list):
      d["categories"] = tuple(d["categories"])
    specs.append(DatasetSpec(**d))
  try:
    prompts = load_prompts(specs)
  except (ConfigError, OSError, TypeError) as e:
    raise ConfigError(f"--reuse {source}: its questions cannot be loaded again ({e})") from e
  h = questions_hash(prompts)
  if h != recorded_hash:
    raise ConfigError(f"--reuse {source}: its questions' files changed since it ran (their "
                      f"hash {h[:12]} differs from the recorded {str(recorded_hash)[:12]}), so "
                      f"its records cannot be matched to questions")
  return _turn_texts(prompts)


def _turn_texts(prompts) -> dict:
  """record qid -> the conversation up to that turn (a question's own text for one turn)."""
  return {p.turn_qid(t): p.turns[:t + 1] for p in prompts for t in range(len(p.turns))}


def reusable(source: str | Path, config, inputs: dict, prompts, done: set) -> Reuse:
  """The records of `source` that this run (`config` with `inputs`, over `prompts`) would make
  and has not made yet (`done`: (framework, method, qid, seed) keys); module doc."""
  source = Path(source)
  run_path = source / "run.json"
  try:
    run = json.loads(run_path.read_text())
    old_cfg, old_in = run["config"], run["inputs"]
  except FileNotFoundError:
    raise ConfigError(f"--reuse {source}: no run.json there (not a vocabjax.eval result "
                      f"directory)") from None
  except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
    raise ConfigError(f"--reuse {source}: its run.json is unreadable or lacks config/inputs "
                      f"({e!r})") from None
  if not old_in:
    raise ConfigError(f"--reuse {source}: it records no inputs (made before vocabjax recorded "
                      f"them), so nothing in it can be checked")
  new_cfg = config.as_dict()
  mine, theirs = _settings(new_cfg), _settings(old_cfg)
  diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
  if diff:
    raise ConfigError(f"--reuse {source}: other decoding settings: "
                      + "; ".join(f"{k} {theirs.get(k)!r} there, {mine.get(k)!r} here"
                                  for k in diff))
  for key, what in (("models", "the models' content"), ("vocabjax", "the vocabjax version"),
                    ("machine", "the machine")):
    if old_in.get(key) != inputs.get(key):
      raise ConfigError(f"--reuse {source}: {what} differs ({old_in.get(key)} there, "
                        f"{inputs.get(key)} here); its records would not be this run's")

  skipped = []
  ours, old_specs = _method_specs(new_cfg), _method_specs(old_cfg)
  methods = set()
  for name, spec in old_specs.items():
    if name not in ours:
      continue
    if spec != ours[name]:
      skipped.append(f"{name}: other method or parameters ({spec[0]} {spec[1]} there, "
                     f"{ours[name][0]} {ours[name][1]} here)")
      continue
    keys = {k for k in set(old_in.get("files", {})) | set(inputs.get("files", {}))
            if k.startswith(f"{name}.")}
    changed = sorted(k for k in keys
                     if old_in.get("files", {}).get(k) != inputs.get("files", {}).get(k))
    if changed:
      skipped.append(f"{name}: {', '.join(changed)} changed content")
      continue
    methods.add(name)

  texts = _turn_texts(prompts)
  old_texts = _source_prompts(source, old_cfg, old_in.get("questions"))
  questions = set()
  for qid, text in old_texts.items():
    if qid in texts and texts[qid] != text:
      skipped.append(f"question {qid}: other text")
    elif qid in texts:
      questions.add(qid)

  seeds = set(config.seeds)
  records, seen = [], set(done)
  # read only: a run may still be appending to the source's records
  for r in read_jsonl(source / "questions.jsonl", ConfigError, repair=False):
    key = (r.get("framework"), r.get("method"), r.get("qid"), r.get("seed"))
    if (key[0] != "vocabjax" or key[1] not in methods or key[2] not in questions
        or key[3] not in seeds or key in seen):
      continue
    seen.add(key)
    records.append({**r, "reused_from": r.get("reused_from") or str(source)})
  try:
    old_splits = json.loads((source / "splits.json").read_text())
  except FileNotFoundError:
    old_splits = {}
  except (OSError, json.JSONDecodeError) as e:
    raise ConfigError(f"--reuse {source}: its splits.json is unreadable ({e!r})") from None
  used = {r["method"] for r in records}
  splits = {n: s for n, s in old_splits.items() if n in used}
  return Reuse(records=records, splits=splits, skipped=skipped)
