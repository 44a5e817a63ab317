"""The EAGLE head's training step in f32 and in mixed precision (`compute_dtype: bfloat16`):
seconds per step on this machine (interleaved, best of `--repeats`) and how far the mixed
precision loss and gradients are from the f32 ones, at a training config's shapes.

The target is loaded only for its sizes: the head, the embedding and the batch are random (a
step's cost depends only on the shapes). Run it on an idle machine (2-core CPU:
~2 minutes):

    python train/eagle_train_step.py --config configs/train/eagle_qwen15b_chat_all.yaml \
        --out eval/results/eagle/train_step.md
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np


def main(argv=None) -> int:
  import yaml

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.eval.provenance import cpu_model
  from vocabjax.io import atomic_write_text
  from vocabjax.kernels import cpu_matmul
  from vocabjax.lowering import Lowering
  from vocabjax.models.eagle import default_feature_layers, init_eagle
  from vocabjax.train.eagle_step import head_config, ttt_loss
  from vocabjax.train.eagle import job_from_dict
  from vocabjax.train.loop import TrainState, apply_grads, make_optimizer

  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config", required=True, help="a train.eagle YAML job")
  ap.add_argument("--out", required=True, help="markdown report")
  ap.add_argument("--repeats", type=int, default=3)
  a = ap.parse_args(argv)
  with open(a.config) as f:
    job = job_from_dict(yaml.safe_load(f))
  tc = load_model(job.target, progress=False).config  # the weights go at once
  layers = tuple(job.feature_layers or default_feature_layers(tc.num_layers))
  Vd = job.draft_vocab_size or tc.vocab_size
  hc = head_config(tc, layers, Vd, job.intermediate_size)
  rng = np.random.default_rng(0)
  params = init_eagle(jax.random.key(0), hc)
  params["lm_head"] = jnp.asarray(rng.standard_normal((Vd, tc.hidden_size)) * 0.02, jnp.float32)
  d2t = params.pop("d2t")
  embed = jnp.asarray(rng.standard_normal((tc.vocab_size, tc.hidden_size)) * 0.02, jnp.float32)
  B, T = job.batch_size, job.seq_len
  batch = {"tokens": jnp.asarray(rng.integers(0, tc.vocab_size, (B, T)), jnp.int32),
           "feats": jnp.asarray(rng.standard_normal((B, T, hc.fused_width)), jnp.float16),
           "dlabel": jnp.asarray(rng.integers(0, Vd, (B, T)), jnp.int32),
           "weight": jnp.ones((B, T), jnp.float32)}
  opt = make_optimizer(job.optim)
  state = TrainState.create(params, opt, {"d2t": d2t})

  def loss_fn(p, embed, lowering):
    return ttt_loss(p, {"embed": embed, "d2t": d2t}, batch, config=hc, steps=job.ttt_steps,
                    decay=job.step_decay, block=job.vocab_block, lowering=lowering)

  fns, grads = {}, {}
  for dtype in ("float32", "bfloat16"):
    lw = Lowering(bf16_dots=dtype == "bfloat16")  # the trainer's mixed precision, or f32
    grad = jax.jit(jax.value_and_grad(lambda p, e, lw=lw: loss_fn(p, e, lw), has_aux=True))
    step = jax.jit(lambda st, embed, g=grad: apply_grads(st, g(st.params, embed)[1], opt))
    (loss, ces), g = grad(params, embed)
    jax.block_until_ready(step(state, embed))
    fns[dtype] = step
    grads[dtype] = (float(loss), np.asarray(ces), g)
  times = {d: [] for d in fns}
  for _ in range(a.repeats):  # interleaved
    for d, fn in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(state, embed))
      times[d].append(time.perf_counter() - t0)

  # the LM head's product alone, [B*T, D] x [D, Vd]: XLA's f32 GEMM against its bf16 one
  xa = jnp.asarray(rng.standard_normal((B * T, tc.hidden_size)), jnp.float32)
  gemm = {"float32": jax.jit(lambda x, w: jnp.einsum("XD,VD->XV", x, w)),
          "bfloat16": jax.jit(lambda x, w: cpu_matmul.bf16_dot(x, w))}
  gemm_t = {d: [] for d in gemm}
  for d, fn in gemm.items():
    jax.block_until_ready(fn(xa, params["lm_head"]))
  for _ in range(a.repeats):
    for d, fn in gemm.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(xa, params["lm_head"]))
      gemm_t[d].append(time.perf_counter() - t0)
  flops = 2 * B * T * tc.hidden_size * Vd

  flat = {d: jax.tree.leaves_with_path(grads[d][2]) for d in grads}
  lines = ["# The EAGLE head's training step: f32 against mixed precision (bf16 products)", "",
           f"Command: `python train/eagle_train_step.py --config {a.config} --out {a.out}` "
           f"(best of {a.repeats}, interleaved)", "",
           f"Machine: {cpu_model()}, {os.cpu_count()} cores, jax {jax.__version__}", "",
           f"Shapes: batch {B} x {T} tokens, {job.ttt_steps} TTT steps, head width "
           f"{hc.hidden_size}, MLP {hc.layer.intermediate_size}, head vocabulary {Vd}, fused "
           f"features {hc.fused_width}; random head, embedding and batch.", "",
           "| compute | s per step (best) | all runs | loss |", "|---|---|---|---|"]
  for d in fns:
    lines.append(f"| {d} | {min(times[d]):.2f} | {', '.join(f'{t:.2f}' for t in times[d])} | "
                 f"{grads[d][0]:.4f} |")
  lines += ["", f"Speedup of the step: {min(times['float32']) / min(times['bfloat16']):.2f}x.",
            "", f"The LM head's product alone, [{B * T}, {tc.hidden_size}] x "
            f"[{tc.hidden_size}, {Vd}] (XLA's dot; best of {a.repeats}):", "",
            "| operands | ms | GFLOP/s |", "|---|---|---|"]
  for d in gemm:
    lines.append(f"| {d} | {min(gemm_t[d]) * 1e3:.1f} | {flops / min(gemm_t[d]) / 1e9:.0f} |")
  lines += ["", "Mixed precision against f32: relative error of each gradient "
            "(||g_bf16 - g_f32|| / ||g_f32||) and of the per-step cross-entropies:", "",
            "| tensor | shape | relative error |", "|---|---|---|"]
  for (path, g32), (_, g16) in zip(flat["float32"], flat["bfloat16"]):
    g32, g16 = np.asarray(g32, np.float64), np.asarray(g16, np.float64)
    err = np.linalg.norm(g16 - g32) / max(np.linalg.norm(g32), 1e-30)
    lines.append(f"| {jax.tree_util.keystr(path)} | {list(g32.shape)} | {err:.2e} |")
  ce32, ce16 = grads["float32"][1], grads["bfloat16"][1]
  lines.append(f"| CE per step | {list(ce32.shape)} | "
               f"{np.max(np.abs(ce16 - ce32) / np.abs(ce32)):.2e} (max) |")
  text = "\n".join(lines) + "\n"
  atomic_write_text(a.out, text)
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
