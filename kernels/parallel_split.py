"""Where a parallel drafter's step goes on this CPU: the drafter's layers against its LM head
at every drafted position, for DFlash, DFlash 2 and P-EAGLE, over their full heads and with the
vocabulary methods (a static subset of the target's head as VocabTrim / FR-Spec keep, a
SpecVocab ranker's candidates), at the registry pair's target sizes.

Random weights of the registry target's real shapes (`vocabjax.checkpoints.known`: the
Qwen2.5-Coder-1.5B target, V = 151,936, D = 1,536; timing does not depend on weight values),
the drafters built at that width (DFlash: `--layers` drafter layers reading three target
layers, a block of `--block`; DFlash 2: the same with `speculators`' default convolutions
and selector; P-EAGLE: a one-layer EAGLE-3 head drafting `--block - 1` tokens per pass). Each
step's parts are compiled and timed alone by `vocabjax.decoding.profile.step_split` (median of
`--repeats` calls after a warm-up): the drafter's layers, its LM-head calls (the policy's rows
at every drafted position), and the target's verification of the block. DFlash 2's selector
(a top-k and a rank-R rescoring per position) is not in the split. A timing, not a test: the
figures are the host's, recorded with the command.

    python kernels/parallel_split.py --out kernels/results/parallel_split.md
"""

from __future__ import annotations

import argparse
import dataclasses
import time


