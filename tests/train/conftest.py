"""Helpers shared by the training tests."""

import json

import numpy as np
import pytest


def write_completions(target_dir, path, n: int, max_new_tokens: int):
  """`n` chat prompts of random code/English words and the target's own greedy completions, as
  the completion jsonl the trainers read (`prompt` text + `completion_ids`)."""
  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding import Decoder

  t = load_model(target_dir, dtype="float32")
  rs = np.random.RandomState(0)
  words = ["def", "return", "fox", "print", "Hello", "range", "tokens", "verify", "lazy"]
  prompts = [" ".join(rs.choice(words, rs.randint(2, 6))) for _ in range(n)]
  texts = [t.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in prompts]
  ids = [t.tokenizer(x, add_special_tokens=False)["input_ids"] for x in texts]
  res = Decoder(t.params, t.config).generate(ids, max_new_tokens=max_new_tokens)
  path.write_text("".join(json.dumps({"prompt": x, "completion_ids": c}) + "\n"
                          for x, c in zip(texts, res.tokens)))
  return path


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
