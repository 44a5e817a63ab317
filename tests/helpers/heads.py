"""Heads for the tests: random EAGLE-3 heads for a target (`random_head`), EAGLE-1/2 heads
(`eagle2_config`, `eagle2_params`), Medusa heads (`heads_for`, `SPARSE`), and the hand-built
lookup pair's sizes (`LOOKUP`, `lookup_next`, `head_config`)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.models import LlamaLikeConfig
from vocabjax.models.eagle import EagleConfig, init_eagle
from vocabjax.models.llamalike import FINAL_NORMED, lm_head_weight
from vocabjax.models.medusa import MedusaConfig, init_medusa


def random_head(target_params, target: LlamaLikeConfig, Vd=None, seed=3, layers=(0, 1)):
  hc = head_config(target, Vd, layers)
  p = init_eagle(jax.random.key(seed), hc, scale=0.3)
  V = target.vocab_size
  ids = np.sort(np.random.RandomState(seed).choice(V, hc.draft_vocab_size, replace=False))
  p["d2t"] = jnp.asarray(ids - np.arange(len(ids)), jnp.int32)
  # the target's rows of its own LM head: a head that drafts something the target may accept
  U = target_params.get("lm_head", target_params["embed"])
  p["lm_head"] = jnp.asarray(U)[ids] + 0.1 * p["lm_head"]
  return hc, p


LOOKUP = LlamaLikeConfig(arch="llama", vocab_size=16, hidden_size=16, intermediate_size=8,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4,
                         max_position_embeddings=1024)


def eagle2_config(target, **changes) -> EagleConfig:
  layer = dataclasses.replace(target, arch="llama", num_layers=1, tie_word_embeddings=False,
                              **changes)
  return EagleConfig(layer=layer, target_hidden_size=target.hidden_size,
                     feature_layers=(FINAL_NORMED,), draft_vocab_size=target.vocab_size,
                     kind="eagle2")


def eagle2_params(hc: EagleConfig, seed: int = 0, bias: bool = True) -> dict:
  p = init_eagle(jax.random.key(seed), hc, scale=0.3)
  rs = np.random.RandomState(seed)
  p["layer"]["mlp_norm"] = jnp.asarray(1 + 0.1 * rs.randn(hc.hidden_size), jnp.float32)
  if bias:
    p["input_fc_bias"] = jnp.asarray(0.1 * rs.randn(hc.hidden_size), jnp.float32)
  if hc.layer.attention_bias:
    for k, n in (("bq", hc.layer.q_dim), ("bk", hc.layer.kv_dim), ("bv", hc.layer.kv_dim)):
      p["layer"][k] = jnp.asarray(0.1 * rs.randn(n), jnp.float32)
  return p


SPARSE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def heads_for(target, config, num_heads=3, num_layers=1, shared=False, seed=1):
  mc = MedusaConfig(num_heads=num_heads, hidden_size=config.hidden_size,
                    vocab_size=config.vocab_size, num_layers=num_layers, shared_lm_head=shared)
  p = init_medusa(jax.random.key(seed), mc, None if shared else lm_head_weight(target, config))
  rs = np.random.RandomState(seed)
  for head in p["heads"]:  # not the zero initial blocks: heads that differ from each other
    head["w"] = jnp.asarray(rs.randn(*head["w"].shape) * 0.3, jnp.float32)
  return p, mc


def head_config(target: LlamaLikeConfig, draft_vocab_size=None, layers=(0, 1)):
  layer = LlamaLikeConfig(arch="llama", vocab_size=target.vocab_size,
                          hidden_size=target.hidden_size, intermediate_size=24, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=8)
  return EagleConfig(layer=layer, target_hidden_size=target.hidden_size, feature_layers=layers,
                     draft_vocab_size=draft_vocab_size or target.vocab_size)


def lookup_next(t):
  return (5 * t + 3) % 16
