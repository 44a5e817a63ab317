"""Vocabulary overlap of two real tokenizers (OmniDraft's direct mapping).

    python eval/vocab_overlap.py --draft smollm2-135m-instruct \
        --target qwen2.5-coder-1.5b-instruct --out eval/results/vocab_overlap.json

Loads only the tokenizers (from the registry's cached GGUF files), reduces every token to its
bytes (`vocabjax.vocab.translate`), and reports the intersection, its share of each
vocabulary, and whether each tokenizer round-trips a few texts.
"""

from __future__ import annotations

import argparse
import json
import time


TEXTS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.",
         "Natalia sold clips to 48 of her friends in April, and then she sold half as many.",
         "  leading spaces and\ttabs\n\nnewlines", "naïve café, 東京, emoji 🙂"]


def main(argv=None) -> int:
  from vocabjax.checkpoints import zoo
  from vocabjax.checkpoints.gguf_io import load_gguf_tokenizer
  from vocabjax.io import atomic_write_text
  from vocabjax.vocab.translate import TranslationError, build_vocab_map, check_round_trip

  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--draft", required=True)
  p.add_argument("--target", required=True)
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  t0 = time.perf_counter()
  toks = {k: load_gguf_tokenizer(zoo.fetch(name)) for k, name in (("draft", a.draft),
                                                                   ("target", a.target))}
  vm = build_vocab_map(toks["draft"], toks["target"], min_overlap=0.0)
  out = {"command": "python eval/vocab_overlap.py " + " ".join(argv or __import__("sys").argv[1:]),
         "draft": a.draft, "target": a.target, "draft_style": vm.draft_style,
         "target_style": vm.target_style, **vm.overlap, "round_trip": {}}
  for k, tok in toks.items():
    try:
      out["round_trip"][k] = check_round_trip(tok, TEXTS, name=k)
    except TranslationError as e:
      out["round_trip"][k] = {"error": str(e)}
  out["seconds"] = round(time.perf_counter() - t0, 1)
  atomic_write_text(a.out, json.dumps(out, indent=1))
  print(json.dumps(out, indent=1))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
