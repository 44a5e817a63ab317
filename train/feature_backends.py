"""EAGLE/Medusa training features by vocabjax (f32) and by transformers (bf16, f32): speed of
each backend on this machine, and how far the stored torch features are from vocabjax's f32 ones.

Speed: one [1, T] forward of the target with its feature layers and LM-head argmax (what a
feature shard costs per token), best of `--repeats` after a warm-up, per backend. Parity: the
first `--records` records of shard 0 of a feature directory recomputed by vocabjax in f32:
relative error of each fused layer and of the final hidden state, and label agreement.
Run it on an idle machine (2-core CPU: ~3 minutes):

    python train/feature_backends.py --target qwen2.5-coder-1.5b-instruct \
        --features train/eagle/features_mix --out train/eagle/qwen15b_mix/features.md
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


def main(argv=None) -> int:
  import torch

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.checkpoints.torch_model import load_torch_model
  from vocabjax.io import atomic_write_text
  from vocabjax.models.cache import KVCache
  from vocabjax.models.llamalike import forward_features, lm_head
  from vocabjax.train.eagle_data import target_features

  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--target", required=True)
  ap.add_argument("--features", required=True, help="a feature directory (train.eagle)")
  ap.add_argument("--out", required=True, help="markdown report")
  ap.add_argument("--T", type=int, default=512)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--records", type=int, default=4)
  a = ap.parse_args(argv)
  meta = json.loads((Path(a.features) / "meta.json").read_text())
  layers = tuple(meta["feature_layers"])
  t = load_model(a.target, dtype="float32", progress=False)
  lines = [f"# Feature backends for {Path(t.source).name}", "",
           f"Command: `python train/feature_backends.py --target {a.target} --features "
           f"{a.features} --out {a.out}` (T={a.T}, best of {a.repeats}; layers {list(layers)})",
           "", "| backend | dtype | s per forward | tokens/s |", "|---|---|---|---|"]

  def best(fn):
    fn()
    times = []
    for _ in range(a.repeats):
      t0 = time.perf_counter()
      fn()
      times.append(time.perf_counter() - t0)
    return min(times)

  x = np.ones((1, a.T), np.int32)
  run = jax.jit(lambda p, tok: target_features(p, tok, config=t.config, layers=layers))
  s = best(lambda: jax.block_until_ready(run(t.params, jnp.asarray(x))))
  lines.append(f"| vocabjax (XLA:CPU) | float32 | {s:.2f} | {a.T / s:.1f} |")
  print(lines[-1], flush=True)
  for dtype in ("bfloat16", "float32"):
    m = load_torch_model(a.target, dtype)
    with torch.inference_mode():
      s = best(lambda m=m: m(input_ids=torch.tensor(x, dtype=torch.long), output_hidden_states=True))
    lines.append(f"| transformers (torch {torch.__version__}) | {dtype} | {s:.2f} | "
                 f"{a.T / s:.1f} |")
    print(lines[-1], flush=True)
    del m

  z = np.load(Path(a.features) / "shard-00000.npz")
  off = z["seq_offsets"]
  lines += ["", f"Parity of the stored features ({meta.get('feature_backend', 'jax')} "
            f"{meta.get('feature_dtype', 'float32')}) with vocabjax's f32 forward, first "
            f"{a.records} records of shard 0:", "",
            "| record | tokens | rel. error per layer | final hidden rel. error | label agreement |",
            "|---|---|---|---|---|"]
  for j in range(min(a.records, len(z["seq_record"]))):
    rec = int(z["seq_record"][j])
    toks = z["seq_tokens"][off[j]:off[j + 1]]
    T = len(toks)
    h, _, f = forward_features(t.params, jnp.asarray(toks)[None], jnp.arange(T)[None],
                               KVCache.init(t.config, 1, T), config=t.config, layers=layers)
    lab = np.asarray(jnp.argmax(lm_head(t.params, h[0], config=t.config), -1))
    rows = z["record"] == rec
    F, f = z["feats"][rows].astype(np.float32), np.asarray(f[0])
    D = t.config.hidden_size
    errs = [np.linalg.norm(F[:, i * D:(i + 1) * D] - f[:, i * D:(i + 1) * D])
            / np.linalg.norm(f[:, i * D:(i + 1) * D]) for i in range(len(layers))]
    hid = "-"
    if "hidden" in z:
      H, h0 = z["hidden"][rows].astype(np.float32), np.asarray(h[0])
      hid = f"{np.linalg.norm(H - h0) / np.linalg.norm(h0):.4f}"
    agree = float((z["label"][rows] == lab).mean())
    lines.append(f"| {rec} | {T} | {', '.join(f'{e:.4f}' for e in errs)} | {hid} | "
                 f"{agree:.3f} |")
    print(lines[-1], flush=True)
  atomic_write_text(a.out, "\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
