"""Real-model check and autoregressive benchmark: vocabjax vs transformers on the registry's Qwen pair.

  python eval/real_models.py --out eval/results/real_models

For each model (Qwen2.5-Coder 0.5B and 1.5B, GGUF from the registry, f32 on CPU) both
frameworks are loaded side by side: vocabjax, and transformers loading the *same GGUF* in f32.
On each prompt (chat template, batch 1, greedy, N new tokens) each framework runs once to warm
up (compile; excluded), then the two alternate, A B A B, so that drift in this shared
machine's memory bandwidth hits both alike; tokens/s = new tokens / generation wall time
(prefill included), median over repeats and prompts. Token ids are compared.
It also measures memory bandwidth (numpy copy, read + write; and a jitted f32 reduction, read
only) and reports the memory floor of decoding: (bytes of weights read per token, i.e. every
parameter but the embedding table, in f32) / read bandwidth.
Writes `<out>.json` and `<out>.md` atomically.
"""

from __future__ import annotations

import argparse
import datetime
import gc
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


def read_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 5) -> float:
  """Read-only bandwidth: a jitted f32 sum over `nbytes` (median of repeats)."""
  import jax
  import jax.numpy as jnp

  x = jnp.ones((nbytes // 4,), jnp.float32)
  f = jax.jit(jnp.sum)
  f(x).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(x).block_until_ready()
    times.append(time.perf_counter() - t)
  return nbytes / np.median(times) / 1e9


class VocabjaxRunner:
  def __init__(self, name: str):
    from vocabjax.checkpoints.loader import load_model
    from vocabjax.decoding import Decoder

    t0 = time.perf_counter()
    self.model = load_model(name)
    self.load_s = time.perf_counter() - t0
    self.decoder = Decoder(self.model.params, self.model.config)

  def __call__(self, ids: list[int], max_new: int) -> tuple[list[int], float, float]:
    res = self.decoder.generate([ids], max_new_tokens=max_new,
                                eos_token_ids=self.model.eos_token_ids, max_len=512)
    return res.tokens[0], res.prefill_s + res.decode_s, res.decode_tokens_per_s


class TorchRunner:
  def __init__(self, source: str, eos: list[int]):
    import torch
    import transformers

    torch.set_num_threads(2)
    self.torch, path = torch, Path(source)
    t0 = time.perf_counter()
    from vocabjax.checkpoints.torch_model import dequantized_gguf
    self.model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, **dequantized_gguf(path)).eval()
    self.load_s = time.perf_counter() - t0
    self.kw = dict(do_sample=False, eos_token_id=eos, pad_token_id=eos[0], top_k=None,
                   top_p=None, temperature=None)
    self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}

  def __call__(self, ids: list[int], max_new: int) -> tuple[list[int], float, float]:
    with self.torch.no_grad():
      t = time.perf_counter()
      out = self.model.generate(self.torch.tensor([ids]), max_new_tokens=max_new, **self.kw)
      wall = time.perf_counter() - t
    return out[0, len(ids):].tolist(), wall, float("nan")


