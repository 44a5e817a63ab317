"""Real-model check and autoregressive benchmark: vocabjax vs transformers on the registry's Qwen pair.

  python eval/real_models.py --out eval/results/real_models

For each model (Qwen2.5-Coder 0.5B and 1.5B, GGUF from the registry, f32 on CPU):
  1. vocabjax greedy-generates N new tokens on each prompt (chat template, batch 1);
  2. transformers loads the *same GGUF* in f32 and greedy-generates from the same prompt ids;
  3. the token ids are compared, and both runs are timed in this one process, on this machine
     (a warm-up run first for each, excluded; tokens/s = new tokens / generation wall time,
     prefill included; medians over the prompts).
It also measures numpy copy bandwidth and reports the memory floor of decoding: (bytes of
weights read per token, i.e. every parameter but the embedding table, in f32) / bandwidth.
Writes `<out>.json` and `<out>.md` atomically.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "A train travels 120 km in 1.5 hours. What is its average speed in km/h? Explain briefly.",
    "Explain in two sentences what a hash table is.",
]
MODELS = ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]


def copy_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 5) -> float:
  """numpy copy bandwidth, counting bytes read + bytes written (median of repeats)."""
  src = np.ones(nbytes // 4, np.float32)
  dst = np.empty_like(src)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    np.copyto(dst, src)
    times.append(time.perf_counter() - t)
  return 2 * nbytes / np.median(times) / 1e9


def run_vocabjax(name: str, prompts_text: list[str], max_new: int) -> dict:
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding import Decoder
  from vocabjax.generate import encode_prompts

  t0 = time.perf_counter()
  model = load_model(name)
  load_s = time.perf_counter() - t0
  ids = encode_prompts(model.tokenizer, prompts_text, chat=True)
  decoder = Decoder(model.params, model.config)
  runs = []
  for i, p in enumerate(ids):
    decoder.generate([p], max_new_tokens=max_new, eos_token_ids=model.eos_token_ids,
                     max_len=512)  # warm-up: compiles this prompt's prefill shape
    res = decoder.generate([p], max_new_tokens=max_new, eos_token_ids=model.eos_token_ids,
                           max_len=512)
    wall = res.prefill_s + res.decode_s
    runs.append({"prompt": i, "new_tokens": len(res.tokens[0]), "wall_s": wall,
                 "tokens_per_s": len(res.tokens[0]) / wall,
                 "decode_tokens_per_s": res.decode_tokens_per_s, "ids": res.tokens[0]})
    print(f"  vocabjax {name} prompt {i}: {runs[-1]['tokens_per_s']:.2f} tok/s", flush=True)
  out = {"load_s": load_s, "runs": runs, "prompt_ids": ids, "eos": list(model.eos_token_ids),
         "source": model.source, "text": [model.tokenizer.decode(r["ids"]) for r in runs],
         "weight_bytes_per_token": model.config.num_params(include_embedding=False) * 4,
         "num_params": model.config.num_params()}
  del model, decoder
  gc.collect()
  return out


def run_torch(source: str, prompt_ids: list[list[int]], eos: list[int], max_new: int) -> dict:
  import torch
  import transformers

  torch.set_num_threads(2)
  path = Path(source)
  t0 = time.perf_counter()
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path.parent, gguf_file=path.name, dtype=torch.float32).eval()
  load_s = time.perf_counter() - t0
  runs = []
  for i, p in enumerate(prompt_ids):
    x = torch.tensor([p])
    kw = dict(max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=eos[0],
              top_k=None, top_p=None, temperature=None)
    with torch.no_grad():
      model.generate(x, **kw)  # warm-up, as for vocabjax
      t = time.perf_counter()
      out = model.generate(x, **kw)[0, len(p):].tolist()
      wall = time.perf_counter() - t
    runs.append({"prompt": i, "new_tokens": len(out), "wall_s": wall,
                 "tokens_per_s": len(out) / wall, "ids": out})
    print(f"  torch    {path.name} prompt {i}: {runs[-1]['tokens_per_s']:.2f} tok/s", flush=True)
  del model
  gc.collect()
  return {"load_s": load_s, "runs": runs, "torch": torch.__version__,
          "transformers": transformers.__version__}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="eval/results/real_models")
  ap.add_argument("--max-new-tokens", type=int, default=64)
  ap.add_argument("--models", nargs="+", default=MODELS)
  args = ap.parse_args(argv)
  import jax

  bw = copy_bandwidth_gbs()
  print(f"numpy copy bandwidth (read + write): {bw:.1f} GB/s", flush=True)
  report = {
      "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
      "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                               text=True).stdout.strip(),
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                 f"jax {jax.__version__} {jax.default_backend()}, dtype float32",
      "copy_bandwidth_gbs": bw, "max_new_tokens": args.max_new_tokens, "models": {}}
  for name in args.models:
    print(f"== {name}", flush=True)
    ours = run_vocabjax(name, PROMPTS, args.max_new_tokens)
    ref = run_torch(ours["source"], ours["prompt_ids"], ours["eos"], args.max_new_tokens)
    identical = [a["ids"] == b["ids"] for a, b in zip(ours["runs"], ref["runs"])]
    floor_s = ours["weight_bytes_per_token"] / (bw * 1e9)
    med = lambda runs, k="tokens_per_s": float(np.median([r[k] for r in runs]))  # noqa: E731
    report["models"][name] = {
        "vocabjax": ours, "torch": ref, "ids_identical": identical,
        "vocabjax_tokens_per_s": med(ours["runs"]), "torch_tokens_per_s": med(ref["runs"]),
        "vocabjax_decode_tokens_per_s": med(ours["runs"], "decode_tokens_per_s"),
        "floor_tokens_per_s": 1 / floor_s,
        "pct_of_floor": 100 * med(ours["runs"], "decode_tokens_per_s") * floor_s}
    m = report["models"][name]
    print(f"  identical ids: {identical}; vocabjax {m['vocabjax_tokens_per_s']:.2f} tok/s vs "
          f"torch {m['torch_tokens_per_s']:.2f}; floor {m['floor_tokens_per_s']:.2f} tok/s "
          f"({m['pct_of_floor']:.0f}% reached)", flush=True)
  write(report, Path(args.out))
  return 0 if all(all(m["ids_identical"]) for m in report["models"].values()) else 1


def write(report: dict, out: Path) -> None:
  from vocabjax.generate import atomic_write_json

  atomic_write_json(out.with_suffix(".json"), report)
  lines = [f"# Real-model check and autoregressive benchmark", "",
           f"- command: `{report['command']}`", f"- commit: `{report['commit']}`",
           f"- date: {report['date']}", f"- machine: {report['machine']}",
           f"- numpy copy bandwidth (read + write): {report['copy_bandwidth_gbs']:.1f} GB/s",
           f"- greedy, {report['max_new_tokens']} new tokens, chat template, batch 1, "
           f"{len(PROMPTS)} prompts; tokens/s = new tokens / generation wall time (prefill "
           f"included, compile and warm-up excluded), median over prompts", "",
           "| model | ids identical to transformers (same GGUF, f32) | vocabjax tok/s | "
           "transformers tok/s | vocabjax / torch | vocabjax decode tok/s | floor tok/s | "
           "% of floor |", "|---|---|---|---|---|---|---|---|"]
  for name, m in report["models"].items():
    lines.append(f"| {name} | {sum(m['ids_identical'])}/{len(m['ids_identical'])} | "
                 f"{m['vocabjax_tokens_per_s']:.2f} | {m['torch_tokens_per_s']:.2f} | "
                 f"{m['vocabjax_tokens_per_s'] / m['torch_tokens_per_s']:.2f}x | "
                 f"{m['vocabjax_decode_tokens_per_s']:.2f} | {m['floor_tokens_per_s']:.2f} | "
                 f"{m['pct_of_floor']:.0f}% |")
  lines += ["", "Floor = (f32 bytes of every weight except the embedding table) / copy "
            "bandwidth; % of floor = decode tok/s / floor tok/s.", ""]
  for name, m in report["models"].items():
    lines.append(f"## {name}\n")
    for i, text in enumerate(m["vocabjax"]["text"]):
      lines.append(f"prompt {i}: {PROMPTS[i]!r}\n\n```\n{text}\n```\n")
  tmp = out.with_suffix(".md.partial")
  tmp.write_text("\n".join(lines))
  tmp.replace(out.with_suffix(".md"))


if __name__ == "__main__":
  sys.exit(main())
