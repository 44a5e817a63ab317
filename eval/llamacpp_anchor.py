"""vocabjax beside llama.cpp on the same GGUF files, prompts, threads and greedy decoding.

  bash eval/llamacpp_anchor.sh            # builds llama.cpp once, then runs this script
  python eval/llamacpp_anchor.py --llama-lib BUILD/bin \\
      --speculative BUILD/bin/llama-speculative-simple \\
      --out eval/results/llamacpp_anchor

The default suite's prompts (one question per Spec-Bench task group + one HumanEval problem),
chat-templated by the target's tokenizer, `--max-new-tokens` new tokens each, greedy, on the
registry pair's Q4_K_M files. Each part runs in a process of its own (its peak resident memory
is that process's `ru_maxrss`):

- llama.cpp plain decoding (llama-cpp-python over the library built from its vendored sources)
  and its prompt lookup (`LlamaPromptLookupDecoding`, the binding's draft API);
- llama.cpp's speculative decoding with the 0.5B drafter (`llama-speculative-simple`, the
  example that ships with those sources; prompt text as the chat template renders it);
- vocabjax on the files' own blocks (no dtype: the default), the target alone (one process):
  plain decoding, prompt lookup (gamma 4 and 8) and SuffixDecoding (8 drafts; its global tree
  over the suite's earlier answers); with the drafter (another process): chain (gamma 3) and
  the EAGLE-2-style tree (k 2, depth 4, 8 nodes);
  `--dtypes auto,gguf-q8` runs them again on each further dtype (gguf-q8: the same blocks
  multiplied as llama.cpp multiplies them, 8-bit activations and integer dot products), each
  method named with its dtype and compared with vocabjax plain decoding on that dtype.

`--rounds N` runs every part N times, every other round in reverse order, and pools them (a
method's tok/s over all its generations), with each round's ratio beside it: the host's speed
drifts by tens of percent between parts run minutes apart.

A method's tok/s is new tokens over the wall time of its generations, prompt processing
included; vocabjax first runs each prompt for 4 tokens (its programs compiled, not counted),
llama.cpp one warm-up generation. llama-speculative-simple's time is its own encode + decode
timers (model loading left out). vocabjax also runs a self-sized chain (the draft length, 0-3,
chosen each step: `vocabjax.decoding.sizing`), and a second table says where each vocabjax
method's time goes (`split_rows`: prompt processing, decoding's steps and tokens a step, a
step's parts timed apart by `vocabjax.decoding.profile.step_split`, the tokens a step 1.5x
llama.cpp's plain decoding would need). Written: each part's `*.json` (every generation) and
`README.md`'s tables (`--out`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def prompts(limit: int | None = None):
  """[(qid, chat-rendered text, token ids)] of the default suite's questions."""
  from vocabjax.checkpoints.loader import load_tokenizer_and_vocab
  from vocabjax.eval.config import load_config
  from vocabjax.prompts import encode_prompts, load_prompts

  cfg = load_config("default")
  tok, _ = load_tokenizer_and_vocab(cfg.target)
  qs = load_prompts(cfg.datasets)[:limit]  # first turns (a multi-turn question's first)
  ids = encode_prompts(tok, [p.text for p in qs], chat=cfg.chat)  # as the main job does
  return [(p.qid, tok.decode(i, skip_special_tokens=False), i) for p, i in zip(qs, ids)]


def peak_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def run_llamacpp(args, qs) -> dict:
  from vocabjax.checkpoints import zoo

  import llama_cpp
  from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

  out = {}
  for name, draft in (("llama.cpp plain", None),
                      ("llama.cpp prompt lookup", LlamaPromptLookupDecoding(num_pred_tokens=4,
                                                                            max_ngram_size=2))):
    llm = llama_cpp.Llama(str(zoo.fetch(TARGET)), n_threads=args.threads,
                          n_threads_batch=args.threads, n_ctx=2048, n_batch=512,
                          draft_model=draft, logits_all=draft is not None, verbose=False)
    # (the binding's draft API writes every verified position's logits into its scores, which
    # hold a batch's rows unless logits_all: n_ctx x V floats, 1.2 GB here, in its peak)
    gens = []
    for i, (qid, _, ids) in enumerate([qs[0]] + qs):
      llm.reset()
      t0 = time.perf_counter()
      toks = []
      for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        if len(toks) >= args.max_new_tokens:
          break
        toks.append(t)
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t):  # llama.cpp's end tokens
          break
      dt = time.perf_counter() - t0
      if i:  # the first is a warm-up
        gens.append({"qid": qid, "tokens": toks, "seconds": dt})
    out[name] = {"generations": gens, "peak_gb": peak_gb()}
    del llm
  out["llama.cpp version"] = llama_cpp.__version__
  return out


