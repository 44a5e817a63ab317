"""MLP weight layout for T > 1 blocks on XLA:CPU: [out, in] (PyTorch's) vs [in, out].

  python kernels/block_layout.py --out kernels/results/block_layout

1. The Qwen2.5-Coder-1.5B body (random weights of the real shapes, f32) over T = 1, 2, 4, 6
   tokens with each layout, interleaved, median of repeats.
2. The step time split (`vocabjax.decoding.profile.step_split`) of chain (gamma 3) and tree
   (k 2, depth 4, 8 nodes) speculative decoding on the real Qwen pair with `layout="out_in"`
   and with the automatic block layout, interleaved.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

import numpy as np


def body_times(repeats: int, Ts=(1, 2, 4, 6)) -> dict:
  import jax
  import jax.numpy as jnp

  from vocabjax.models import KVCache, LlamaLikeConfig, forward, init_params
  from vocabjax.models.llamalike import with_mlp_layout

  cfg = LlamaLikeConfig(arch="qwen2", vocab_size=151936, hidden_size=1536,
                        intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                        head_dim=128, attention_bias=True, tie_word_embeddings=True)
  params = {"out_in": init_params(jax.random.key(0), cfg)}
  params["in_out"] = with_mlp_layout(params["out_in"], "in_out")
  cache = KVCache.init(cfg, 1, 1024).with_lengths(jnp.asarray([512]))
  f = jax.jit(lambda p, t, pos, c: forward(p, t, pos, c, config=cfg)[0])
  out = {lay: {T: [] for T in Ts} for lay in params}
  for T in Ts:
    tok, pos = jnp.zeros((1, T), jnp.int32), 512 + jnp.arange(T)[None]
    for lay in params:
      jax.block_until_ready(f(params[lay], tok, pos, cache))
    for _ in range(repeats):
      for lay in params:
        t = time.perf_counter()
        jax.block_until_ready(f(params[lay], tok, pos, cache))
        out[lay][T].append(time.perf_counter() - t)
  return {lay: {T: float(np.median(v)) for T, v in d.items()} for lay, d in out.items()}


def split_ab(repeats: int) -> dict:
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding.profile import step_split
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.drafter import ChainProposer, TreeProposer
  from vocabjax.decoding.tree import TreeParams

  t = load_model("qwen2.5-coder-1.5b-instruct", load_tokenizer=False)
  d = load_model("qwen2.5-coder-0.5b-instruct", load_tokenizer=False)
  makers = {
      "chain_g3":
          lambda lay: SpeculativeEngine(
              t.params, t.config, ChainProposer(d.params, d.config, t.config, gamma=3), layout=lay),
      "tree_k2_d4_n8":
          lambda lay: SpeculativeEngine(
              t.params, t.config,
              TreeProposer(d.params, d.config, t.config, tree=TreeParams(2, 4, 8)), layout=lay)
  }
  runs = {}
  for rep in range(2):
    for name, make in makers.items():
      for lay in ("out_in", "auto"):
        s = step_split(make(lay), max_len=1024, repeats=repeats).as_dict()
        runs.setdefault(f"{name} {lay}", []).append(s)
        print(rep, name, lay, {k: round(1e3 * v) for k, v in s.items()
                               if k.endswith("_s")}, flush=True)
  keys = ("drafter_s", "drafter_head_s", "verification_s", "step_s")
  return {k: {m: float(np.median([r[m] for r in v])) for m in keys} for k, v in runs.items()}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="kernels/results/block_layout")
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args(argv)
  import subprocess

  import jax

  from vocabjax.io import atomic_write_json, atomic_write_text

  body = body_times(args.repeats)
  splits = split_ab(args.repeats)
  commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  meta = {"command": f"python kernels/block_layout.py --out {args.out}", "commit": commit,
          "machine": platform.node(), "jax": jax.__version__,
          "date": datetime.datetime.now().isoformat(timespec="seconds")}
  atomic_write_json(args.out + ".json", {**meta, "body_s": body, "step_split_s": splits})
  lines = ["# MLP weight layout for T > 1 blocks on XLA:CPU", "",
           *[f"- {k}: `{v}`" for k, v in meta.items()], "",
           "Qwen2.5-Coder-1.5B body (random weights, real shapes, f32, 512 cached tokens), "
           "median ms:", "", "| layout | " + " | ".join(f"T={T}" for T in body["out_in"]) + " |",
           "|---" * (1 + len(body["out_in"])) + "|"]
  for lay, d in body.items():
    lines.append(f"| {lay} | " + " | ".join(f"{1e3 * v:.0f}" for v in d.values()) + " |")
  lines += ["", "Speculative step split on the real pair (median of 2 interleaved rounds), ms:",
            "", "| decoder, layout | drafter | drafter LM head | verification | step |",
            "|---|---|---|---|---|"]
  for k, v in splits.items():
    lines.append(f"| {k} | " + " | ".join(f"{1e3 * v[m]:.0f}" for m in
                                         ("drafter_s", "drafter_head_s", "verification_s",
                                          "step_s")) + " |")
  atomic_write_text(args.out + ".md", "\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
