"""Model pairs shared by the speculative-decoding tests."""

import jax
import pytest

from vocabjax.models import LlamaLikeConfig, init_params

CFG = LlamaLikeConfig(arch="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True)
SMALL = LlamaLikeConfig(arch="llama", vocab_size=8, hidden_size=16, intermediate_size=16,
                        num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
PROMPT = [3, 1]


@pytest.fixture(scope="session")
def pair():
  """A target and a drafter that agree often but not always (the drafter is a noisy copy)."""
  target = init_params(jax.random.key(0), CFG, scale=0.3)
  noise = init_params(jax.random.key(1), CFG, scale=0.3)
  draft = jax.tree.map(lambda a, b: a + 0.5 * b, target, noise)
  return target, draft


@pytest.fixture(scope="session")
def small_pair():
  """V = 8 target and an unrelated drafter: many rejections, exact laws computable."""
  return (init_params(jax.random.key(10), SMALL, scale=0.8),
          init_params(jax.random.key(11), SMALL, scale=0.8))
