"""Does `vocabjax.decoding.profile.step_split` time a step's parts as the step runs them? The
registry's 1.5B target on `gguf-q8`: a plain decoder's step (median over 40 tokens after a
300-token prompt) beside the target body timed apart at contexts 300 and 1024 and its LM head
timed apart (what `step_split` adds up as `target_step_s`).

    PYTHONPATH=. python kernels/step_split_check.py
"""

from __future__ import annotations

import functools

from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding import profile
from vocabjax.decoding.autoregressive import Decoder
from vocabjax.decoding.drafter import model_body
from vocabjax.lowering import step_lowering, with_lowering
from vocabjax.models.llamalike import lm_head


def main() -> int:
  t = load_model("qwen2.5-coder-1.5b-instruct", dtype="gguf-q8", load_tokenizer=False)
  dec = Decoder(t.params, t.config)
  ids = list(range(100, 400))
  dec.generate([ids], max_new_tokens=4, max_len=2048)  # compiles
  res = dec.generate([ids], max_new_tokens=40, max_len=2048)
  print(f"plain decoder: {1000 * res.decode_s / res.steps:.1f} ms a step")
  tp = with_lowering(t.params, step_lowering(dec.lowering))
  body = functools.partial(model_body, config=t.config)
  head = profile._time_head(tp, functools.partial(lm_head, config=t.config), 1, 1,
                            t.config.hidden_size, 5)
  for ctx in (300, 1024):
    b = profile._time_body(body, tp, t.config, 1, 1, 2048, ctx, 5)
    print(f"timed apart, context {ctx}: body {1000 * b:.1f} ms + head {1000 * head:.1f} ms = "
          f"{1000 * (b + head):.1f} ms")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
