"""Per-token cost of SpecVocab's drafting head against the full and trimmed heads, each part
timed alone on this machine (random weights of the real shapes: timing does not depend on the
values). Qwen2.5-Coder-0.5B's head by default (d = 896, V = 151,936), batch 1, f32.

    python kernels/bench_specvocab_head.py --out kernels/results/kernels/specvocab_head.md

Rows: the ranker's scores W_vocab (W_down h) for d' in --ranks; an exact top-k over V scores for
k in --ks; the indexed head (`indexed_lm_head`, XLA gather + dot off GPU/TPU) for k rows; the
whole ranked policy (`ranked_policy`); the full head h U^T; a trimmed head of K rows. Medians of
--repeats calls after a warm-up, each call one jitted program.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.decoding.profile import median_s
from vocabjax.io import atomic_write_text
from vocabjax.kernels.indexed_lm_head import indexed_lm_head


def median_ms(fn, *args, repeats: int) -> float:
  return median_s(jax.jit(fn), *args, repeats=repeats) * 1e3


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--d", type=int, default=896)
  p.add_argument("--vocab", type=int, default=151936)
  p.add_argument("--ranks", type=int, nargs="+", default=[56, 112])
  p.add_argument("--ks", type=int, nargs="+", default=[512, 1024, 2048])
  p.add_argument("--trimmed", type=int, nargs="+", default=[32768, 65536])
  p.add_argument("--repeats", type=int, default=50)
  p.add_argument("--out", help="write the markdown table here")
  a = p.parse_args(argv)
  D, V = a.d, a.vocab
  rs = np.random.default_rng(0)
  U = jnp.asarray(rs.standard_normal((V, D), np.float32) * 0.02)
  h = jnp.asarray(rs.standard_normal((1, D), np.float32))
  rows = []

  def add(part, shape, ms):
    rows.append((part, shape, ms))
    print(f"{part:28s} {shape:28s} {ms:8.2f} ms", flush=True)

  add("full head h U^T", f"[1,{D}] x [{V},{D}]",
      median_ms(lambda h: jnp.einsum("bd,vd->bv", h, U), h, repeats=a.repeats))
  for K in a.trimmed:
    Uk = U[:K]
    add("trimmed head (VocabTrim)", f"K={K}",
        median_ms(lambda h, Uk=Uk: jnp.einsum("bd,vd->bv", h, Uk), h, repeats=a.repeats))
  scores = None
  for R in a.ranks:
    down = jnp.asarray(rs.standard_normal((R, D), np.float32) * 0.03)
    voc = jnp.asarray(rs.standard_normal((V, R), np.float32) * 0.1)

    def score(h, down=down, voc=voc):
      return jnp.einsum("bR,VR->bV", jnp.einsum("bD,RD->bR", h, down), voc)
    add("ranker scores", f"d'={R}", median_ms(score, h, repeats=a.repeats))
    if scores is None:
      scores = jax.jit(score)(h)
    for k in a.ks:
      def policy(h, k=k, score=score):
        idx = jax.lax.top_k(score(h), k)[1]
        return indexed_lm_head(h, U, idx)
      add("whole ranked policy", f"d'={R}, k={k}", median_ms(policy, h, repeats=a.repeats))
  for k in a.ks:
    add("exact top-k over V scores", f"k={k}",
        median_ms(lambda s, k=k: jax.lax.top_k(s, k)[1], scores, repeats=a.repeats))
    idx = jax.lax.top_k(scores, k)[1]
    add("indexed head", f"k={k}", median_ms(lambda h, i: indexed_lm_head(h, U, i), h, idx,
                                             repeats=a.repeats))
  if a.out:
    try:
      commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
      commit = "unknown"
    given = " ".join(sys.argv[1:] if argv is None else argv)
    lines = ["# SpecVocab head parts, per drafted token (batch 1, f32)", "",
             f"- command: `python kernels/bench_specvocab_head.py {given}`",
             f"- commit: `{commit}`; machine: {platform.node()} ({jax.default_backend()}, "
             f"jax {jax.__version__}); d = {D}, V = {V}; median of {a.repeats} calls", "",
             "| part | shape | ms |", "|---|---|---|"]
    lines += [f"| {part} | {shape} | {ms:.2f} |" for part, shape, ms in rows]
    atomic_write_text(Path(a.out), "\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