def compare(name: str, max_new: int, repeats: int) -> dict:
  from vocabjax.prompts import encode_prompts

  ours = VocabjaxRunner(name)
  ids = encode_prompts(ours.model.tokenizer, PROMPTS, chat=True)
  ref = TorchRunner(ours.model.source, list(ours.model.eos_token_ids))
  runs = {"vocabjax": [], "torch": []}
  for i, p in enumerate(ids):
    ours(p, max_new), ref(p, max_new)  # warm-up (compiles this prompt's prefill shape)
    for rep in range(repeats):
      for fw, runner in (("vocabjax", ours), ("torch", ref)):
        toks, wall, decode_tps = runner(p, max_new)
        runs[fw].append({"prompt": i, "repeat": rep, "ids": toks, "wall_s": wall,
                         "tokens_per_s": len(toks) / wall, "decode_tokens_per_s": decode_tps})
        print(f"  {fw:8s} {name} prompt {i} rep {rep}: {len(toks) / wall:.2f} tok/s",
              flush=True)
  identical = [a["ids"] == b["ids"] for a, b in zip(runs["vocabjax"], runs["torch"])
               if a["repeat"] == 0]
  out = {"runs": runs, "ids_identical": identical, "prompt_ids": ids,
         "texts": [ours.model.tokenizer.decode(r["ids"]) for r in runs["vocabjax"]
                   if r["repeat"] == 0],
         "load_s": {"vocabjax": ours.load_s, "torch": ref.load_s}, **ref.versions,
         "weight_bytes_per_token": ours.model.config.num_params(include_embedding=False) * 4}
  del ours, ref
  gc.collect()
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="eval/results/real_models")
  ap.add_argument("--max-new-tokens", type=int, default=64)
  ap.add_argument("--models", nargs="+", default=MODELS)
  ap.add_argument("--repeats", type=int, default=2, help="timed A/B repeats per prompt")
  args = ap.parse_args(argv)
  import jax

  bw = copy_bandwidth_gbs()
  rbw = read_bandwidth_gbs()
  print(f"numpy copy bandwidth (read + write): {bw:.1f} GB/s; read: {rbw:.1f} GB/s", flush=True)
  report = {
      "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
      "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                               text=True).stdout.strip(),
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                 f"jax {jax.__version__} {jax.default_backend()}, dtype float32",
      "copy_bandwidth_gbs": bw, "read_bandwidth_gbs": rbw, "repeats": args.repeats,
      "max_new_tokens": args.max_new_tokens, "models": {}}
  for name in args.models:
    print(f"== {name}", flush=True)
    m = compare(name, args.max_new_tokens, args.repeats)
    floor_s = m["weight_bytes_per_token"] / (rbw * 1e9)
    med = lambda fw, k="tokens_per_s": float(np.median([r[k] for r in m["runs"][fw]]))  # noqa
    m.update(vocabjax_tokens_per_s=med("vocabjax"), torch_tokens_per_s=med("torch"),
             vocabjax_decode_tokens_per_s=med("vocabjax", "decode_tokens_per_s"),
             floor_tokens_per_s=1 / floor_s,
             pct_of_floor=100 * med("vocabjax", "decode_tokens_per_s") * floor_s)
    report["models"][name] = m
    print(f"  identical ids: {m['ids_identical']}; vocabjax {m['vocabjax_tokens_per_s']:.2f} tok/s vs "
          f"torch {m['torch_tokens_per_s']:.2f}; floor {m['floor_tokens_per_s']:.2f} tok/s "
          f"({m['pct_of_floor']:.0f}% reached)", flush=True)
  write(report, Path(args.out))
  return 0 if all(all(m["ids_identical"]) for m in report["models"].values()) else 1


def write(report: dict, out: Path) -> None:
  from vocabjax.io import atomic_write_json

  atomic_write_json(out.with_suffix(".json"), report)
  lines = ["# Real-model check and autoregressive benchmark", "",
           f"- command: `{report['command']}`", f"- commit: `{report['commit']}`",
           f"- date: {report['date']}", f"- machine: {report['machine']}",
           f"- memory bandwidth: numpy copy {report['copy_bandwidth_gbs']:.1f} GB/s (read + "
           f"write), jitted f32 sum {report['read_bandwidth_gbs']:.1f} GB/s (read)",
           f"- greedy, {report['max_new_tokens']} new tokens, chat template, batch 1, "
           f"{len(PROMPTS)} prompts x {report['repeats']} alternating repeats per framework; "
           f"tokens/s = new tokens / generation wall time (prefill included, compile and "
           f"warm-up excluded), median", "",
           "| model | ids identical to transformers (same GGUF, f32) | vocabjax tok/s | "
           "transformers tok/s | vocabjax / torch | vocabjax decode tok/s | floor tok/s | "
           "% of floor |", "|---|---|---|---|---|---|---|---|"]
  for name, m in report["models"].items():
    lines.append(f"| {name} | {sum(m['ids_identical'])}/{len(m['ids_identical'])} | "
                 f"{m['vocabjax_tokens_per_s']:.2f} | {m['torch_tokens_per_s']:.2f} | "
                 f"{m['vocabjax_tokens_per_s'] / m['torch_tokens_per_s']:.2f}x | "
                 f"{m['vocabjax_decode_tokens_per_s']:.2f} | {m['floor_tokens_per_s']:.2f} | "
                 f"{m['pct_of_floor']:.0f}% |")
  lines += ["", "Floor = (f32 bytes of every weight except the embedding table) / read "
            "bandwidth; % of floor = vocabjax decode tok/s / floor tok/s.", ""]
  for name, m in report["models"].items():
    lines.append(f"## {name}\n")
    for i, text in enumerate(m["texts"]):
      lines.append(f"prompt {i}: {PROMPTS[i]!r}\n\n```\n{text}\n```\n")
  tmp = out.with_suffix(".md.partial")
  tmp.write_text("\n".join(lines))
  tmp.replace(out.with_suffix(".md"))


if __name__ == "__main__":
  sys.exit(main())
