"""Hand-checkable draft/target pairs built directly as params (no torch needed).

`successor_pair`: a target that always continues t -> t + 1 (mod V) and a drafter that does the
same except after tokens divisible by `skip` (t -> t + 2). Attention and MLP outputs are zeroed
(wo = 0, w_down = 0), so the hidden state is the normed one-hot embedding of the current token
and the LM head is a lookup table: acceptance can be worked out by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vocabjax.models.config import LlamaLikeConfig
from vocabjax.models.llamalike import init_params


def lookup_model(config: LlamaLikeConfig, next_token, scale: float = 10.0) -> dict:
  V = config.vocab_size
  params = init_params(jax.random.key(0), config)
  params["embed"] = jnp.eye(V, config.hidden_size, dtype=jnp.float32)
  head = np.zeros((V, config.hidden_size), np.float32)
  for t in range(V):
    head[next_token(t) % V, t] += scale
  params["lm_head"] = jnp.asarray(head)
  for layer in params["layers"]:
    layer["wo"] = jnp.zeros_like(layer["wo"])
    layer["w_down"] = jnp.zeros_like(layer["w_down"])
  return params


def successor_pair(vocab_size: int = 12, skip: int = 3):
  """(config, target_params, draft_params) of the successor fixture; skip=0: drafter = target."""
  config = LlamaLikeConfig(arch="llama", vocab_size=vocab_size, hidden_size=vocab_size,
                           intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                           head_dim=4, max_position_embeddings=1024)
  target = lookup_model(config, lambda t: t + 1)
  draft = lookup_model(config, lambda t: t + 2 if skip and t % skip == 0 else t + 1)
  return config, target, draft
