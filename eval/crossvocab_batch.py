"""Cross-vocabulary drafting at batch 1, 4 and 16 against plain decoding at the same batch:
SmolLM2-135M drafting for Qwen2.5-Coder-1.5B through the n-gram cache, greedy,
on the CPU. Batches run in lockstep (one drafting and one verification program over all rows;
translation per row on the host); the step's time split (drafter programs, verification,
host work: translation, reverse translation, n-gram cache) is reported beside the throughput
and the AR step, so a per-row host loop that costs time would show.

Rows: `--rows` questions of the shared Spec-Bench split whose chat-wrapped prompt has at most
`--max-prompt-tokens` target tokens, taken round-robin over the task groups. Every batch size
decodes the same rows (in consecutive batches of that size), so the throughputs compare the
same work: new tokens of all rows / decode time summed over the batches (compilation and
prefill left out; both decoders compile ahead of the clock). AR and crossvocab alternate
batch size by batch size (`--repeats` runs each, median); greedy outputs are checked equal.

    python eval/crossvocab_batch.py --out eval/results/crossvocab_batch.md
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from vocabjax import Decoder, load_model
from vocabjax.decoding.drafter import block_layout
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.crossvocab import CrossVocabProposer
from vocabjax.io import atomic_write_text
from vocabjax.prompts import DatasetSpec, encode_prompts, load_prompts


def pick_rows(tokenizer, n: int, max_tokens: int) -> tuple[list[list[int]], list[str]]:
  """n short prompts, round-robin over the task groups (ids, qids)."""
  prompts = load_prompts([DatasetSpec(kind="spec_bench")])
  ids = encode_prompts(tokenizer, [p.text for p in prompts], True)
  by_group: dict[str, list] = {}
  for p, x in zip(prompts, ids):
    if len(x) <= max_tokens:
      by_group.setdefault(p.group, []).append((p.qid, x))
  picked = [r for r in itertools.chain.from_iterable(itertools.zip_longest(*by_group.values()))
            if r is not None][:n]
  if len(picked) < n:
    raise SystemExit(f"only {len(picked)} Spec-Bench prompts have <= {max_tokens} tokens; "
                     f"lower --rows or raise --max-prompt-tokens")
  return [x for _, x in picked], [q for q, _ in picked]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--draft", default="smollm2-135m-instruct")
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
  ap.add_argument("--rows", type=int, default=16)
  ap.add_argument("--max-prompt-tokens", type=int, default=160)
  ap.add_argument("--max-new-tokens", type=int, default=32)
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--out", required=True)
  a = ap.parse_args(argv)
  target, draft = load_model(a.target), load_model(a.draft)
  rows, qids = pick_rows(target.tokenizer, a.rows, a.max_prompt_tokens)
  ar = Decoder(target.params, target.config)
  cv = SpeculativeEngine(
      target.in_layout(block_layout()), target.config,
      CrossVocabProposer(draft.params, draft.config, target.config,
                         target_tokenizer=target.tokenizer, draft_tokenizer=draft.tokenizer,
                         gamma=a.gamma))
  kw = dict(max_new_tokens=a.max_new_tokens, eos_token_ids=())
  lines = ["# Cross-vocabulary drafting by batch size", "",
           f"Command: `python eval/crossvocab_batch.py --batches {' '.join(map(str, a.batches))} "
           f"--rows {a.rows} --max-prompt-tokens {a.max_prompt_tokens} --max-new-tokens "
           f"{a.max_new_tokens} --gamma {a.gamma} --repeats {a.repeats} --out {a.out}`; target "
           f"{a.target}, drafter {a.draft} (n-gram cache on, learned online), f32, greedy, no "
           f"EOS stop. Rows ({len(rows)}, prompt lengths {min(map(len, rows))}-"
           f"{max(map(len, rows))} tokens): {', '.join(qids)}. Every batch size decodes all of "
           f"them in consecutive batches; decode tokens/s = new tokens of all rows / decode "
           f"time summed over the batches (median of the repeats; prefill and compilation left "
           f"out).", "",
           "| batch | AR tok/s | crossvocab tok/s | speedup | tau | AR step ms | crossvocab "
           "step ms: drafter / verification / host | outputs equal AR |",
           "|---|---|---|---|---|---|---|---|"]
  toks = len(rows) * (a.max_new_tokens - 1)  # the first token of each row comes from prefill
  for B in a.batches:
    times = {"ar": [], "cv": []}
    for _ in range(a.repeats):
      t0 = time.perf_counter()
      ar_tokens, ar_s, ar_steps = [], 0.0, 0
      for lo in range(0, len(rows), B):
        r = ar.generate(rows[lo:lo + B], **kw)
        ar_tokens += r.tokens
        ar_s += r.decode_s
        ar_steps += r.steps
      r_cv = cv.generate(rows, batch_size=B, **kw)
      times["ar"].append(ar_s)
      times["cv"].append(r_cv.decode_s)
      st = r_cv.stats
      steps = st.target_forwards  # batched steps (one target forward each)
      draft_s = st.seconds.get("draft_s", 0.0)  # the host hook's time is drafting + the host's
      split = (1000 * draft_s / steps, 1000 * st.step_s / steps,
               1000 * (st.host_s - draft_s) / steps)
      ar_step = 1000 * ar_s / max(ar_steps, 1)
      print(f"batch {B}: AR {ar_s:.1f} s, crossvocab {r_cv.decode_s:.1f} s decoding "
            f"({time.perf_counter() - t0:.0f} s with prefill and compilation)", flush=True)
    ar_tps = toks / statistics.median(times["ar"])
    cv_tps = toks / statistics.median(times["cv"])
    lines.append(f"| {B} | {ar_tps:.2f} | {cv_tps:.2f} | {cv_tps / ar_tps:.2f}x | "
                 f"{st.tau:.2f} | {ar_step:.0f} | {split[0]:.0f} / {split[1]:.0f} / "
                 f"{split[2]:.1f} | {r_cv.tokens == ar_tokens} |")
    print(lines[-1], flush=True)
  atomic_write_text(a.out, "\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
