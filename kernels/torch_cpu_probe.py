"""What torch does on this CPU, for choosing backends for data work: f32 and bf16
GEMM rates (AMX shows as bf16 >> f32), and the 1.5B target loaded by transformers in bf16: a
[1, 512] prefill (what a feature shard costs per token) and greedy `generate` of 32 tokens
after 128 for batches of 16 and 64 (what `calibrate count --generate --backend torch` does).
A probe, best of one run after a warm-up: run it on an idle machine.

    python kernels/torch_cpu_probe.py --out train/eagle/data/torch_cpu_probe.md
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
  import torch

  from vocabjax.checkpoints.torch_model import load_torch_model
  from vocabjax.io import atomic_write_text

  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--out", required=True, help="markdown report")
  a = ap.parse_args(argv)
  rows = []
  for dt in (torch.float32, torch.bfloat16):
    x, y = torch.randn(2048, 2048, dtype=dt), torch.randn(2048, 2048, dtype=dt)
    x @ y
    t = time.perf_counter()
    for _ in range(5):
      x @ y
    s = (time.perf_counter() - t) / 5
    rows.append((f"GEMM 2048^3 {str(dt).removeprefix('torch.')}", f"{2 * 2048 ** 3 / s / 1e9:.0f} GFLOP/s"))
    print(rows[-1], flush=True)
  m = load_torch_model(a.model, "bfloat16")
  with torch.inference_mode():
    ids = torch.randint(100, 20000, (1, 512))
    m(ids)
    t = time.perf_counter()
    m(ids)
    s = time.perf_counter() - t
    rows.append(("prefill [1, 512] bf16", f"{s:.2f} s, {512 / s:.0f} tok/s"))
    print(rows[-1], flush=True)
    for B in (16, 64):
      ids = torch.randint(100, 20000, (B, 128))
      t = time.perf_counter()
      m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                 do_sample=False, pad_token_id=0)
      s = time.perf_counter() - t
      rows.append((f"generate B={B}, 32 after 128, bf16", f"{s:.1f} s, {B * 32 / s:.1f} tok/s"))
      print(rows[-1], flush=True)
  cmd = "python kernels/torch_cpu_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])
  atomic_write_text(a.out, f"Command: `{cmd}` (torch {torch.__version__}, "
                    f"{torch.get_num_threads()} threads, CPU capability "
                    f"{torch.backends.cpu.get_cpu_capability()}; model {a.model})\n\n"
                    "| what | result |\n|---|---|\n"
                    + "".join(f"| {k} | {v} |\n" for k, v in rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
