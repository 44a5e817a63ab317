"""Teacher-forced accuracy of an EAGLE head on given texts, beside what decoding accepted.

For each record of an eval run's `questions.jsonl` (the autoregressive method's output: the
target's own greedy text), the target runs once over prompt + output; the head's training-time
test (`vocabjax.train.eagle_step.ttt_outputs`, the exact computation tree decoding performs) gives
its top-1 / top-k accuracy at every output position for depths 0..J-1. Compared with the
acceptance the eagle methods of the same run reached, this tells a weak head from a decoding
fault: at depth 0, decoding accepts a root child exactly when the target's token is among the
head's top_k there. Several `--head`s are scored on the same text in one run, and a table
gives each question's accuracy per head (which kinds of text a head drafts poorly). A
calibration table per head says how its top probability at depth 0 (the confidence that
`min_confidence` gates drafting on) tracks its top-1 accuracy there: for each threshold, the
share of positions at or above it, the accuracy above and below, and the share of all depth-0
hits kept (`--thresholds`).

    python train/eagle_report.py --head train/eagle/qwen15b/head --config eagle \
        --run eval/results/eagle/eval --out eval/results/eagle/teacher_forced.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


def main(argv=None) -> int:
  from vocabjax.checkpoints.eagle3 import load_eagle3
  from vocabjax.eval import load_config
  from vocabjax.eval.runner import load_prompts
  from vocabjax.prompts import encode_prompts
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.models.cache import KVCache
  from vocabjax.models.llamalike import forward_features, lm_head
  from vocabjax.io import atomic_write_text
  from vocabjax.train.eagle_step import ttt_outputs

  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--head", required=True, action="append",
                 help="an exported head; repeat to score several on the same text")
  p.add_argument("--run", required=True, help="an eval result directory with an `ar` method")
  p.add_argument("--config", default="eagle", help="the suite that made --run")
  p.add_argument("--steps", type=int, default=4)
  p.add_argument("--top-k", type=int, default=4)
  p.add_argument("--thresholds", type=float, nargs="+",
                 default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)

  recs = [json.loads(x) for x in (Path(a.run) / "questions.jsonl").read_text().splitlines()]
  config = load_config(a.config)
  target = load_model(config.target, dtype="float32")
  prompts = {pr.qid: pr for pr in load_prompts(config.datasets)}
  ar = [r for r in recs if r["method"] == "ar" and r["framework"] == "vocabjax"]
  J, K = a.steps, a.top_k
  heads = {}  # path -> (config, params, t2d): every head must read the same target layers
  for path in a.head:
    hc, head, _ = load_eagle3(path, target_config=target.config, target_params=target.params)
    first = next(iter(heads.values()), (hc,))[0]
    if hc.feature_layers != first.feature_layers:
      raise SystemExit(f"error: {path} reads target layers {hc.feature_layers}, the heads "
                       f"before it {first.feature_layers}: score them in separate runs")
    d2t = np.asarray(head["d2t"])
    t2d = np.full(target.config.vocab_size, -1, np.int64)
    t2d[np.arange(len(d2t)) + d2t] = np.arange(len(d2t))
    heads[path] = (hc, head, t2d)
  layers = next(iter(heads.values()))[0].feature_layers
  texts = []  # per question: qid, tokens, prompt length, length, the target's features, argmax
  for r in ar:  # the target runs once per question, whatever the number of heads
    ids = encode_prompts(target.tokenizer, [prompts[r["qid"]].text], config.chat)[0]
    toks = ids + r["output_ids"]
    T = len(toks)
    tok = jnp.asarray(toks)[None]
    h, _, f = forward_features(target.params, tok, jnp.arange(T)[None],
                               KVCache.init(target.config, 1, T), config=target.config,
                               layers=layers)
    y = np.asarray(jnp.argmax(lm_head(target.params, h[0], config=target.config), -1))
    texts.append((r["qid"], tok, len(ids), T, f, y))
  scores = {}  # head -> per question (top-1 hits, top-K hits, positions), each [J]
  calib = {}  # head -> [(depth-0 top probability, top-1 right)] over every scored position
  for path, (hc, head, t2d) in heads.items():
    run_ttt = jax.jit(lambda hp, emb, b, hc=hc: [x[0] for x in ttt_outputs(hp, emb, b,
                                                                            config=hc, steps=J)])
    per_q, cal = [], []
    for qid, tok, P, T, f, y in texts:
      batch = {"tokens": tok, "feats": f, "dlabel": jnp.zeros((1, T), jnp.int32),
               "weight": jnp.ones((1, T))}
      outs = run_ttt(head, target.params["embed"], batch)
      q1, qk, qn = np.zeros(J), np.zeros(J), np.zeros(J)
      for j, hn in enumerate(outs):
        logits = np.asarray(jnp.einsum("ND,VD->NV", hn[0], head["lm_head"]))
        top = np.argsort(-logits, axis=-1)[:, :K]
        z = logits - logits.max(-1, keepdims=True)
        conf = 1.0 / np.exp(z).sum(-1)  # the top probability
        for i in range(T - 1 - j):
          q = i + 1 + j  # label position
          if q < P - 1 or q >= T - 1:
            continue
          lab = t2d[y[q]]
          qn[j] += 1
          q1[j] += top[i, 0] == lab
          if j == 0:
            cal.append((float(conf[i]), bool(top[i, 0] == lab)))
          qk[j] += lab in top[i]
      per_q.append((q1, qk, qn))
    scores[path] = per_q
    calib[path] = np.asarray(cal, np.float64).reshape(-1, 2)
  rows = [t[0] for t in texts]
  several = len(a.head) > 1
  lines = [f"# Teacher-forced accuracy of {' and '.join(a.head)} on the target's greedy outputs",
           "", "`python train/eagle_report.py "
           + " ".join(sys.argv[1:] if argv is None else argv) + "`", ""]
  for path, per_q in scores.items():
    hits1, hitsk, n = (sum(x[i] for x in per_q) for i in range(3))
    if several:
      lines += [f"## {path}", ""]
    lines += [f"{len(ar)} questions ({', '.join(rows)}), {int(n[0])} positions at depth 0.", "",
              f"| depth j | positions | top-1 acc | top-{K} acc |", "|---|---|---|---|"]
    for j in range(J):
      lines.append(f"| {j} | {int(n[j])} | {hits1[j] / n[j]:.3f} | {hitsk[j] / n[j]:.3f} |")
    lines.append("")
  lines += ["Per question, top-1 accuracy at depth 0 / depth " + str(J - 1) + ":", "",
            "| question | group | positions | " + " | ".join(a.head) + " |",
            "|---|---|---|" + "---|" * len(a.head)]
  for k, qid in enumerate(rows):
    n0 = int(scores[a.head[0]][k][2][0])
    cells = [f"{s[k][0][0] / max(s[k][2][0], 1):.3f} / "
             f"{s[k][0][J - 1] / max(s[k][2][J - 1], 1):.3f}" for s in scores.values()]
    lines.append(f"| {qid} | {prompts[qid].group} | {n0} | " + " | ".join(cells) + " |")
  lines += ["", "Calibration at depth 0: the head's top probability (what `min_confidence` "
            "gates on) against its top-1 accuracy:", ""]
  for path, cal in calib.items():
    c, hit = cal[:, 0], cal[:, 1].astype(bool)
    if several:
      lines += [f"{path}:", ""]
    lines += ["| threshold | positions at or above | top-1 acc at or above | top-1 acc below | "
              "depth-0 hits kept |", "|---|---|---|---|---|"]
    for t in a.thresholds:
      up = c >= t
      acc_up = f"{hit[up].mean():.3f}" if up.any() else "-"
      acc_dn = f"{hit[~up].mean():.3f}" if (~up).any() else "-"
      kept = hit[up].sum() / max(hit.sum(), 1)
      lines.append(f"| {t:g} | {up.mean():.3f} | {acc_up} | {acc_dn} | {kept:.3f} |")
    lines.append("")
  lines += ["Decoding in the same run (accepted drafts per verification step):", "",
            "| method | steps | accepted | accepted / step | tau |", "|---|---|---|---|---|"]
  for m in config.methods:
    rs = [r for r in recs if r["method"] == m.name and r["framework"] == "vocabjax"]
    if m.method == "ar" or not rs:
      continue
    st, acc = sum(r["steps"] for r in rs), sum(r["accepted"] for r in rs)
    lines.append(f"| {m.name} | {st} | {acc} | {acc / st:.2f} | {(acc + st) / st:.2f} |")
  atomic_write_text(a.out, "\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
