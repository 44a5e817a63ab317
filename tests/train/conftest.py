"""Helpers shared by the training tests."""


import pytest
from tests.helpers.train import write_completions


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
  """A tiny Qwen2 target with a tokenizer (the EAGLE and Medusa trainers' tests share it)."""
  from vocabjax.testing.tiny import save_tiny_variant

  return save_tiny_variant("qwen2_bias", tmp_path_factory.mktemp("heads") / "target", seed=4,
                           with_tokenizer=True)


@pytest.fixture(scope="session")
def data_file(target_dir, tmp_path_factory):
  """24 chat prompts and the target's own greedy completions (16 tokens each)."""
  return write_completions(target_dir, tmp_path_factory.mktemp("data") / "generated.jsonl",
                           n=24, max_new_tokens=16)
