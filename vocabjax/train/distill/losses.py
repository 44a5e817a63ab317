"""The distillation losses: L_DM (reverse KL on direct-mapped tokens), L_ngram (NLL of the
n-gram sub-tokens) and the acceptance head's weighted BCE (see the package doc)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vocabjax.decoding.adaptive import acceptance_logit
from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import lm_head_weight
from vocabjax.train.features import sequence_hidden


def masked_mean(x, mask):
  m = mask.astype(jnp.float32)
  return (x * m).sum() / jnp.maximum(m.sum(), 1.0)


def distill_terms(dparams, batch, frozen, *, config: LlamaLikeConfig):
  """(L_DM, L_ngram, drafter hidden at direct positions [Kd, Dd], log q_I [Kd, I],
  log p_I [Kd, I]) of one batch (module doc). `frozen` holds the intersection rows of both LM
  heads: "int_d" / "int_t" [I] the paired ids, "wt_I" [I, Dt] the target's rows."""
  h = sequence_hidden(dparams, batch["tokens"], config=config)[0]  # [Ld, Dd]
  hd = h[batch["dm_pos"]]
  wd_I = lm_head_weight(dparams, config)[frozen["int_d"]]  # the drafter's current head rows
  log_q = jax.nn.log_softmax((hd @ wd_I.T).astype(jnp.float32), -1)
  ht = batch["hidden"][batch["dm_row"]]
  log_p = jax.nn.log_softmax((ht @ frozen["wt_I"].T).astype(jnp.float32), -1)
  rkl = (jnp.exp(log_q) * (log_q - log_p)).sum(-1)
  l_dm = masked_mean(rkl, batch["dm_mask"])
  hn = h[batch["ng_pos"]]
  logits = (hn @ lm_head_weight(dparams, config).T).astype(jnp.float32)
  nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
      logits, batch["ng_label"][:, None], -1)[:, 0]
  l_ng = masked_mean(nll, batch["ng_mask"])
  return l_dm, l_ng, hd, log_q, log_p


def acceptance_terms(head, dparams, hd, log_q, batch, frozen, *, label: str, weight: float,
                     config: LlamaLikeConfig):
  """(weighted BCE, accuracy of a > 0.5 against y > 0.5, mean label) at the direct positions."""
  x = jnp.argmax(log_q, -1)  # the drafter's greedy proposal, as an intersection index
  e = dparams["embed"][frozen["int_d"][x]]
  z = acceptance_logit(head, hd, e)
  ht = batch["hidden"][batch["dm_row"]]
  t = frozen["int_t"][x]
  logit_t = (ht * frozen["wt_full"][t]).sum(-1)
  log_p_x = logit_t - batch["lse"][batch["dm_row"]]
  if label == "ratio":
    y = jnp.minimum(1.0, jnp.exp(log_p_x - jnp.take_along_axis(log_q, x[:, None], -1)[:, 0]))
  else:
    y = (t == batch["argmax"][batch["dm_row"]]).astype(jnp.float32)
  y = jax.lax.stop_gradient(y)
  bce = -(y * jax.nn.log_sigmoid(z) + weight * (1 - y) * jax.nn.log_sigmoid(-z))
  m = batch["dm_mask"]
  acc = masked_mean(((z > 0) == (y > 0.5)).astype(jnp.float32), m)
  return masked_mean(bce, m), acc, masked_mean(y, m)
