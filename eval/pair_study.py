"""What the registry-pair studies share (`sizing_batch.py`, `continuous_batching.py`): the
pair's and the rows' flags, the methods checked against the study's runs (plain decoding
first: the reference), the models loaded, the rows picked, the commit."""

from __future__ import annotations

import subprocess
from pathlib import Path

from vocabjax import load_model

from crossvocab_batch import pick_rows  # noqa: E402 (the script's directory)


def add_pair_args(ap, runs, *, prompts_flag: str, prompts: int, max_new_tokens: int) -> None:
  """The flags every pair study takes (`runs`: (name, registry method, parameters));
  `prompts_flag` names the number of Spec-Bench prompts (`a.prompts`)."""
  ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
  ap.add_argument("--draft-dtype", default="int8")
  ap.add_argument("--target-dtype", default=None,
                  help="the target's dtype (default: its GGUF file's own blocks)")
  ap.add_argument(prompts_flag, dest="prompts", type=int, default=prompts,
                  help="Spec-Bench prompts decoded")
  ap.add_argument("--max-prompt-tokens", type=int, default=160)
  ap.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
  ap.add_argument("--methods", nargs="+", default=[name for name, _, _ in runs],
                  help="of RUNS' names (ar first: the reference)")
  ap.add_argument("--out", help="where the results go (required for a run)")


def pair_setup(a, runs):
  """(the runs `a.methods` names, the output folder (made), target, drafter, rows, their qids,
  the commit) for parsed flags `a`."""
  chosen = [r for r in runs if r[0] in a.methods]
  if not chosen or chosen[0][0] != "ar" or len(chosen) != len(a.methods):
    raise SystemExit(f"--methods: ar and some of {[name for name, _, _ in runs]}, got "
                     f"{a.methods}")
  if not a.out:
    raise SystemExit("--out DIR: where the results go")
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  target = load_model(a.target, dtype=getattr(a, "target_dtype", None))
  draft = load_model(a.draft, dtype=a.draft_dtype)
  rows, qids = pick_rows(target.tokenizer, a.prompts, a.max_prompt_tokens)
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  return chosen, out, target, draft, rows, qids, commit
