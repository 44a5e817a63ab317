"""Gemma-3-270M: vocabjax against transformers on the same GGUF (logits and greedy ids).

  python eval/gemma3_parity.py --out eval/results/gemma3/parity

Loads the registry's `gemma-3-270m` (GGUF Q4_K_M, dequantized to f32) twice: vocabjax's loader
and transformers' own GGUF loader (`checkpoints.torch_model.load_torch_model`, f32). For a
short prompt and one longer than the model's 512-token sliding window (Spec-Bench summarization
questions, from ../shared/data), it compares the logits of the prompt's last 8 positions (max
absolute difference, the argmax of each) and the greedy continuation of N new tokens (plain
decoding in vocabjax, `generate(do_sample=False)` in transformers), token for token. The token
ids are vocabjax's tokenizer's (chat-free, with BOS), fed to both. Past 768 tokens vocabjax's
caches keep the 15 sliding layers in a ring of 512 + 256 slots (`models.cache`; `ring_slots`
in the rows). Writes `<out>.json` and `<out>.md` atomically.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "spec_bench_dev.jsonl"
SHORT = "The capital of France is"


def long_prompt(tokenizer, min_tokens: int) -> str:
  """Spec-Bench summarization questions joined until the prompt has `min_tokens` tokens."""
  rows = [json.loads(line) for line in DATA.read_text().splitlines()]
  text = ""
  for r in rows:
    if r["category"] == "summarization":
      text += r["turns"][0] + "\n\n"
      if len(tokenizer(text)["input_ids"]) >= min_tokens:
        return text
  raise RuntimeError(f"the summarization questions give fewer than {min_tokens} tokens")


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="gemma-3-270m")
  ap.add_argument("--out", default=str(ROOT / "eval/results/gemma3/parity"))
  ap.add_argument("--new-tokens", type=int, default=32)
  ap.add_argument("--long-tokens", type=int, default=700,
                  help="the long prompt's minimum length (past the 512-token window)")
  args = ap.parse_args(argv)

  import jax
  import jax.numpy as jnp
  import torch

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.checkpoints.torch_model import load_torch_model
  from vocabjax.decoding import Decoder
  from vocabjax.models import KVCache, forward, lm_head

  t0 = time.perf_counter()
  model = load_model(args.model, dtype="float32")
  ref = load_torch_model(args.model, "float32")
  c = model.config
  print(f"loaded in {time.perf_counter() - t0:.1f} s: {c.num_layers} layers, V={c.vocab_size},"
        f" window {c.sliding_window}, layer types {c.layer_types}", flush=True)
  tok = model.tokenizer
  prompts = {"short": SHORT, "long": long_prompt(tok, args.long_tokens)}
  fwd = jax.jit(forward, static_argnames=("config", "fresh"))
  decoder = Decoder(model.params, c)
  rows = []
  for name, text in prompts.items():
    ids = tok(text)["input_ids"]
    T = len(ids)
    cache = KVCache.init(c, 1, T)  # sliding layers in a ring when T > window + slack
    hidden, _ = fwd(model.params, jnp.asarray([ids]), jnp.arange(T)[None], cache, config=c,
                    fresh=True, valid_lengths=jnp.array([T]))
    ours = np.asarray(lm_head(model.params, hidden[:, -8:], config=c))[0]
    with torch.no_grad():
      theirs = ref(torch.tensor([ids]), logits_to_keep=8).logits[0].float().numpy()
    diff = float(np.abs(ours - theirs).max())
    argmax_equal = bool((ours.argmax(-1) == theirs.argmax(-1)).all())
    ours_ids = decoder.generate([ids], max_new_tokens=args.new_tokens).tokens[0]
    with torch.no_grad():
      ref_ids = ref.generate(torch.tensor([ids]), max_new_tokens=args.new_tokens,
                             do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, T:].tolist()
    first_diff = next((i for i, (a, b) in enumerate(zip(ours_ids, ref_ids)) if a != b), None)
    row = dict(prompt=name, prompt_tokens=T, ring_slots=cache.ring, max_abs_logit_diff=diff,
               logit_scale=float(np.abs(theirs).max()), last8_argmax_equal=argmax_equal,
               greedy_equal=ours_ids == ref_ids, first_differing_token=first_diff,
               new_tokens=args.new_tokens, continuation=tok.decode(ours_ids))
    rows.append(row)
    print(json.dumps(row), flush=True)

  result = dict(
      command="python eval/gemma3_parity.py " + " ".join(argv or sys.argv[1:]),
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      host=platform.processor() or platform.machine(), model=args.model,
      source=model.source, jax=jax.__version__, torch=torch.__version__,
      transformers=__import__("transformers").__version__, rows=rows)
  return write_report(Path(args.out), result, f"{args.model}: vocabjax vs transformers (same "
                      f"GGUF, f32)", args.new_tokens)


def write_report(out: Path, result: dict, title: str, new_tokens: int,
                 extra: tuple = ()) -> int:
  """`<out>.json` (`result`) and `<out>.md` (title, command, the rows' table with `extra`
  (header, row -> cell) columns after the logit difference, the continuations), written
  atomically; returns the exit code: 0 when every row's argmax and greedy tokens agree."""
  from vocabjax.io import atomic_write_json, atomic_write_text

  rows = result["rows"]
  out.parent.mkdir(parents=True, exist_ok=True)
  atomic_write_json(out.with_suffix(".json"), result)
  heads = ["prompt", "tokens", "sliding layers' ring slots", "max abs logit diff (last 8)",
           *(h for h, _ in extra), "max abs logit", "argmax equal",
           f"greedy {new_tokens} equal", "first differing"]
  md = [f"# {title}", "", f"`{result['command']}` ({result['date']}; jax {result['jax']}, "
        f"torch {result['torch']}, transformers {result['transformers']})", "",
        "| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
  for r in rows:
    cells = [r["prompt"], r["prompt_tokens"], r["ring_slots"] or "linear",
             f"{r['max_abs_logit_diff']:.2e}", *(cell(r) for _, cell in extra),
             f"{r['logit_scale']:.1f}", r["last8_argmax_equal"], r["greedy_equal"],
             r["first_differing_token"]]
    md.append("| " + " | ".join(map(str, cells)) + " |")
  md += ["", "Continuations (vocabjax):", ""]
  md += [f"- {r['prompt']}: {r['continuation']!r}" for r in rows]
  atomic_write_text(out.with_suffix(".md"), "\n".join(md) + "\n")
  print(out.with_suffix(".md").read_text())
  return 0 if all(r["greedy_equal"] and r["last8_argmax_equal"] for r in rows) else 1

if __name__ == "__main__":
  sys.exit(main())
