"""Cross-vocabulary drafting at batch 1, 4 and 16 against plain decoding at the same batch
(issue 23): SmolLM2-135M drafting for Qwen2.5-Coder-1.5B through the n-gram cache, greedy,
on the CPU. Batches run in lockstep (one drafting and one verification program over all rows;
translation per row on the host); the step's time split (drafter programs, verification,
host work: translation, reverse translation, n-gram cache) is reported beside the throughput
and the AR step, so a per-row host loop that costs time would show.

Prompts: the default suite's Spec-Bench questions (one per task group + one HumanEval), cycled
to fill the batch; every batch size decodes the same rows, and the outputs are checked equal to
plain greedy decoding's. Each configuration runs once to compile, then `--repeats` timed runs
(median decode time).

    python eval/crossvocab_batch.py --out eval/results/crossvocab_batch.md
"""

from __future__ import annotations

import argparse
import statistics

from vocabjax import CrossVocabDecoder, Decoder, load_model
from vocabjax.decoding.speculative import block_layout
from vocabjax.io import atomic_write_text
from vocabjax.prompts import encode_prompts, load_prompts, suite_datasets


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--draft", default="smollm2-135m-instruct")
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
  ap.add_argument("--max-new-tokens", type=int, default=32)
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--out", required=True)
  a = ap.parse_args(argv)
  target, draft = load_model(a.target), load_model(a.draft)
  ids = encode_prompts(target.tokenizer, [p.text for p in load_prompts(suite_datasets("default"))],
                       True)
  ar = Decoder(target.params, target.config)
  cv = CrossVocabDecoder(target.in_layout(block_layout()), target.config, draft.params,
                         draft.config, target_tokenizer=target.tokenizer,
                         draft_tokenizer=draft.tokenizer, gamma=a.gamma)
  kw = dict(max_new_tokens=a.max_new_tokens, eos_token_ids=())
  lines = ["# Cross-vocabulary drafting by batch size", "",
           f"Command: `python eval/crossvocab_batch.py --batches {' '.join(map(str, a.batches))} "
           f"--max-new-tokens {a.max_new_tokens} --gamma {a.gamma} --repeats {a.repeats} "
           f"--out {a.out}`; target {a.target}, drafter {a.draft} (n-gram cache on, learned "
           f"online), f32, greedy, no EOS stop; decode tokens/s = new tokens of all rows / "
           f"median decode time (prefill and compilation left out).", "",
           "| batch | AR tok/s | crossvocab tok/s | speedup | tau | AR step ms | crossvocab "
           "step ms: drafter / verification / host | outputs equal AR |",
           "|---|---|---|---|---|---|---|---|"]
  for B in a.batches:
    rows = [ids[i % len(ids)] for i in range(B)]
    times = {"ar": [], "cv": []}
    for rep in range(a.repeats + 1):
      # interleaved: AR then crossvocab in each repeat; the first repeat compiles
      r_ar = ar.generate(rows, **kw)
      r_cv = cv.generate(rows, **kw)
      if rep:
        times["ar"].append(r_ar.decode_s)
        times["cv"].append(r_cv.decode_s)
        st = r_cv.stats
        steps = st.target_forwards  # batched steps (one target forward each)
        split = (1000 * st.draft_s / steps, 1000 * st.verify_s / steps, 1000 * st.host_s / steps)
        ar_step = 1000 * r_ar.decode_s / max(r_ar.steps, 1)
    toks = sum(len(t) - 1 for t in r_cv.tokens)  # the first token comes from the prefill
    ar_tps = toks / statistics.median(times["ar"])
    cv_tps = toks / statistics.median(times["cv"])
    lines.append(f"| {B} | {ar_tps:.2f} | {cv_tps:.2f} | {cv_tps / ar_tps:.2f}x | "
                 f"{r_cv.stats.tau:.2f} | {ar_step:.0f} | {split[0]:.0f} / {split[1]:.0f} / "
                 f"{split[2]:.1f} | {r_cv.tokens == r_ar.tokens} |")
    print(lines[-1], flush=True)
  atomic_write_text(a.out, "\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
