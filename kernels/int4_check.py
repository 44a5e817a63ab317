"""int4 of a real checkpoint: a registry model loaded in f32, with its GGUF file's own blocks, and
quantized to int4 (Q4_0 blocks by gguf's quantizer) at load; for each: load seconds, weight
bytes, plain greedy decoding's tokens/s, and prompt lookup on the same weights (its tokens must
equal plain decoding's); int4's and the file's tokens against f32's (how far the quantized
models' greedy text follows the f32 one: informational, not a check).

    python kernels/int4_check.py --model smollm2-135m-instruct \
        --out kernels/results/int4_check.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

import jax
import numpy as np

from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import Decoder, LookupProposer, SpeculativeEngine
from vocabjax.eval.provenance import cpu_model
from vocabjax.io import atomic_write_text
from vocabjax.kernels.blocks import is_blocks

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain in two sentences what a hash table is.",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]


def weight_bytes(params) -> int:
  leaves = jax.tree.leaves(params, is_leaf=is_blocks)
  return sum(x.nbytes for x in leaves)


def timed(dec, prompts, n):
  dec.generate(prompts, max_new_tokens=n)  # compiles
  t = time.perf_counter()
  res = dec.generate(prompts, max_new_tokens=n)
  return res, time.perf_counter() - t


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default="smollm2-135m-instruct")
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--out", type=Path, default=None)
  a = p.parse_args()
  rows, tokens = [], {}
  for dtype in ("float32", "gguf", "int4"):
    t = time.perf_counter()
    m = load_model(a.model, dtype=dtype, progress=False)
    load_s = time.perf_counter() - t
    ids = [m.tokenizer(q)["input_ids"] for q in PROMPTS]
    plain, plain_s = timed(Decoder(m.params, m.config), ids, a.new_tokens)
    pld, pld_s = timed(SpeculativeEngine(m.params, m.config, LookupProposer(gamma=4)), ids,
                       a.new_tokens)
    n = sum(len(r) for r in plain.tokens)
    tokens[dtype] = plain.tokens
    rows.append(dict(dtype=dtype, load_s=load_s, gb=weight_bytes(m.params) / 1e9,
                     plain_tps=n / plain_s, pld_tps=sum(len(r) for r in pld.tokens) / pld_s,
                     pld_same=pld.tokens == plain.tokens, tau=pld.stats.tau))
    print(rows[-1], flush=True)
    del m

  def agree(x, y):
    """Tokens of the greedy outputs equal position by position up to the first difference."""
    same = 0
    for r, s in zip(x, y):
      k = next((i for i, (u, v) in enumerate(zip(r, s)) if u != v), min(len(r), len(s)))
      same += k
    return same / sum(len(r) for r in x)

  host = cpu_model()
  lines = [f"# int4 of a real checkpoint: {a.model}", "",
           f"`python kernels/int4_check.py --model {a.model} --new-tokens {a.new_tokens}`, "
           f"{datetime.date.today()}, host: {host}, {os.cpu_count()} cores, "
           f"jax {jax.__version__}; {len(PROMPTS)} prompts in one batch, greedy, "
           f"{a.new_tokens} new tokens each, the second of two runs timed.", "",
           "| weights | load s | weight GB | plain tok/s | prompt lookup tok/s | lookup = plain "
           "| lookup tau | greedy prefix shared with f32 |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['dtype']} | {r['load_s']:.1f} | {r['gb']:.3f} | {r['plain_tps']:.1f} | "
                 f"{r['pld_tps']:.1f} | {'yes' if r['pld_same'] else 'NO'} | {r['tau']:.2f} | "
                 f"{agree(tokens[r['dtype']], tokens['float32']):.0%} |")
  lines += ["", "float32: the GGUF file's blocks dequantized at load; gguf: the file's own "
            "blocks (Q4_1 for this file); int4: the float32 weights quantized at load into Q4_0 "
            "blocks by gguf's quantizer (`load_model(dtype=\"int4\")`). \"lookup = plain\": "
            "prompt lookup's greedy tokens equal plain decoding's on the same weights (the "
            "exactness check); the shared prefix is informational."]
  text = "\n".join(lines) + "\n"
  print(text)
  if a.out:
    atomic_write_text(a.out, text)
  assert all(r["pld_same"] for r in rows), "prompt lookup differs from plain decoding"
  assert np.isfinite([r["plain_tps"] for r in rows]).all()


if __name__ == "__main__":
  main()
