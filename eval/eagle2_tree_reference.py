"""EAGLE-2's dynamic draft tree: vocabjax's against the EAGLE authors' own `topK_genrate`
(`eagle/model/cnets1.py` of github.com/SafeAILab/EAGLE, which is not on PyPI: its release
`eagle-llm` is EAGLE-1's code), on the same random EAGLE-1/2 head and tiny target.

    python eval/eagle2_tree_reference.py --eagle-src /path/to/EAGLE --out DIR

`--eagle-src`: a checkout of the EAGLE repository (its `eagle/` package is imported from there;
nothing of it is copied into this project). For each of several prompts and tree settings, both
sides draft from the same context: the target's final normed hidden states as the features, its
greedy next token as the root. EAGLE's settings translate as its own code counts them: its
`total_tokens` includes the root (vocabjax's excludes it) and its `depth` counts the expansions
after the root's children (vocabjax's counts the levels below the root), so EAGLE's
(total_token=T, depth=d, top_k=k) is vocabjax's TreeParams(top_k=k, depth=d + 1,
total_tokens=T - 1). A tree is compared as the set of its root-to-node token paths (the two
order their nodes alike, but the comparison need not rely on it); the greedy accepted length is
then the same on both sides by construction (the same target verifies the same tree).

Writes results.json and README.md into --out."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

SETTINGS = [  # EAGLE's (total_token, depth, top_k)
    (10, 2, 3), (16, 3, 4), (24, 5, 4), (60, 5, 10)]


def _paths_ref(draft_tokens, tree_mask):
  """{root-to-node token path} of EAGLE's tree (draft_tokens [1, N + 1], tree_mask
  [1, 1, N + 1, N + 1] float: node i sees its ancestors)."""
  toks = draft_tokens[0].tolist()
  m = tree_mask[0, 0].numpy() > 0
  return {tuple(toks[j] for j in np.flatnonzero(m[i])) for i in range(1, len(toks))}


def _paths_ours(root, tok, parent):
  out = set()
  for j in range(len(tok)):
    path, p = [tok[j]], parent[j]
    while p:
      path.append(tok[p - 1])
      p = parent[p - 1]
    out.add(tuple([root] + path[::-1]))
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--eagle-src", required=True, help="a checkout of SafeAILab/EAGLE")
  p.add_argument("--out", required=True)
  p.add_argument("--prompts", type=int, default=6)
  p.add_argument("--scale", type=float, default=0.1,
                 help="the random head's weight scale (larger: more peaked drafting "
                      "distributions, up to probability 1 in float32)")
  a = p.parse_args(argv)
  sys.path.insert(0, str(Path(a.eagle_src).resolve()))
  import jax
  import jax.numpy as jnp
  import torch

  from eagle.model import cnets1  # the reference (EAGLE-2)
  from vocabjax.checkpoints.eagle2 import load_eagle2, save_eagle2
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding.eagle import EagleProposer, EagleState, _eagle_prefill, _grow, _head_root
  from vocabjax.decoding.speculative import SpeculativeEngine
  from vocabjax.decoding.tree import TreeParams
  from vocabjax.models.cache import KVCache
  from vocabjax.models.eagle import EagleConfig, init_eagle
  from vocabjax.models.llamalike import FINAL_NORMED, lm_head_weight
  from vocabjax.sampling import SamplingParams
  from vocabjax.testing import references
  from vocabjax.testing.tiny import tiny_hf_model

  torch.set_num_threads(1)
  tmp = Path(tempfile.mkdtemp())
  tiny_hf_model("llama", seed=2, vocab_size=320, num_hidden_layers=3).save_pretrained(
      tmp / "target")
  target = load_model(tmp / "target", dtype="float32", load_tokenizer=False)
  layer = dataclasses.replace(target.config, num_layers=1, tie_word_embeddings=False)
  hc = EagleConfig(layer=layer, target_hidden_size=layer.hidden_size,
                   feature_layers=(FINAL_NORMED,), draft_vocab_size=layer.vocab_size,
                   kind="eagle2")
  params = init_eagle(jax.random.key(3), hc, scale=a.scale)
  params["input_fc_bias"] = jnp.asarray(np.random.RandomState(3).randn(layer.hidden_size) * 0.1,
                                        jnp.float32)
  head_dir = save_eagle2(params, hc, tmp / "head", pickled=True, embed=target.params["embed"])
  import os

  os.environ["VOCABJAX_ALLOW_BIN"] = "1"
  hc, params, _ = load_eagle2(head_dir, target_config=target.config,
                              target_params=target.params)
  raw = json.loads((head_dir / "config.json").read_text())
  U = torch.from_numpy(np.asarray(lm_head_weight(target.params, target.config), np.float32))
  lm = torch.nn.Linear(U.shape[1], U.shape[0], bias=False)
  lm.weight.data[:] = U
  rs = np.random.RandomState(0)
  prompts = [rs.randint(3, 320, size=rs.randint(6, 20)).tolist() for _ in range(a.prompts)]
  rows = []
  for total, depth, k in SETTINGS:
    ref = cnets1.Model(references.eagle1_config(raw), bias=True, total_tokens=total, depth=depth,
                       top_k=k).eval()
    state = torch.load(head_dir / "pytorch_model.bin", weights_only=True)
    ref.load_state_dict(state, strict=True)
    ref.init_tree()
    tree = TreeParams(top_k=k, depth=depth + 1, total_tokens=total - 1)
    dec = SpeculativeEngine(
        target.params, target.config,
        EagleProposer(target.params, target.config, params, hc, tree=tree, lm_head="target"))
    same = broken = ties = 0
    for ids in prompts:
      T = len(ids)
      S = T + 4 * tree.total_tokens + 64
      first, tcache, hcache, feat = _eagle_prefill(
          dec.target_params, dec.proposer_params, jnp.asarray([ids]), jnp.asarray([T]),
          KVCache.init(target.config, 1, S), KVCache.init(hc.layer, 1, S), jax.random.key(0),
          target_config=dec.target_config, head_config=hc, sampling=SamplingParams(temperature=0.0))
      st = EagleState(target_cache=tcache, head_cache=hcache, last=first,
                      pend_tokens=first[:, None].astype(jnp.int32), pend_feats=feat[:, None],
                      pend_count=jnp.ones((1,), jnp.int32))
      x_root, cache = _head_root(dec.proposer_params, st, head_config=hc)
      tok, parent, _, _ = _grow(dec.proposer_params, x_root, cache, head_config=hc, tree=tree,
                                policy=dec.draft_policy)
      root = int(first[0])
      ours = _paths_ours(root, np.asarray(tok[0]).tolist(), np.asarray(parent[0]).tolist())
      # the reference: the same features (the target's final normed hidden states, f_0 ..
      # f_{T-1}) and tokens (x_0 .. x_{T-1}, the root), as EAGLE's generate passes them
      from vocabjax.models.llamalike import forward

      h, _ = forward(target.params, jnp.asarray([ids]), jnp.arange(T)[None],
                     KVCache.init(target.config, 1, T + 1), config=target.config)
      ref.reset_kv()
      with torch.no_grad():
        draft_tokens, _, tree_mask, _ = ref.topK_genrate(
            torch.from_numpy(np.asarray(h, np.float32)), torch.tensor([ids + [root]]), lm, None)
      theirs = _paths_ref(draft_tokens, tree_mask)
      same += ours == theirs
      if ours != theirs:
        # a path longer than the tree's levels + the root: EAGLE's own tree is inconsistent (a
        # node selected without its parent gets another node's ancestors from searchsorted)
        broken += max(map(len, theirs)) > tree.depth + 1
        # a node whose drafted log-probability is 0 (probability 1 in float32) ties its parent
        ties += any(len(t) > 1 and t[-1] == t[-2] for t in theirs | ours)
        print(f"differs: total={total} depth={depth} k={k} prompt={ids}: "
              f"{len(ours - theirs)} paths only ours, {len(theirs - ours)} only theirs")
    rows.append({"eagle": {"total_token": total, "depth": depth, "top_k": k},
                 "vocabjax": dataclasses.asdict(tree), "prompts": len(prompts),
                 "identical_trees": same, "eagle_tree_inconsistent": broken,
                 "differing_with_a_repeated_token": ties})
    print(rows[-1], flush=True)
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  cmd = "python eval/eagle2_tree_reference.py " + " ".join(
      sys.argv[1:] if argv is None else argv)
  (out / "results.json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=1))
  lines = ["# EAGLE-2's dynamic tree: vocabjax against EAGLE's own topK_genrate", "", f"`{cmd}`",
           "", "A random EAGLE-1/2 head (the authors' layout, weight scale "
           f"{a.scale}) on a random 3-layer Llama-style target (V = 320, D = 64), float32 on the "
           f"CPU; per setting, the trees of {a.prompts} random prompts, compared as sets of "
           "root-to-node token paths. Of the differing trees: how many of EAGLE's are "
           "inconsistent (a path longer than the tree has levels), and how many hold a token "
           "drafted twice in a row (a probability-1 draft, whose log-probability 0 ties it with "
           "its parent).", "",
           "| EAGLE (total_token, depth, top_k) | vocabjax (total_tokens, depth, top_k) | "
           "identical trees | EAGLE's inconsistent | with a repeated token |",
           "|---|---|---|---|---|"]
  for r in rows:
    e, v = r["eagle"], r["vocabjax"]
    lines.append(f"| {e['total_token']}, {e['depth']}, {e['top_k']} | {v['total_tokens']}, "
                 f"{v['depth']}, {v['top_k']} | {r['identical_trees']} of {r['prompts']} | "
                 f"{r['eagle_tree_inconsistent']} | {r['differing_with_a_repeated_token']} |")
  (out / "README.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