def main(argv=None) -> int:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from vocabjax.checkpoints.known import resolve_config
  from vocabjax.decoding.dflash import DFlashProposer
  from vocabjax.decoding.peagle import PEagleProposer
  from vocabjax.decoding.profile import step_split
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.eval.provenance import cpu_model
  from vocabjax.io import atomic_write_text
  from vocabjax.models.dflash import DFlashConfig, init_dflash
  from vocabjax.models.eagle import default_feature_layers, init_eagle
  from vocabjax.models.identity import drafter_identity
  from vocabjax.models.llamalike import init_params
  from vocabjax.train.eagle_step import head_config
  from vocabjax.vocab.ranked import Ranker, SpeculativeVocab
  from vocabjax.vocab.subset import VocabSubset

  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--block", type=int, default=16, help="DFlash's block (P-EAGLE drafts one "
                  "fewer per pass, as many as DFlash)")
  ap.add_argument("--layers", type=int, default=1, help="DFlash drafter layers")
  ap.add_argument("--subset", type=int, default=32768, help="static subset rows")
  ap.add_argument("--k", type=int, default=2048, help="SpecVocab candidates per position")
  ap.add_argument("--rank", type=int, default=128, help="SpecVocab ranker rank")
  ap.add_argument("--head-vocab", type=int, default=32000, help="P-EAGLE's own rows (Vd)")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--out", required=True)
  a = ap.parse_args(argv)

  _, tc = resolve_config(a.target)
  print(f"[split] target {a.target}: D={tc.hidden_size} V={tc.vocab_size} "
        f"L={tc.num_layers}; random f32 weights", flush=True)
  tp = init_params(jax.random.key(0), tc, dtype=jnp.float32)
  L = tc.num_layers
  layers = default_feature_layers(L)
  dlayer = tc.replace(arch="qwen3", qk_norm=True, attention_bias=False, num_layers=a.layers,
                      layer_types=None, sliding_window=None)
  dc = DFlashConfig(layer=dlayer, target_hidden_size=tc.hidden_size, target_layer_ids=layers,
                    block_size=a.block, mask_token_id=0)
  dc2 = dataclasses.replace(dc, conv_kernel_size=2, conv_group_size=16, selector_rank=256,
                            selector_top_k=16)
  pc = dataclasses.replace(head_config(tc, layers, a.head_vocab), mask_token_id=0)
  rs = np.random.RandomState(0)
  ranker = Ranker(down=rs.randn(a.rank, tc.hidden_size).astype(np.float32) * 0.02,
                  vocab=rs.randn(tc.vocab_size, a.rank).astype(np.float32) * 0.02,
                  drafter=drafter_identity(tp, tc), meta={"init": "random (timing)"})

  def vocab(kind):
    if kind == "subset":
      return VocabSubset(np.arange(a.subset), tc.vocab_size, meta=(("ids", "timing"),))
    if kind == "ranker":
      return SpeculativeVocab(ranker, a.k)
    return None

  dp = init_dflash(jax.random.key(1), dc)
  dp2 = init_dflash(jax.random.key(2), dc2)
  pp = init_eagle(jax.random.key(3), pc)
  pp["d2t"] = jnp.zeros((a.head_vocab,), jnp.int32)
  G = a.block - 1
  cases = [
      ("dflash", "full head", lambda v: DFlashProposer(tp, tc, dp, dc, draft_vocab=v), None),
      ("dflash", f"subset {a.subset}", lambda v: DFlashProposer(tp, tc, dp, dc, draft_vocab=v),
       "subset"),
      ("dflash", f"SpecVocab k={a.k}", lambda v: DFlashProposer(tp, tc, dp, dc, draft_vocab=v),
       "ranker"),
      ("dflash2", "full head", lambda v: DFlashProposer(tp, tc, dp2, dc2, draft_vocab=v), None),
      ("dflash2", f"subset {a.subset}",
       lambda v: DFlashProposer(tp, tc, dp2, dc2, draft_vocab=v), "subset"),
      ("peagle", f"own head Vd={a.head_vocab}",
       lambda v: PEagleProposer(tp, tc, pp, pc, drafts=G), None),
      ("peagle", "target head (full)",
       lambda v: PEagleProposer(tp, tc, pp, pc, drafts=G, lm_head="target"), None),
      ("peagle", f"target head, subset {a.subset}",
       lambda v: PEagleProposer(tp, tc, pp, pc, drafts=G, lm_head="target", draft_vocab=v),
       "subset"),
  ]
  rows = []
  for method, head, make, kind in cases:
    t0 = time.perf_counter()
    dec = SpeculativeEngine(tp, tc, make(vocab(kind)))
    s = step_split(dec, batch_size=1, max_len=512, repeats=a.repeats)
    share = s.drafter_head_s / max(s.drafter_s + s.drafter_head_s, 1e-12)
    rows.append((method, head, dec.draft_head_rows, s.drafter_s * 1e3, s.drafter_head_s * 1e3,
                 share, s.verification_s * 1e3, s.target_step_s * 1e3))
    print(f"[split] {method:8s} {head:28s} layers {s.drafter_s * 1e3:8.1f} ms  head "
          f"{s.drafter_head_s * 1e3:8.1f} ms ({share:.0%})  verify "
          f"{s.verification_s * 1e3:8.1f} ms  ({time.perf_counter() - t0:.0f} s)", flush=True)
    del dec

  command = (f"Command: `python kernels/parallel_split.py --out {a.out}` (defaults: "
             f"--block {a.block} --layers {a.layers} --subset {a.subset} --k {a.k} --rank "
             f"{a.rank} --head-vocab {a.head_vocab} --repeats {a.repeats}).")
  setting = (f"Host: {cpu_model()}, {jax.device_count()} JAX CPU device(s); jax "
             f"{jax.__version__}. Target {a.target} (D {tc.hidden_size}, V {tc.vocab_size}, {L} "
             f"layers), f32; drafters at the target's width reading layers {list(layers)}; {G} "
             f"drafts per step (a block of {a.block}); batch 1, 256 committed tokens. Each part "
             f"compiled and timed alone (`vocabjax.decoding.profile.step_split`, median of "
             f"{a.repeats}); DFlash 2's selector is not in the split.")
  header = ("| drafter | LM head | rows per position | layers ms | LM head ms | head share of "
            "drafting | verification ms | one target step ms |")
  lines = ["# Parallel drafters' step split on this CPU (random weights, registry target sizes)",
           "", command, "", setting, "", header, "|---|---|---|---|---|---|---|---|"]
  for m, h, r, d, hd, sh, v, t in rows:
    lines.append(f"| {m} | {h} | {r:,} | {d:.1f} | {hd:.1f} | {sh:.0%} | {v:.1f} | {t:.1f} |")
  atomic_write_text(a.out, "\n".join(lines) + "\n")
  print(f"[split] wrote {a.out}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
