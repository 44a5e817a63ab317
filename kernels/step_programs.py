"""Whole decoding steps timed on the machine this runs on: plain decoding's step against one
step of each speculative method (drafting, verification, the accepted path's KV move, the
drafter's or head's catch-up: the program the decoder's loop calls), random weights of real
shapes, batch 1.

  python kernels/step_programs.py --out kernels/results/step_programs/<device>
  python kernels/step_programs.py --pair llama-3.1-8b --dtype bfloat16 --out $OUT/steps \\
      --run eval/results/eagle/gate

`python -m vocabjax.bench` times the parts (the target over T tokens, the drafter's body, its
heads) and `bench project` adds them up; this times the steps as the decoders compile them, so
nothing is modelled, including what the parts leave out (the KV move of a tree's path, the
head's catch-up over its pending tokens, top-k and sampling, the tree's masks). Methods:

- `ar`: plain decoding's step (`Decoder.step_program`), over a cache holding `--context` tokens;
- `chain_g3`, `tree_k4d4n16`: the drafter model's chain of 3 and 16-node tree (0.5B drafter of
  the pair);
- `eagle_k1d4`, `eagle_k4d4n16`: an EAGLE-3 head (one layer, the shapes of the chat_pl head: its
  config.json, Vd = 8192 rows, intermediate 2048) drafting a chain of 4 and a 16-node tree;
- `eagle_k1d4_gated_off`: the same chain gated with min_confidence 0.99, which a random head
  never reaches: the cost of a gated step that verifies the root alone;
- `sv{K}_g3_{xla,kernel,auto}` (e.g. `sv2048_g3_kernel`): the drafter's chain of 3 through a
  SpecVocab policy (a random rank-`--ranker-rank` ranker, top K candidates per step) whose
  indexed LM head is XLA's gather (`xla`), the platform's Pallas kernel with its default blocks
  (`kernel`: GPU or TPU only), or `impl="auto"` (the dispatch table); compare with `chain_g3`,
  the full-vocabulary chain.

Each speculative step is timed from the state its decoder's prefill of a `--context`-token
random prompt gives, then stepped on (random weights accept almost nothing, so the cache grows
by about a token a step, as plain decoding's); median over `--repeats` rounds of `--steps`
calls after a warm-up call, methods interleaved per round.

`--run <eval dir>`: a recorded eval run's tau per method of the same name (its summary.json) x
this machine's step times gives a PROJECTED decode speedup, tau x t(ar) / t(method): exact
for a method whose every step costs the same (ungated), and labelled with the run it comes from.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

METHODS = ("ar", "chain_g3", "tree_k4d4n16", "eagle_k1d4", "eagle_k4d4n16",
           "eagle_k1d4_gated_off")
SPECVOCAB = re.compile(r"sv(\d+)_g3_(xla|kernel|auto)")


SUM = "+sum"  # a method's suffix: its decoder built with Lowering.sum_attention


def method_name(name: str) -> str:
  """argparse type: a name of METHODS or a SpecVocab chain `sv{K}_g3_{xla,kernel,auto}`, either
  with `+sum` appended (the decoder attends by summed products: `Lowering.sum_attention`)."""
  base = name.removesuffix(SUM)
  if base in METHODS or SPECVOCAB.fullmatch(base):
    return name
  raise argparse.ArgumentTypeError(f"unknown method {name!r}: choose from {', '.join(METHODS)} "
                                   f"or sv<K>_g3_<xla|kernel|auto>")


def specvocab(dp, dc, k: int, impl: str, rank: int, seed: int = 4):
  """A SpecVocab policy of a random rank-`rank` ranker for drafter (dp, dc), top k."""
  import jax
  import numpy as np

  from vocabjax.models.identity import drafter_identity
  from vocabjax.vocab import Ranker, SpeculativeVocab

  if not 1 <= k <= dc.vocab_size:
    raise ValueError(f"SpecVocab k={k} must be in [1, V={dc.vocab_size}]")
  rs = np.random.RandomState(seed)
  ranker = Ranker(down=(rs.randn(rank, dc.hidden_size) * 0.05).astype(np.float32),
                  vocab=(rs.randn(dc.vocab_size, rank) * 0.05).astype(np.float32),
                  drafter=drafter_identity(dp, dc), meta={"init": "random (step timing)"})
  if impl == "kernel":
    backend = jax.default_backend()
    if backend not in ("gpu", "tpu"):
      raise ValueError(f"SpecVocab impl 'kernel' needs a GPU or TPU backend, not {backend}: "
                       f"use sv{k}_g3_xla or sv{k}_g3_auto here")
    impl = backend
  return SpeculativeVocab(ranker, k, impl={"xla": "reference"}.get(impl, impl))


def build(methods, tp, tc, dp, dc, hp, hc, ranker_rank: int = 128):
  from vocabjax.lowering import sum_attention_default

  made = {}
  for m in methods:
    with sum_attention_default(m.endswith(SUM)):  # decoders fix their lowering when built
      made[m] = _build(m.removesuffix(SUM), tp, tc, dp, dc, hp, hc, ranker_rank)
  return made


def _build(m, tp, tc, dp, dc, hp, hc, ranker_rank):
  from vocabjax.decoding import Decoder, TreeParams
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.drafter import ChainProposer, TreeProposer
  from vocabjax.decoding.eagle import EagleProposer
  sv = SPECVOCAB.fullmatch(m)
  if sv:
    return SpeculativeEngine(
        tp, tc,
        ChainProposer(dp, dc, tc, gamma=3, draft_vocab=specvocab(dp, dc, int(sv[1]), sv[2],
                                                                 ranker_rank)))
  make = {
      "ar":
          lambda: Decoder(tp, tc),
      "chain_g3":
          lambda: SpeculativeEngine(tp, tc, ChainProposer(dp, dc, tc, gamma=3)),
      "tree_k4d4n16":
          lambda: SpeculativeEngine(tp, tc, TreeProposer(dp, dc, tc, tree=TreeParams(4, 4, 16))),
      "eagle_k1d4":
          lambda: SpeculativeEngine(tp, tc, EagleProposer(tp, tc, hp, hc, tree=TreeParams(1, 4, 4))
                                   ),
      "eagle_k4d4n16":
          lambda: SpeculativeEngine(tp, tc, EagleProposer(tp, tc, hp, hc, tree=TreeParams(4, 4, 16))
                                   ),
      "eagle_k1d4_gated_off":
          lambda: SpeculativeEngine(
              tp, tc, EagleProposer(tp, tc, hp, hc, tree=TreeParams(1, 4, 4), min_confidence=0.99))
  }
  if m not in make:
    raise ValueError(f"unknown method {m!r}: choose from {', '.join(METHODS)}")
  return make[m]()


def run_tau(run_dir: str) -> dict[str, float]:
  path = Path(run_dir) / "summary.json"
  if not path.is_file():
    raise FileNotFoundError(f"--run {run_dir}: no summary.json there (a finished "
                            f"`python -m vocabjax.eval` output directory)")
  s = json.loads(path.read_text())
  return {m["name"]: float(m["overall"]["tau"]) for m in s["methods"]
          if m["overall"].get("tau") is not None}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="directory for steps.md and steps.json")
  p.add_argument("--pair", default="qwen2.5-coder", help="a pair of vocabjax.bench.shapes.PAIRS")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--weights", default="", choices=("", "int8", "int4"),
                 help="weight-only quantization of the target and the drafter: int8 (per-row "
                 "scales, `quantize_int8`) or int4 (grouped, `quantize_grouped`); the EAGLE "
                 "head stays --dtype")
  p.add_argument("--methods", nargs="+", default=list(METHODS), type=method_name)
  p.add_argument("--ranker-rank", type=int, default=128, help="SpecVocab ranker rank d'")
  p.add_argument("--context", type=int, default=512, help="prompt tokens before the steps")
  p.add_argument("--max-len", type=int, default=1024, help="cache slots")
  p.add_argument("--steps", type=int, default=8, help="timed calls per method and round")
  p.add_argument("--repeats", type=int, default=3, help="rounds, methods interleaved")
  p.add_argument("--head-intermediate", type=int, default=2048)
  p.add_argument("--head-vocab", type=int, default=8192)
  p.add_argument("--run", help="an eval run whose tau per method gives projected speedups")
  p.add_argument("--target", help="a target config instead of the pair's (with --draft)")
  p.add_argument("--draft", help="a drafter config instead of the pair's")
  a = p.parse_args(argv)
  if a.context < 1 or a.context + 64 > a.max_len:
    p.error(f"--context {a.context} needs 1 <= context and context + 64 <= --max-len "
            f"{a.max_len} (room for the steps and a tree's slots)")
  if a.steps < 1 or a.repeats < 1:
    p.error(f"--steps {a.steps} and --repeats {a.repeats} must be >= 1")
  if "ar" not in a.methods:
    p.error("--methods must include ar (every time is reported against its step)")
  taus = run_tau(a.run) if a.run else {}

  import jax
  import jax.numpy as jnp

  from vocabjax.bench.engine import random_params
  from vocabjax.bench.shapes import PAIRS, resolve_config
  from vocabjax.decoding import SamplingParams
  from vocabjax.io import atomic_write_text
  from vocabjax.models import KVCache
  from vocabjax.models.eagle import default_feature_layers, init_eagle
  from vocabjax.train.eagle_step import head_config

  if (a.target is None) != (a.draft is None):
    p.error("--target and --draft go together")
  if a.target is None:
    if a.pair not in PAIRS:
      p.error(f"--pair {a.pair!r}: choose from {sorted(PAIRS)}")
    tname, dname = PAIRS[a.pair]
  else:
    tname, dname = a.target, a.draft
  tname, tc = resolve_config(tname)
  dname, dc = resolve_config(dname)
  if tc.vocab_size != dc.vocab_size:
    raise ValueError(f"target V={tc.vocab_size} and drafter V={dc.vocab_size} differ")
  tp, dp = random_params(tc, a.dtype, 0), random_params(dc, a.dtype, 1)
  if a.weights:
    from vocabjax.models.llamalike import quantize_grouped, quantize_int8
    quantize = quantize_int8 if a.weights == "int8" else quantize_grouped
    tp, dp = quantize(tp), quantize(dp)
  from vocabjax.kernels.blocks import is_blocks
  # every array's bytes as stored (int4 codes at 4 bits: numpy counts them a byte each)
  weight_gb = {k: sum(int(x.nbytes) for x in jax.tree.leaves(v, is_leaf=is_blocks)) / 1e9
               for k, v in (("target", tp), ("draft", dp))}
  hc = head_config(tc, default_feature_layers(tc.num_layers), min(a.head_vocab, tc.vocab_size),
                   a.head_intermediate)
  hp = init_eagle(jax.random.key(2), hc, dtype=jnp.dtype(a.dtype))
  decoders = build(a.methods, tp, tc, dp, dc, hp, hc, a.ranker_rank)
  greedy = SamplingParams()
  S, N0, dtype = a.max_len, a.context, jnp.dtype(a.dtype)
  T = N0  # the prompt block

  runners, compile_s = {}, {}
  prompt = jax.random.randint(jax.random.key(3), (1, T), 0, tc.vocab_size, jnp.int32)
  for name, dec in decoders.items():
    t0 = time.perf_counter()
    if name.removesuffix(SUM) == "ar":
      step, _ = dec.step_program(greedy, 1, S, dtype)

      def fresh():
        return (KVCache.init(tc, 1, S, dtype).with_lengths(jnp.asarray([N0], jnp.int32)),
                jnp.asarray([7], jnp.int32))

      def call(st, step=step):
        cache, tok = st
        tok, cache = step(tp, tok, cache, jax.random.key(0))
        return (cache, tok), tok
    else:
      start, step, _ = dec.programs(greedy, 1, T, S, dtype)

      def fresh(start=start):
        _, state = start(prompt, jnp.asarray([N0], jnp.int32), jax.random.key(0))
        return state

      def call(st, step=step, dec=dec):
        out = step(dec.target_params, dec.proposer_params, st, jax.random.key(0))
        return out[0], out[1]
    jax.block_until_ready(fresh())  # compiles the prefill too
    compile_s[name] = time.perf_counter() - t0
    runners[name] = (fresh, call)
    print(f"compiled {name} in {compile_s[name]:.1f}s", flush=True)

  times = {k: [] for k in runners}
  for r in range(a.repeats):
    for name, (fresh, call) in runners.items():
      st = fresh()
      jax.block_until_ready(st)
      for i in range(a.steps + 1):
        t0 = time.perf_counter()
        st, emitted = call(st)
        jax.block_until_ready(emitted)
        if i:  # the first call warms up
          times[name].append(time.perf_counter() - t0)
    print(f"round {r + 1}/{a.repeats}: " + ", ".join(
        f"{k} {1000 * np.median(v):.2f} ms" for k, v in times.items()), flush=True)

  base = float(np.median(times["ar"]))
  rows = []
  for name, ts in times.items():
    med = float(np.median(ts))
    row = {"method": name, "median_ms": 1000 * med, "min_ms": 1000 * float(np.min(ts)),
           "per_ar_step": med / base,
           "verify_tokens": 1 if name.endswith("gated_off") else getattr(decoders[name],
                                                                         "verify_tokens", 1),
           "compile_s": compile_s[name]}
    if name in taus:
      row["tau"] = taus[name]
      row["projected_speedup"] = taus[name] * base / med
    rows.append(row)

  dev = jax.devices()[0]
  env = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
         "host": platform.processor() or platform.machine(), "backend": jax.default_backend(),
         "device": getattr(dev, "device_kind", str(dev)), "jax": jax.__version__,
         "target": tname, "draft": dname, "dtype": a.dtype,
         "weights": a.weights or a.dtype, "weight_gb": weight_gb, "context": N0, "max_len": S,
         "steps": a.steps, "repeats": a.repeats, "head": {
             "intermediate": a.head_intermediate, "draft_vocab": hc.draft_vocab_size,
             "feature_layers": list(hc.feature_layers)}, "run": a.run,
         "command": "python kernels/step_programs.py " + " ".join(sys.argv[1:] if argv is None
                                                               else argv)}
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  atomic_write_text(out / "steps.json", json.dumps({"environment": env, "rows": rows}, indent=1))
  lines = ["# Whole decoding steps, batch 1", "", f"`{env['command']}`", "",
           f"- {env['date']}, {env['device']} ({env['backend']}), host {env['host']}, "
           f"jax {env['jax']}",
           f"- {tname} <- {dname} shapes, random weights, {a.dtype}"
           + (f", weights {a.weights}" if a.weights else "")
           + f" ({weight_gb['target']:.2f} GB target, {weight_gb['draft']:.2f} GB drafter: "
           f"every array); EAGLE head: one layer, "
           f"intermediate {a.head_intermediate}, Vd = {hc.draft_vocab_size}; cache of {S} slots, "
           f"{N0} prompt tokens; median of {a.repeats} x {a.steps} calls, methods interleaved",
           ""]
  head = "| method | T verified | median ms | min ms | / plain step |"
  if taus:
    head += f" tau ({a.run}) | PROJECTED speedup |"
  lines += [head, head_sep(head)]
  for row in rows:
    line = (f"| {row['method']} | {row['verify_tokens']} | {row['median_ms']:.2f} | "
            f"{row['min_ms']:.2f} | {row['per_ar_step']:.2f} |")
    if taus:
      line += (f" {row['tau']:.2f} | {row['projected_speedup']:.2f}x |" if "tau" in row
               else " - | - |")
    lines.append(line)
  if taus:
    lines += ["", f"PROJECTED: the tau of {a.run} (measured on the machine that run names) x "
              f"this machine's step times, tau x t(ar) / t(method); not a measured speedup. "
              f"For a gated method the steps' costs vary and the figure is not exact."]
  atomic_write_text(out / "steps.md", "\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


def head_sep(head: str) -> str:
  return "|" + "---|" * (head.count("|") - 1)


if __name__ == "__main__":
  raise SystemExit(main())
