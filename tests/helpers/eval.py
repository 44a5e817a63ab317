"""The eval command line as the tests run it (`run_eval`: quiet, into an output folder) and the
questions of their Spec-Bench-format files (`QUESTIONS`)."""

from vocabjax.eval.__main__ import main, parse_args

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Again."]},
    {"question_id": 2, "category": "coding", "turns": ["def add(a, b):"]},
    {"question_id": 3, "category": "translation", "turns": ["Bonjour le monde"]},
    {"question_id": 4, "category": "qa", "turns": ["Who are you?"]},
]


def run_eval(path, out, *extra):
  return main(parse_args(["--config", str(path), "--out", str(out), "--quiet", *extra]))
