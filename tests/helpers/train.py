"""Training data the tests build: a tiny target's own completions as the trainers read them."""

import json

import numpy as np


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
