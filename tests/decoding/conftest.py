"""Fixtures of the decoding tests: a random target of `CFG` (`target`), the hand-built lookup
pair an EAGLE head drafts for exactly (`lookup`). The model pairs (`pair`, `small_pair`) are
tests/conftest.py's."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.heads import LOOKUP, head_config, lookup_next
from tests.helpers.models import CFG
from vocabjax.models import init_params
from vocabjax.models.eagle import init_eagle
from vocabjax.testing.fixtures import lookup_model


@pytest.fixture(scope="module")
def target():
  """A random target of `CFG` (V = 64), weights of scale 0.3."""
  return init_params(jax.random.key(0), CFG, scale=0.3)


@pytest.fixture(scope="module")
def lookup():
  """A 1-layer target continuing t -> 5t + 3 (mod 16) whose layer-0 output is the one-hot
  embedding, and a head that knows it: fc maps f_p = onehot(x_p) to onehot(x_{p+1}) (so the
  target's own LM head on it predicts x_{p+2}) and its own LM head is the target's. It drafts
  depth 1 right and deeper levels wrong (it re-predicts x_{p+2}), so paths of n = 0 and 1 occur."""
  target = lookup_model(LOOKUP, lookup_next)
  hc = head_config(LOOKUP, layers=(0, 0))
  head = init_eagle(jax.random.key(5), hc, scale=0.02)
  P = np.zeros((16, 16), np.float32)
  for t in range(16):
    P[lookup_next(t), t] = 1.0
  head["fc"] = jnp.asarray(np.concatenate([P, np.zeros_like(P)], axis=1))
  head["lm_head"] = target["lm_head"]
  return target, hc, head
