"""Compile time and size of EAGLE + lookup's step programs, one per trie bucket, for the test
suite's tiny model pair (tests/decoding/conftest.py's CFG, a random 40-token head, tree
(2, 3, 6), gamma 2, 3 candidates: buckets 0, 2, 4, 6).

    python kernels/trie_bucket_compile.py

Results: kernels/results/profile/trie_bucket_compile.txt (the trie merge unrolled, code of
cca1485, and as one loop, code of 0f6158a and later, run back to back).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
  sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.decoding's shared model config
  import jax
  import jax.numpy as jnp

  from tests.decoding.conftest import CFG
  from tests.decoding.test_eagle_decoding import random_head
  from vocabjax.decoding import SamplingParams
  from vocabjax.decoding.eagle import EagleLookupProposer
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.tree import TreeParams
  from vocabjax.models import init_params

  target = init_params(jax.random.key(0), CFG, scale=0.3)
  hc, head = random_head(target, CFG, 40)
  dec = SpeculativeEngine(
      target, CFG,
      EagleLookupProposer(target, CFG, head, hc, tree=TreeParams(2, 3, 6), gamma=2, candidates=3))
  start, step, c = dec.programs(SamplingParams(), 4, 32, 64, jnp.float32)
  print(f"prefills: {c:.2f} s compile; buckets {dec.buckets}")
  for m in dec.buckets:
    prog, c = step(m)
    txt = prog.as_text()
    print(f"bucket {m}: {c:.2f} s compile, {txt.count(' fusion(')} fusions, "
          f"{txt.count(chr(10))} HLO lines")


if __name__ == "__main__":
  main()
