"""Peak host memory of loading a model onto a mesh of 8 virtual CPU devices, against the model's
size: `load_model(path, mesh=mesh)` (each tensor placed with its sharding as it is read) and the
old way, `load_model(path)` onto one device then `shard_params` (what the decoders did with it).

    python kernels/mesh_load_memory.py --out kernels/results/mesh_load

Writes a random Llama-style checkpoint (safetensors, f32; `--hidden`, `--layers`, `--vocab`) to a
temporary directory once, then loads it in a fresh process per way (peak RSS from getrusage of
that process, its RSS before loading subtracted: JAX and the devices' own memory). On CPU
devices the placed weights live in host memory too, so "after" includes the model itself; what
the loader adds is peak - after (transient: the host copies of tensors not yet placed)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, threading, time
import jax
from vocabjax import sharding
from vocabjax.checkpoints.loader import load_model

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) / 1024
    return out

peak = {"RssAnon": 0.0, "VmRSS": 0.0}
done = threading.Event()

def sample():  # every 2 ms: the peak of anonymous memory (not the page cache of mapped files)
    while not done.is_set():
        s = status()
        for k in peak:
            peak[k] = max(peak[k], s[k])
        time.sleep(0.002)

path, way = sys.argv[1], sys.argv[2]
mesh = sharding.make_mesh(data=1, model=8)
jax.numpy.zeros(8).block_until_ready()
before = status()
threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
if way == "mesh":
    m = load_model(path, dtype="float32", mesh=mesh, load_tokenizer=False)
    params = m.params
else:
    m = load_model(path, dtype="float32", load_tokenizer=False)
    params = sharding.shard_params(m.params, m.config, mesh)
    del m
jax.block_until_ready(params)
wall = time.perf_counter() - t0
time.sleep(0.05)
done.set()
after = status()
leaves = jax.tree.leaves(params)
print(json.dumps({"way": way, "before": before, "after": after, "peak": peak, "wall_s": wall,
                  "model_mb": sum(x.nbytes for x in leaves) / 2**20,
                  "placed_mb": sum(s.data.nbytes for x in leaves for s in x.addressable_shards)
                  / 2**20,
                  "largest_tensor_mb": max(x.nbytes for x in leaves) / 2**20}))
"""


def write_model(d: Path, hidden: int, layers: int, vocab: int) -> None:
  from vocabjax.testing.tiny import tiny_hf_model

  m = tiny_hf_model("llama", seed=0, vocab_size=vocab, hidden_size=hidden,
                    intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                    num_attention_heads=hidden // 64, num_key_value_heads=8,  # 8 | model axis
                    tie_word_embeddings=False)
  m.save_pretrained(d, safe_serialization=True)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True)
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--layers", type=int, default=12)
  p.add_argument("--vocab", type=int, default=32000)
  a = p.parse_args(argv)
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    d = Path(tmp) / "model"
    write_model(d, a.hidden, a.layers, a.vocab)
    for way in ("mesh", "one-device-then-shard"):
      r = subprocess.run([sys.executable, "-c", CHILD, str(d), way], env=env,
                         capture_output=True, text=True, check=True)
      rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
      print(rows[-1], flush=True)
  cmd = "python kernels/mesh_load_memory.py " + " ".join(
      sys.argv[1:] if argv is None else argv)
  lines = ["# Peak host memory of a load onto 8 virtual CPU devices", "", f"`{cmd}`", "",
           f"Random Llama-style model: hidden {a.hidden}, {a.layers} layers, vocabulary "
           f"{a.vocab}, f32 safetensors. Anonymous memory (RssAnon: the process's own, not the "
           f"page cache of the mapped safetensors file), sampled every 2 ms; on CPU devices the "
           f"placed weights are host memory, so 'after' includes the placed model (replicated "
           f"leaves once per device: the norms).", "",
           "| way | model MB | placed on the 8 devices MB | largest tensor MB | anon before MB |"
           " anon after MB | anon peak MB | peak - after MB | VmRSS peak MB | wall s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    b, f, pk = r["before"]["RssAnon"], r["after"]["RssAnon"], r["peak"]["RssAnon"]
    lines.append(f"| {r['way']} | {r['model_mb']:.0f} | {r['placed_mb']:.0f} | "
                 f"{r['largest_tensor_mb']:.0f} | {b:.0f} |"
                 f" {f:.0f} | {pk:.0f} | {pk - f:.0f} | {r['peak']['VmRSS']:.0f} | "
                 f"{r['wall_s']:.1f} |")
  (out / "results.json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=1))
  (out / "README.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
