"""RoPE scaling read from Hugging Face configs: YaRN against transformers' own computation.

Llama 3's `llama3` scaling and `linear` are checked through the tiny variants' logits
(`test_llamalike_vs_reference.py`, which also runs `qwen2_yarn`: YaRN over an original context
of 16 positions, 24-token prompts)."""

import numpy as np
import pytest
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from vocabjax.checkpoints.hf_config import UnsupportedConfigError, config_from_hf

_BASE = dict(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


@pytest.mark.parametrize("rope", [
    dict(factor=4.0, original_max_position_embeddings=16),  # Qwen2.5's recipe, scaled down
    dict(factor=4.0, original_max_position_embeddings=16, truncate=False),
    dict(factor=8.0, original_max_position_embeddings=32, beta_fast=16, beta_slow=2),
    dict(factor=40.0, original_max_position_embeddings=64, mscale=0.707,
         mscale_all_dim=0.707),  # DeepSeek's spelling: the two terms cancel, factor 1
    dict(factor=40.0, original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=0.5),
    dict(factor=2.0, original_max_position_embeddings=16, attention_factor=1.3),
    dict(factor=None, original_max_position_embeddings=64),  # max_position / original = 4
], ids=["qwen", "no-truncate", "betas", "deepseek-mscale", "mscale-ratio", "attention-factor",
        "implied-factor"])
@pytest.mark.parametrize("theta", [10000.0, 1e6])
def test_yarn_frequencies_and_attention_factor_are_transformers(rope, theta):
  """The inverse frequencies and the cos/sin factor equal transformers'
  `_compute_yarn_parameters` for the same config (its float32 against our float64)."""
  params = {"rope_type": "yarn", "rope_theta": theta, **rope}
  hf = transformers.Qwen2Config(**_BASE, rope_parameters=params)
  inv_ref, attention_ref = ROPE_INIT_FUNCTIONS["yarn"](hf)
  ours = config_from_hf({**_BASE, "model_type": "qwen2", "rope_parameters": params})
  assert ours.rope_type == "yarn"
  np.testing.assert_allclose(ours.inv_freq(), inv_ref.numpy(), rtol=2e-6)
  assert ours.rope_scale() == pytest.approx(attention_ref, rel=1e-12)
  # and the ramp does something: some dimensions keep their frequency, others are divided
  plain = config_from_hf({**_BASE, "model_type": "qwen2", "rope_theta": theta})
  ratio = plain.inv_freq() / ours.inv_freq()
  assert ratio.min() == pytest.approx(1.0) and ratio.max() == pytest.approx(ours.rope_factor)


def test_the_older_rope_scaling_spelling_reads_the_same():
  """Qwen2.5's model cards add `rope_scaling: {type: yarn, factor: 4.0,
  original_max_position_embeddings: 32768}` to config.json (the `type` key, transformers 4)."""
  new = config_from_hf({**_BASE, "model_type": "qwen2", "rope_theta": 1e6, "rope_parameters": {
      "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
      "original_max_position_embeddings": 32768}})
  old = config_from_hf({**_BASE, "model_type": "qwen2", "rope_theta": 1e6, "rope_scaling": {
      "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})
  assert new == old and old.rope_attention_factor == pytest.approx(0.1 * np.log(4) + 1)


def test_yarn_without_its_original_context_is_refused():
  with pytest.raises(UnsupportedConfigError,
                     match="rope_type='yarn' without original_max_position_embeddings"):
    config_from_hf({**_BASE, "model_type": "qwen2",
                    "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
  # yarn's own parameters belong to yarn alone
  with pytest.raises(UnsupportedConfigError, match=r"rope parameters \['beta_fast'\]"):
    config_from_hf({**_BASE, "model_type": "llama",
                    "rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 8}})


def test_rope_scaling_beside_disagreeing_rope_parameters_is_refused():
  """A transformers-5 config.json (`rope_parameters`) with a `rope_scaling` added as Qwen's
  model card says: transformers reads rope_scaling alone, with rope_theta back at 10,000 when
  the file has none at the top level (checked on its own config class), so the two readings
  differ; vocabjax names the clash instead of picking one. Agreeing copies are fine."""
  params = {"rope_theta": 1e6, "rope_type": "default"}
  yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
  hf = transformers.Qwen2Config(**_BASE, rope_parameters=dict(params), rope_scaling=dict(yarn))
  assert hf.rope_parameters["rope_type"] == "yarn" and hf.rope_parameters["rope_theta"] == 1e4
  with pytest.raises(UnsupportedConfigError, match=r"disagree on \['factor', "
                     r"'original_max_position_embeddings', 'rope_type'\] .* keep one of them"):
    config_from_hf({**_BASE, "model_type": "qwen2", "rope_parameters": params,
                    "rope_scaling": yarn})
  same = config_from_hf({**_BASE, "model_type": "qwen2", "rope_parameters": {**params, **yarn},
                         "rope_scaling": {**yarn, "type": "yarn"}})
  assert same.rope_type == "yarn" and same.rope_theta == 1e6
