"""Plain decoding's step time against the cache's size (its slots S), on the registry target:
what a decoding step costs beyond its weights as S grows, with the prompt and the tokens fixed.

  python kernels/cache_size_step.py --dtype gguf-q8 --out kernels/results/cache_size_step/<host>

A step's attention runs in the CPU kernel, which reads only the slots a row sees; anything that
grows with S (a copy of a layer's cache, a mask over every slot) shows here as a slope. Each
cache size: generate 56 and 8 new tokens after the same 100-token prompt, their difference over
48 steps (prefill and start-up cancel), `--rounds` rounds with the sizes interleaved; median and
least per size, printed and written to results.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--dtype", default="gguf-q8")
  ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
  ap.add_argument("--rounds", type=int, default=4)
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding.autoregressive import Decoder
  from vocabjax.io import atomic_write_json
  from vocabjax.sampling import SamplingParams

  m = load_model(args.model, dtype=args.dtype, load_tokenizer=False, progress=False)
  dec = Decoder(m.params, m.config)
  prompt = [list(np.random.RandomState(0).randint(100, 5000, 100))]
  greedy = SamplingParams(temperature=0.0)

  def run(S, n):
    t = time.perf_counter()
    dec.generate(prompt, max_new_tokens=n, sampling=greedy, max_len=S)
    return time.perf_counter() - t

  for S in args.sizes:  # compile and warm each size's programs
    run(S, 8)
  steps = {S: [] for S in args.sizes}
  for _ in range(args.rounds):
    for S in args.sizes:
      steps[S].append((run(S, 56) - run(S, 8)) / 48 * 1000)
  rows = [{"slots": S, "median_ms": float(np.median(v)), "least_ms": float(min(v)),
           "rounds_ms": [round(x, 2) for x in v]} for S, v in steps.items()]
  for r in rows:
    print(f"S={r['slots']}: step {r['median_ms']:.1f} ms median, {r['least_ms']:.1f} least "
          f"({', '.join(f'{x:.1f}' for x in r['rounds_ms'])})")
  if args.out:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(args.out) / "results.json",
                      {"model": args.model, "dtype": args.dtype, "rows": rows,
                       "command": " ".join(["python", "kernels/cache_size_step.py",
                                            *(argv if argv is not None else sys.argv[1:])])})
  return 0


if __name__ == "__main__":
  sys.exit(main())
