"""Where a trained DFlash drafter's block positions look in the target's context.

    python train/dflash/attention.py --config configs/train/dflash_qwen15b_chat_16k.yaml \
        [--drafter DIR] [--records 12] [--out FILE.json]

For held-out windows (the trainer's: the last `seq_len` tokens of a record, anchors every
`eval_stride`-th completion position), runs the drafter's layers as training does
(`models.dflash.training_forward`, copied here to keep each layer's attention weights) and
reports, per layer and block position, the attention mass on the context slots just before
the anchor (slot a-1 holds the target's features of the position whose next token is the
anchor), on the whole context, and on the block itself, averaged over heads and blocks. A
drafter that predicts position 1 the way an EAGLE head does puts its mass on slot a-1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from diagnose import load_run, run_parser  # (beside this script)
from vocabjax.io import atomic_write_json
from vocabjax.kernels.gather import take_rows
from vocabjax.lowering import lowering_of
from vocabjax.models.dflash import _kv, fuse_context
from vocabjax.models.llamalike import _proj, apply_rope, norm, rope_cos_sin
from vocabjax.train.dflash_step import empty_batch, put_record, valid_anchors


def attention_maps(params, embed, tokens, features, positions, anchors, config):
  """Per layer, the attention weights [B, n, heads, bs, T + bs] of each block (context slots
  then the block), as `training_forward` computes them (DFlash, no sliding layers)."""
  c, lw = config.layer, lowering_of(params)
  B, T = tokens.shape
  n, bs = anchors.shape[1], config.block_size
  ctx = fuse_context(params, features, config)
  cos_c, sin_c = rope_cos_sin(positions, c)
  anchor_tok = jnp.take_along_axis(tokens, anchors, axis=1)
  anchor_pos = jnp.take_along_axis(positions, anchors, axis=1)
  block = jnp.concatenate([anchor_tok[..., None],
                           jnp.full((B, n, bs - 1), config.mask_token_id, jnp.int32)], -1)
  x = take_rows(embed, block.reshape(B, n * bs)) * config.input_embedding_scale
  qpos = (anchor_pos[..., None] + jnp.arange(bs)).reshape(B, n * bs)
  cos, sin = rope_cos_sin(qpos, c)
  before = jnp.arange(T)[None, None, :] < anchors[..., None]
  low = jnp.finfo(jnp.float32).min
  maps = []
  for layer in params["layers"]:
    ck, cv = _kv(layer, ctx, lw, c, cos_c, sin_c)
    h = norm(x, layer["attn_norm"], c)
    q = _proj(h, layer, "wq", lw)
    q = apply_rope(norm(q.reshape(B, n * bs, c.num_heads, c.head_dim), layer["q_norm"], c),
                   cos, sin)
    k, v = _kv(layer, h, lw, c, cos, sin)
    qg = q.reshape(B, n, bs, c.num_kv_heads, c.num_groups, c.head_dim)
    kb, vb = (a.reshape(B, n, bs, c.num_kv_heads, c.head_dim) for a in (k, v))
    s_ctx = jnp.einsum("BJTNQe,BSNe->BJNQTS", qg, ck) / c.attn_divisor
    s_blk = jnp.einsum("BJTNQe,BJSNe->BJNQTS", qg, kb) / c.attn_divisor
    scores = jnp.concatenate([jnp.where(before[:, :, None, None, None], s_ctx, low), s_blk], -1)
    probs = jax.nn.softmax(scores, axis=-1)
    maps.append(probs.reshape(B, n, c.num_heads, bs, T + bs))
    attn = (jnp.einsum("BJNQTS,BSNe->BJTNQe", probs[..., :T], cv)
            + jnp.einsum("BJNQTS,BJSNe->BJTNQe", probs[..., T:], vb))
    x = x + _proj(attn.reshape(B, n * bs, c.q_dim), layer, "wo", lw)
    h = norm(x, layer["mlp_norm"], c)
    x = x + _proj(jax.nn.silu(_proj(h, layer, "w_gate", lw)) * _proj(h, layer, "w_up", lw),
                  layer, "w_down", lw)
  return maps


def main(argv=None) -> int:
  p = run_parser(__doc__)
  p.add_argument("--records", type=int, default=12)
  a = p.parse_args(argv)
  job, drafter, target, config, params, data, held_idx = load_run(a.config, a.drafter)
  recs = held_idx[:a.records]
  L, bs = len(params["layers"]), config.block_size
  sums = {k: np.zeros((L, bs)) for k in ("prev1", "prev2_4", "context", "block")}
  blocks = 0
  for r in recs:
    anchors = valid_anchors(data, r, job.seq_len)[::job.eval_stride][:job.anchors]
    if not len(anchors):
      continue
    b = empty_batch(data, 1, job.seq_len, len(anchors))
    put_record(b, data, 0, r, anchors)
    maps = attention_maps(params, target.params["embed"], jnp.asarray(b["tokens"]),
                          jnp.asarray(b["feats"], jnp.float32), jnp.asarray(b["positions"]),
                          jnp.asarray(b["anchors"]), config)
    T = b["tokens"].shape[1]
    for li, m in enumerate(maps):
      m = np.asarray(m)[0].mean(1)  # [n, bs, T + bs], heads averaged
      for j, anc in enumerate(anchors):
        sums["prev1"][li] += m[j, :, anc - 1] if anc >= 1 else 0
        sums["prev2_4"][li] += m[j, :, max(anc - 4, 0):max(anc - 1, 0)].sum(-1)
        sums["context"][li] += m[j, :, :T].sum(-1)
        sums["block"][li] += m[j, :, T:].sum(-1)
    blocks += len(anchors)
  out = {"drafter": str(drafter), "blocks": blocks,
         "mass": {k: (v / max(blocks, 1)).round(4).tolist() for k, v in sums.items()},
         "note": "mass[kind][layer][block position]: prev1 = the context slot before the "
                 "anchor, prev2_4 = the three before it, context = all, block = the block"}
  print(json.dumps(out, indent=1))
  if a.out:
    atomic_write_json(Path(a.out), out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
