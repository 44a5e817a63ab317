"""Shared by the DFlash reference tests: reference drafters' random weights, and greedy drafts
of a block's hidden states on both sides."""

import jax.numpy as jnp
import numpy as np
import torch

from vocabjax.decoding.dflash import select_drafts
from vocabjax.sampling import SamplingParams
from vocabjax.vocab.policy import to_target


def randomize(model, scale, seed):
  """Weights of order `scale` (norms near 1, DFlash 2's base kernels near the identity):
  logits far from ties, so greedy choices are the same on both sides."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if name.endswith("norm.weight"):
        p.copy_(1 + 0.1 * noise)
      elif name.endswith("base_kernel"):
        p.copy_(0.2 * noise)
        p[:, 0] += 1
      else:
        p.copy_(scale * noise)
  return model.eval()


def ref_drafts(ref, draft, h, anchor, head):
  """The reference's greedy drafts of a block's final hidden states h [1, G, D]."""
  with torch.no_grad():
    if isinstance(draft, ref.DFlash2DraftModel):
      return draft.propose(h, torch.tensor([anchor]), head, 0.0)[0][0].tolist()
    return torch.argmax(draft.compute_logits(h, head), dim=-1)[0].tolist()


def our_drafts(proposer, h, anchor):
  """vocabjax's greedy drafts of h [1, G, D]: the selector's for DFlash 2, else the argmax (of
  the policy's rows, mapped to target ids)."""
  if proposer.selector:
    tok, _ = select_drafts(proposer.policy, proposer.params, h, jnp.asarray([anchor]), None,
                           SamplingParams(), config=proposer.config,
                           vocab_size=proposer.head_vocab_config.vocab_size)
    return np.asarray(tok)[0].tolist()
  ids, logits = proposer.policy(proposer.params, h[0])
  return np.asarray(to_target(ids, jnp.argmax(logits, axis=-1))).tolist()