def run_llamacpp_speculative(args, qs) -> dict:
  from vocabjax.checkpoints import zoo

  gens = []
  for qid, text, ids in qs:
    cmd = ["/usr/bin/time", "-v", args.speculative, "-m", str(zoo.fetch(TARGET)), "-md",
           str(zoo.fetch(DRAFT)), "-p", text, "-n", str(args.max_new_tokens), "-t",
           str(args.threads), "-td", str(args.threads), "--temp", "0", "-c", "2048",
           "--spec-type", "draft-simple", "--spec-draft-n-max", "3", "--spec-draft-n-min", "0",
           "-s", "0"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    log = r.stdout + r.stderr
    if r.returncode:
      raise RuntimeError(f"llama-speculative-simple failed ({r.returncode}): {log[-2000:]}")
    grab = lambda pat: re.search(pat, log)  # noqa: E731
    enc, dec = grab(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds"), grab(
        r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
    acc = grab(r"n_accept\s+=\s+(\d+)")
    drafted = grab(r"n_drafted\s+=\s+(\d+)")
    rss = grab(r"Maximum resident set size \(kbytes\): (\d+)")
    gens.append({"qid": qid, "prompt_tokens": len(ids), "new_tokens": int(dec.group(1)),
                 "seconds": float(enc.group(2)) + float(dec.group(2)), "process_s": dt,
                 "accepted": int(acc.group(1)), "drafted": int(drafted.group(1)),
                 "peak_gb": int(rss.group(1)) / 1e6})
  return {"llama.cpp speculative (0.5B drafter, draft max 3)": {
      "generations": gens, "peak_gb": max(g["peak_gb"] for g in gens)}}


def run_vocabjax(args, qs) -> dict:
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding.autoregressive import Decoder
  from vocabjax.decoding.drafter import ChainProposer, TreeProposer
  from vocabjax.decoding.pld import LookupProposer
  from vocabjax.decoding.profile import step_split
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.suffix import SuffixProposer
  from vocabjax.decoding.tree import TreeParams

  dtype = None if args.dtype in (None, "auto") else args.dtype
  t = load_model(TARGET, dtype=dtype, load_tokenizer=False)
  d = (load_model(DRAFT, dtype=dtype, load_tokenizer=False) if args.part == "vocabjax-spec"
       else None)
  methods = {} if d else {  # the target alone: plain decoding and the model-free drafts
      "vocabjax plain": lambda: Decoder(t.params, t.config),
      "vocabjax prompt lookup (gamma 4)": lambda: SpeculativeEngine(
          t.params, t.config, LookupProposer(gamma=4, min_ngram=2)),
      "vocabjax prompt lookup (gamma 8)": lambda: SpeculativeEngine(
          t.params, t.config, LookupProposer(gamma=8, min_ngram=2)),
      "vocabjax suffix decoding (8 drafts)": lambda: SpeculativeEngine(
          t.params, t.config, SuffixProposer(max_spec_tokens=8)),
  }
  if d:
    methods = {
        "vocabjax chain (gamma 3)": lambda: SpeculativeEngine(
            t.params, t.config, ChainProposer(d.params, d.config, t.config, gamma=3)),
        "vocabjax chain (self-sized, gamma 0-3)": lambda: SpeculativeEngine(
            t.params, t.config, ChainProposer(d.params, d.config, t.config, gamma=3),
            self_sizing=True),
        "vocabjax tree (k 2, depth 4, 8 nodes)": lambda: SpeculativeEngine(
            t.params, t.config, TreeProposer(d.params, d.config, t.config,
                                             tree=TreeParams(2, 4, 8))),
    }
  out = {"weights": f"target {t.dtype}" + (f", drafter {d.dtype}" if d else "")}
  for name, build in methods.items():
    dec = build()
    # compiles every prompt length's programs before anything is timed (SuffixDecoding's
    # global tree keeps nothing of these truncated answers: `untracked`)
    untracked = getattr(getattr(dec, "proposer", None), "untracked", contextlib.nullcontext)
    with untracked():
      for _, _, ids in qs:
        dec.generate([ids], max_new_tokens=4, max_len=2048, eos_token_ids=t.eos_token_ids)
    gens = []
    for qid, _, ids in qs:
      t0 = time.perf_counter()
      res = dec.generate([ids], max_new_tokens=args.max_new_tokens, max_len=2048,
                         eos_token_ids=t.eos_token_ids)
      dt = time.perf_counter() - t0
      st = res.stats
      gens.append({"qid": qid, "tokens": res.tokens[0], "seconds": dt,
                   "prefill_s": res.prefill_s, "decode_s": res.decode_s,
                   "steps": getattr(st, "target_forwards", len(res.tokens[0]) - 1),
                   **({"tau": st.tau} if hasattr(st, "tau") else {}),
                   **({"sized": st.sizing["choices"]} if getattr(st, "sizing", None) else {})})
      print(f"  {name} {qid} {len(res.tokens[0])} tokens {dt:.1f} s", file=sys.stderr, flush=True)
    entry = {"generations": gens, "peak_gb": peak_gb()}
    if dec.times_step_parts:  # where a step's time goes (vocabjax.decoding.profile)
      split = step_split(dec, batch_size=1, max_len=2048)
      entry["step_split"] = split.as_dict()
    out[name + (f" [{dtype}]" if dtype else "")] = entry
    del dec
  return out


PARTS = {"llamacpp": run_llamacpp, "llamacpp-speculative": run_llamacpp_speculative,
         "vocabjax-plain": run_vocabjax, "vocabjax-spec": run_vocabjax}


def measured(results: dict) -> dict:
  """{method: its entry} over every part's results (the entries with generations)."""
  return {k: v for part in results.values() for k, v in part.items()
          if isinstance(v, dict) and "generations" in v}


def pooled(rounds: list[dict]) -> dict:
  """The rounds' results as one: each method's generations of every round in one list (its
  tok/s: all new tokens over all seconds), its peak the largest, the first round's step split."""
  out: dict = {}
  for res in rounds:
    for key, part in res.items():
      into = out.setdefault(key, {})
      for name, v in part.items():
        if not (isinstance(v, dict) and "generations" in v):
          into.setdefault(name, v)
        elif name not in into:
          into[name] = dict(v, generations=list(v["generations"]))
        else:
          into[name]["generations"] += v["generations"]
          into[name]["peak_gb"] = max(into[name]["peak_gb"], v["peak_gb"])
  return out


def rate(m: dict) -> float:
  """A method's tok/s: new tokens over the seconds of its generations."""
  g = m["generations"]
  return sum(x.get("new_tokens", len(x.get("tokens", []))) for x in g) / sum(
      x["seconds"] for x in g)


def table(results: dict, rounds: list[dict] | None = None) -> list[str]:
  """Markdown rows: method, tok/s, x llama.cpp plain, greedy tokens equal to each plain
  decoding's, peak GB; with `rounds` (several: `results` is their `pooled`), each round's
  x llama.cpp plain too."""
  methods = measured(results)
  base = rate(methods["llama.cpp plain"])
  each = [measured(r) for r in rounds] if rounds and len(rounds) > 1 else []
  refs = {k: {g["qid"]: g["tokens"] for g in m["generations"]} for k, m in methods.items()
          if k == "llama.cpp plain" or k.startswith("vocabjax plain")}
  extra = " x llama.cpp plain, each round |" if each else ""
  rows = ["| method | tok/s | x llama.cpp plain | same tokens as llama.cpp plain | same "
          f"tokens as vocabjax plain | peak resident GB |{extra}",
          "|---|---|---|---|---|---|" + ("---|" if each else "")]
  for name, m in methods.items():
    same = []
    # vocabjax's methods against vocabjax plain decoding on the same dtype ("... [dtype]")
    tag = name[name.rindex(" ["):] if name.endswith("]") else ""
    for ref in (refs["llama.cpp plain"], refs.get("vocabjax plain" + tag)):
      gs = [g for g in m["generations"] if "tokens" in g]
      same.append(f"{sum(g['tokens'] == ref[g['qid']] for g in gs)}/{len(gs)}"
                  if gs and ref is not None else "-")
    by_round = (" " + ", ".join(f"{rate(r[name]) / rate(r['llama.cpp plain']):.2f}x"
                                for r in each) + " |") if each else ""
    rows.append(f"| {name} | {rate(m):.2f} | {rate(m) / base:.2f}x | {same[0]} | {same[1]} | "
                f"{m['peak_gb']:.2f} |{by_round}")
  return rows


def split_rows(results: dict) -> list[str]:
  """Where each vocabjax method's time goes (markdown): prompt processing and decoding summed
  over the questions, decoding's steps and tokens per step, a step's parts timed apart
  (`vocabjax.decoding.profile.step_split`: drafter layers, drafter head, the verified block,
  one plain target step), and the tokens per step decoding would need, after the same prompt
  processing, for 1.5x llama.cpp's plain tok/s."""
  methods = measured(results)
  g0 = methods["llama.cpp plain"]["generations"]
  goal = 1.5 * sum(len(g["tokens"]) for g in g0) / sum(g["seconds"] for g in g0)
  rows = ["| method | prompt s | decode s | steps | tokens a step | ms a step | drafter, its head, "
          "verification, plain step (ms) | tokens a step for 1.5x llama.cpp plain |",
          "|---|---|---|---|---|---|---|---|"]
  for name, m in methods.items():
    gs = m["generations"]
    if not name.startswith("vocabjax") or "decode_s" not in gs[0]:
      continue
    pre, dec = sum(g["prefill_s"] for g in gs), sum(g["decode_s"] for g in gs)
    steps = sum(g["steps"] for g in gs)
    new = sum(len(g["tokens"]) for g in gs)
    later = new - len(gs)  # a prompt's prefill gives its first token
    budget = new / goal - pre - sum(g["seconds"] - g["prefill_s"] - g["decode_s"] for g in gs)
    need = (f"{later / (budget / (dec / steps)):.2f}" if budget > 0 else
            "none: prompt processing alone takes longer")
    sp = m.get("step_split")
    parts = (", ".join(f"{1000 * sp[k]:.1f}" for k in ("drafter_s", "drafter_head_s",
                                                         "verification_s", "target_step_s"))
             + f" ({sp['verify_tokens']} tokens verified)" if sp else "-")
    sized = {}
    for g in gs:
      for n, c in (g.get("sized") or {}).items():
        sized[n] = sized.get(n, 0) + c
    chose = (" (drafts chosen: " + ", ".join(f"{n}: {c}" for n, c in sorted(
        sized.items(), key=lambda x: int(x[0]))) + ")") if sized else ""
    rows.append(f"| {name}{chose} | {pre:.2f} | {dec:.2f} | {steps} | {later / steps:.2f} | "
                f"{1000 * dec / steps:.1f} | {parts} | {need} |")
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--part", choices=sorted(PARTS), help="run one part (internal)")
  p.add_argument("--json", help="where a part writes its results (internal)")
  p.add_argument("--llama-lib", help="the directory of llama.cpp's built libllama (its bin/)")
  p.add_argument("--speculative", help="the built llama-speculative-simple")
  p.add_argument("--threads", type=int, default=os.cpu_count())
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--limit", type=int, help="the first N questions only")
  p.add_argument("--rounds", type=int, default=1,
                 help="run every part this many times (every other round in reverse order); "
                      "the tables pool the rounds and give each round's ratio")
  p.add_argument("--out", default="runs/llamacpp_anchor")
  p.add_argument("--dtypes", default="auto", help="vocabjax's weights, comma-separated: auto "
                 "(the files' own blocks), gguf-q8 (llama.cpp's arithmetic), f32, ...")
  p.add_argument("--dtype", help="(internal) one part's dtype")
  args = p.parse_args(argv)
  if args.rounds < 1:
    p.error(f"--rounds {args.rounds}: at least one round")
  if args.part:
    if args.llama_lib:
      os.environ["LLAMA_CPP_LIB_PATH"] = args.llama_lib
    res = PARTS[args.part](args, prompts(args.limit))
    Path(args.json).write_text(json.dumps(res))
    return 0
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  runs = [("llamacpp", None), ("llamacpp-speculative", None)]
  for dt in args.dtypes.split(","):
    runs += [("vocabjax-plain", dt), ("vocabjax-spec", dt)]
  rounds = []
  for r in range(args.rounds):
    # round 1's parts in out/, round n's in out/round<n>/, every other round in reverse order
    # (a host that drifts slower or faster through a round favours no part on the whole)
    rounds.append(run_round(args, out if r == 0 else out / f"round{r + 1}",
                            runs if r % 2 == 0 else runs[::-1]))
  results = pooled(rounds)
  from vocabjax.eval.provenance import cpu_model
  from vocabjax.io import atomic_write_text

  lines = [f"# vocabjax beside llama.cpp (llama-cpp-python "
           f"{results['llamacpp'].get('llama.cpp version')}, its vendored llama.cpp)", "",
           f"`{' '.join(['python', 'eval/llamacpp_anchor.py', *(argv or sys.argv[1:])])}`, "
           f"{cpu_model()}, {args.threads} threads, {time.strftime('%Y-%m-%d')}; "
           f"{args.max_new_tokens} new tokens, greedy, the default suite's prompts"
           + (f", {args.rounds} rounds pooled (every method's generations of every round)"
              if args.rounds > 1 else "") + "; vocabjax's "
           "weights: " + "; ".join(v.get("weights") for k, v in results.items()
                                    if k.startswith("vocabjax-spec")) + ".", "",
           *table(results, rounds), "",
           "Where vocabjax's time goes (tokens a step: new tokens after each prompt's first "
           "over the decoding steps; the last column: tokens a step that would reach 1.5x "
           "llama.cpp's plain tok/s with the same prompt processing and ms a step):", "",
           *split_rows(results), ""]
  atomic_write_text(out / "README.md", "\n".join(lines))
  print("\n".join(lines))
  return 0


def run_round(args, out: Path, runs) -> dict:
  """One round's parts, each in a process of its own, into out/<part>.json; a part whose file
  exists is read, not run again (a run resumes)."""
  out.mkdir(parents=True, exist_ok=True)
  results = {}
  for part, dt in runs:
    key = part if dt in (None, "auto") else f"{part}-{dt}"
    path = out / f"{key}.json"
    if path.exists():  # resumable: a finished part is not run again
      results[key] = json.loads(path.read_text())
      continue
    if part.startswith("llamacpp") and not (args.llama_lib and args.speculative):
      sys.exit("--llama-lib and --speculative name the llama.cpp build (eval/llamacpp_anchor.sh)")
    print(f"[anchor] {path}", file=sys.stderr, flush=True)
    tmp = path.with_suffix(".json.tmp")
    cmd = [sys.executable, __file__, "--part", part, "--json", str(tmp), "--threads",
           str(args.threads), "--max-new-tokens", str(args.max_new_tokens)]
    cmd += ["--limit", str(args.limit)] if args.limit else []
    cmd += ["--llama-lib", args.llama_lib] if args.llama_lib else []
    cmd += ["--speculative", args.speculative] if args.speculative else []
    cmd += ["--dtype", dt] if dt else []
    subprocess.run(cmd, check=True)
    os.replace(tmp, path)
    results[key] = json.loads(path.read_text())
  return results


if __name__ == "__main__":
  sys.exit(main())
