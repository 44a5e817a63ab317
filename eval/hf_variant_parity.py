"""Config variants on real weights: vocabjax against transformers on the same HF directory.

  python eval/hf_variant_parity.py --model smollm2-135m-instruct --model-type mistral \
      --set sliding_window=64 --out eval/results/hf_variants/smollm2_as_mistral_w64
  python eval/hf_variant_parity.py --model qwen2.5-coder-0.5b-instruct \
      --set use_sliding_window=true --set sliding_window=64 --set max_window_layers=12 \
      --out eval/results/hf_variants/qwen05_sliding_w64
  python eval/hf_variant_parity.py --model qwen2.5-coder-0.5b-instruct \
      --set 'rope_scaling={"rope_type": "yarn", "factor": 4.0,
             "original_max_position_embeddings": 32768}' \
      --out eval/results/hf_variants/qwen05_yarn4

The registry model's GGUF is dequantized to f32 by transformers and written once as a Hugging
Face directory (`--work`); a variant directory shares its weights (symlinks) with `config.json`
edited by `--set KEY=JSON` (and `model_type` / `architectures` by `--model-type`: SmolLM2 is a
Llama, so as `mistral` with a window it is Mistral's attention on real weights). Both frameworks
load the variant directory; for a short prompt and one past the window (Spec-Bench
summarization questions) it compares the last 8 positions' logits and 32 greedy tokens (plain
decoding in vocabjax, `generate(do_sample=False)` in transformers), and how far the variant
moves vocabjax's own logits from the unedited config (the edit is not a no-op). Writes
`<out>.json` and `<out>.md` atomically.
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

from gemma3_parity import long_prompt, write_report  # the script's directory

ROOT = Path(__file__).resolve().parents[1]


def export_hf(model: str, work: Path) -> Path:
  """The registry model as an f32 Hugging Face directory under `work` (made once)."""
  out = work / model
  if (out / "config.json").is_file():
    return out
  from transformers import AutoTokenizer

  from vocabjax.checkpoints.torch_model import load_torch_model
  from vocabjax.checkpoints.zoo import resolve

  path = resolve(model)
  ref = load_torch_model(model, "float32")
  ref.hf_quantizer = None
  tmp = out.with_name(out.name + ".tmp")
  ref.save_pretrained(tmp)
  AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp)
  tmp.rename(out)
  return out


def variant_dir(base: Path, edits: dict, model_type: str | None, out: Path) -> Path:
  """A directory with `base`'s files linked and its config.json edited."""
  out.mkdir(parents=True, exist_ok=True)
  for f in base.iterdir():
    if f.name != "config.json" and not (out / f.name).exists():
      (out / f.name).symlink_to(f.resolve())
  cfg = json.loads((base / "config.json").read_text())
  if model_type:
    cfg["model_type"] = model_type
    cfg["architectures"] = [{"mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                             "llama": "LlamaForCausalLM"}[model_type]]
  cfg.update(edits)
  (out / "config.json").write_text(json.dumps(cfg, indent=1))
  return out


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", required=True, help="registry model")
  ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                  help="a config.json edit (repeatable)")
  ap.add_argument("--model-type", choices=["llama", "mistral", "qwen2"])
  ap.add_argument("--out", required=True)
  ap.add_argument("--work", default="/tmp/vocabjax_hf_variants")
  ap.add_argument("--new-tokens", type=int, default=32)
  ap.add_argument("--long-tokens", type=int, default=300)
  args = ap.parse_args(argv)
  edits = {}
  for item in args.set:
    key, _, value = item.partition("=")
    edits[key] = json.loads(value)

  import jax
  import jax.numpy as jnp
  import torch
  import transformers

  from vocabjax.checkpoints.loader import load_model
  from vocabjax.decoding import Decoder
  from vocabjax.models import KVCache, forward, lm_head

  t0 = time.perf_counter()
  work = Path(args.work)
  base = export_hf(args.model, work)
  name = Path(args.out).name
  vdir = variant_dir(base, edits, args.model_type, work / "variants" / name)
  model = load_model(vdir, dtype="float32")
  plain = load_model(base, dtype="float32", load_tokenizer=False)
  ref = transformers.AutoModelForCausalLM.from_pretrained(vdir, dtype=torch.float32).eval()
  c = model.config
  print(f"loaded in {time.perf_counter() - t0:.1f} s: {c.arch}, window {c.sliding_window}, "
        f"layer types {c.layer_types}, rope {c.rope_type} x{c.rope_factor} "
        f"(scale {c.rope_scale():.4f})", flush=True)
  tok = model.tokenizer
  fwd = jax.jit(forward, static_argnames=("config", "fresh"))
  decoder = Decoder(model.params, c)
  rows = []
  for pname, text in {"short": "The capital of France is",
                      "long": long_prompt(tok, args.long_tokens)}.items():
    ids = tok(text)["input_ids"]
    T = len(ids)

    def last8(params, config):
      cache = KVCache.init(config, 1, T)
      hidden, _ = fwd(params, jnp.asarray([ids]), jnp.arange(T)[None], cache, config=config,
                      fresh=True, valid_lengths=jnp.array([T]))
      return np.asarray(lm_head(params, hidden[:, -8:], config=config))[0], cache.ring

    ours, ring = last8(model.params, c)
    unedited, _ = last8(plain.params, plain.config)
    with torch.no_grad():
      theirs = ref(torch.tensor([ids]), logits_to_keep=8).logits[0].float().numpy()
    ours_ids = decoder.generate([ids], max_new_tokens=args.new_tokens).tokens[0]
    with torch.no_grad():
      ref_ids = ref.generate(torch.tensor([ids]), max_new_tokens=args.new_tokens,
                             do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, T:].tolist()
    row = dict(prompt=pname, prompt_tokens=T, ring_slots=ring,
               max_abs_logit_diff=float(np.abs(ours - theirs).max()),
               variant_moves_logits_by=float(np.abs(ours - unedited).max()),
               logit_scale=float(np.abs(theirs).max()),
               last8_argmax_equal=bool((ours.argmax(-1) == theirs.argmax(-1)).all()),
               greedy_equal=ours_ids == ref_ids,
               first_differing_token=next((i for i, (a, b) in enumerate(zip(ours_ids, ref_ids))
                                           if a != b), None),
               continuation=tok.decode(ours_ids))
    rows.append(row)
    print(json.dumps(row), flush=True)

  result = dict(
      command="python eval/hf_variant_parity.py " + " ".join(argv or sys.argv[1:]),
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      host=platform.processor() or platform.machine(), model=args.model, edits=edits,
      model_type=args.model_type or c.arch, jax=jax.__version__, torch=torch.__version__,
      transformers=transformers.__version__, rows=rows)
  return write_report(
      Path(args.out), result, f"{args.model} as `{result['model_type']}` with "
      f"{json.dumps(edits)}: vocabjax vs transformers (same HF directory, f32)", args.new_tokens,
      extra=(("the edit moves vocabjax's logits by",
              lambda r: f"{r['variant_moves_logits_by']:.2e}"),))

if __name__ == "__main__":
  sys.exit(main())
