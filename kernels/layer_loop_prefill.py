"""A long prompt's prefill with the layer loop on and off (`Lowering.layer_loop`): the registry
target on its GGUF blocks, a prompt of `--tokens` random ids, `generate(max_new_tokens=1)`
timed `--repeats` times after a first (compiling) call; prints the minimum and the median.

    VOCABJAX_LAYER_LOOP=1 python kernels/layer_loop_prefill.py --tokens 709
    VOCABJAX_LAYER_LOOP=0 python kernels/layer_loop_prefill.py --tokens 709

Results: kernels/results/layer_loop/ (the host and the commands in its README).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.lowering import Lowering


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--tokens", type=int, default=709)
  ap.add_argument("--repeats", type=int, default=3)
  a = ap.parse_args(argv)
  m = load_model(a.model, load_tokenizer=False, progress=False)
  prompt = np.random.RandomState(0).randint(0, m.config.vocab_size, a.tokens).tolist()
  dec = Decoder(m.params, m.config)
  first = time.perf_counter()
  out = dec.generate([prompt], max_new_tokens=1).tokens
  first = time.perf_counter() - first
  times = []
  for _ in range(a.repeats):
    t = time.perf_counter()
    assert dec.generate([prompt], max_new_tokens=1).tokens == out
    times.append(time.perf_counter() - t)
  print(f"layer_loop={Lowering().layer_loop} tokens={a.tokens} first call {first:.1f} s; "
        f"prefill + 1 token min {min(times):.2f} s median {statistics.median(times):.2f} s "
        f"(first token {out[0][0]})", flush=True)


if __name__ == "__main__":
  main()
