"""Calibration throughput on this machine: tokenization (fast tokenizer, batched; and
datasets.map with num_proc workers) and sharded counting (1 device, and 8 virtual CPU devices)
measured separately on the same corpus.

    python train/calibration_throughput.py --out train/calibration/throughput.json

Counting runs in a subprocess per device count (XLA_FLAGS must be set before jax starts).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np


def tokenize(model: str, corpus: str, limit: int | None, num_proc: int):
  from vocabjax.calibrate.run import CountJob, text_documents
  from vocabjax.checkpoints.loader import load_tokenizer_and_vocab

  tok, V = load_tokenizer_and_vocab(model)
  docs = text_documents(CountJob(model=model, out="-", text=(corpus,), glob=("*.py",),
                                 limit=limit))
  out = {"documents": len(docs), "chars": sum(map(len, docs))}
  t = time.perf_counter()
  ids = []
  for i in range(0, len(docs), 256):
    ids += tok(docs[i:i + 256], add_special_tokens=False)["input_ids"]
  out["tokenize_s"] = time.perf_counter() - t
  out["tokens"] = sum(map(len, ids))
  out["tokenize_tokens_per_s"] = out["tokens"] / out["tokenize_s"]
  import datasets

  ds = datasets.Dataset.from_dict({"text": docs})
  t = time.perf_counter()
  ds.map(lambda b: {"ids": tok(b["text"], add_special_tokens=False)["input_ids"]},
         batched=True, num_proc=num_proc if num_proc > 1 else None, remove_columns=["text"])
  out["datasets_map_s"] = time.perf_counter() - t
  out["datasets_map_num_proc"] = num_proc
  out["datasets_map_tokens_per_s"] = out["tokens"] / out["datasets_map_s"]
  return np.concatenate([np.asarray(x, np.int32) for x in ids]), V, out


def count_child(path: str, V: int, repeats: int) -> None:
  import jax

  from vocabjax.calibrate.counting import TokenCounter

  ids = np.load(path)
  c = TokenCounter(V)
  c.add(ids[:1 << 16])  # compile
  times = []
  for _ in range(repeats):
    c = TokenCounter(V)
    t = time.perf_counter()
    c.add(ids)
    times.append(time.perf_counter() - t)
  ok = bool(np.array_equal(c.counts, np.bincount(ids, minlength=V)))
  print(json.dumps({"devices": jax.device_count(), "count_s": float(np.median(times)),
                    "count_tokens_per_s": ids.size / float(np.median(times)),
                    "equals_bincount": ok}))


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--corpus", default="corpus:stdlib")
  ap.add_argument("--limit", type=int, default=600, help="documents")
  ap.add_argument("--num-proc", type=int, default=2)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default="train/calibration/throughput.json")
  ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a._child:
    return count_child(a._child[0], int(a._child[1]), a.repeats)
  ids, V, res = tokenize(a.model, a.corpus, a.limit, a.num_proc)
  tmp = "/tmp/vocabjax_throughput_ids.npy"
  np.save(tmp, ids)
  res["counting"] = []
  for n in (1, 8):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}",
           "JAX_PLATFORMS": "cpu"}
    p = subprocess.run([sys.executable, __file__, "--repeats", str(a.repeats), "--_child", tmp,
                        str(V)], env=env, capture_output=True, text=True, check=True)
    res["counting"].append(json.loads(p.stdout.strip().splitlines()[-1]))
  res.update(model=a.model, corpus=a.corpus, machine=platform.node(),
             cpu_count=os.cpu_count(), command="python " + " ".join(sys.argv))
  from vocabjax.io import atomic_write_text

  atomic_write_text(a.out, json.dumps(res, indent=2))
  print(json.dumps(res, indent=2))


if __name__ == "__main__":
  main()
