"""Continuous batching against batches in turn, plain and speculative, on the registry pair.

The same R cache rows decode N chat-wrapped Spec-Bench prompts (round-robin over the task
groups, at most `--max-prompt-tokens` tokens) two ways: in consecutive batches of R prompts
(`generate`, a batch waits for its longest answer) and continuously (`generate_continuous(rows=
R)`, a finished row takes the next prompt). Greedy, stopping at the target's EOS. Reported per
method and way: new tokens, wall seconds of prefill + decode (compilation left out), tokens/s,
decode steps, and whether the outputs equal plain decoding's in batches. Each way runs on a
decoder of its own.

    python eval/continuous_batching.py --out eval/results/continuous_batching
"""

from __future__ import annotations

import argparse
import json
import platform

from vocabjax.io import atomic_write_text
from vocabjax.methods import METHODS

from pair_study import add_pair_args, pair_setup  # noqa: E402 (the script's directory)

RUNS = (("ar", "ar", {}), ("chain_g3", "chain", {"gamma": 3}),
        ("pld_g4_n2", "pld", {"gamma": 4, "min_ngram": 2}), ("suffix", "suffix", {}))


def _batches(dec, rows, R, kw):
  """(outputs, prefill + decode seconds, steps) of consecutive batches of R rows."""
  outs, secs, steps = [], 0.0, 0
  for i in range(0, len(rows), R):
    res = dec.generate(rows[i:i + R], **kw)
    outs += res.tokens
    secs += res.prefill_s + res.decode_s
    steps += res.steps
  return outs, secs, steps


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  add_pair_args(ap, RUNS, prompts_flag="--prompts", prompts=8, max_new_tokens=96)
  ap.add_argument("--rows", type=int, default=4, help="cache rows decoding them")
  a = ap.parse_args(argv)
  runs, out, target, draft, rows, qids, commit = pair_setup(a, RUNS)
  cmd = (f"python eval/continuous_batching.py --prompts {a.prompts} --rows {a.rows} "
         f"--max-prompt-tokens {a.max_prompt_tokens} --max-new-tokens {a.max_new_tokens} "
         f"--methods {' '.join(a.methods)} --out {a.out}")
  kw = dict(max_new_tokens=a.max_new_tokens, eos_token_ids=target.eos_token_ids)
  results, ref = [], None
  def fresh(method, params):
    """A decoder of its own for each way (SuffixDecoding's global tree would else hold the
    other way's answers), its R-row step compiled (not timed)."""
    dec = METHODS[method].make(target, draft if METHODS[method].needs_draft else None, params)
    dec.generate(rows[:a.rows], max_new_tokens=2)
    return dec

  for name, method, params in runs:
    outs, secs, steps = _batches(fresh(method, params), rows, a.rows, kw)
    if ref is None:
      ref = outs
    cont = fresh(method, params).generate_continuous(rows, rows=a.rows, **kw)
    for way, toks, s, n in (("batches", outs, secs, steps),
                            ("continuous", cont.tokens, cont.prefill_s + cont.decode_s,
                             cont.steps)):
      new = sum(map(len, toks))
      results.append({"method": name, "way": way, "new_tokens": new, "seconds": round(s, 2),
                      "tok_s": new / s, "steps": n, "equal_ar": toks == ref,
                      "lengths": [len(t) for t in toks]})
      print(f"[continuous] {name} {way}: {new} tokens in {s:.1f} s = {new / s:.2f} tok/s, "
            f"{n} steps, equal to ar {toks == ref}", flush=True)
  lines = ["# Continuous batching against batches in turn", "",
           f"Command: `{cmd}`; commit `{commit}`; host {platform.processor() or platform.machine()}"
           f"; target {a.target} f32, drafter {a.draft} {a.draft_dtype}, greedy, stopping at "
           f"EOS. {len(rows)} prompts ({min(map(len, rows))}-{max(map(len, rows))} tokens): "
           f"{', '.join(qids)}; answer lengths (plain decoding): "
           f"{[len(t) for t in ref]}. {a.rows} cache rows either way; seconds = prefill + "
           f"decode (compilation left out).", "",
           "| method | way | new tokens | seconds | tok/s | steps | equal AR |",
           "|---|---|---|---|---|---|---|"]
  for r in results:
    lines.append(f"| {r['method']} | {r['way']} | {r['new_tokens']} | {r['seconds']:.1f} | "
                 f"{r['tok_s']:.2f} | {r['steps']} | {r['equal_ar']} |")
  atomic_write_text(out / "continuous_batching.md", "\n".join(lines) + "\n")
  atomic_write_text(out / "continuous_batching.json", json.dumps(
      {"command": cmd, "commit": commit, "rows": qids, "results": results}, indent=1) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
