"""The same models and prompts through PyTorch / transformers: plain `generate` and assisted
generation (`assistant_model`, Leviathan-style with transformers' own draft-length heuristic).
When the assistant has another tokenizer, transformers' Universal Assisted Generation runs
instead (`tokenizer` + `assistant_tokenizer`: the assistant's text is re-encoded for the target,
greedy; with sampling, its vocabulary-intersection translator) and the variant is "uag".

Models load from the same files vocabjax loads (a registry name resolves to its cached GGUF,
read by transformers' GGUF loader; an HF directory is read directly), in f32 on CPU.
"""

from __future__ import annotations

import time
from pathlib import Path

from vocabjax.checkpoints.gguf_io import load_gguf_tokenizer
from vocabjax.checkpoints.torch_model import load_torch_model
from vocabjax.checkpoints.zoo import resolve


def _tokenizer(source: str):
  path = resolve(source)
  if path.is_file() and path.suffix == ".gguf":
    return load_gguf_tokenizer(path)
  import transformers

  return transformers.AutoTokenizer.from_pretrained(Path(path))


class TorchRunner:
  """transformers' greedy/sampled generate, with or without an assistant model."""

  def __init__(self, target: str, draft: str | None, *, threads: int | None = None,
               dtype: str = "float32"):
    """`dtype`: the models' torch dtype (all params and activations, as PyTorch users run)."""
    import torch
    import transformers

    if threads:
      torch.set_num_threads(threads)
    self.torch = torch
    self.target = load_torch_model(target, dtype)
    self.draft = load_torch_model(draft, dtype) if draft else None
    self.dtype = dtype
    self.tokenizers = None  # (target's, assistant's) when they differ: UAG
    if self.draft is not None and (self.draft.config.vocab_size
                                   != self.target.config.vocab_size):
      self.tokenizers = (_tokenizer(target), _tokenizer(draft))
    self.assisted_name = "uag" if self.tokenizers else "assisted"
    self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}

  def generate(self, ids: list[int], *, max_new_tokens: int, assisted: bool,
               eos_token_ids=(), temperature: float = 0.0, seed: int = 0) -> dict:
    torch = self.torch
    kw = dict(max_new_tokens=max_new_tokens, min_new_tokens=0,
              eos_token_id=list(eos_token_ids) or None, pad_token_id=(list(eos_token_ids)
                                                                       or [0])[0])
    if temperature > 0:
      kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
      kw.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    if assisted:
      if self.draft is None:
        raise ValueError("assisted generation needs a draft model")
      kw["assistant_model"] = self.draft
      if self.tokenizers:
        kw["tokenizer"], kw["assistant_tokenizer"] = self.tokenizers
    torch.manual_seed(seed)
    x = torch.tensor([ids])
    with torch.no_grad():
      t = time.perf_counter()
      out = self.target.generate(x, attention_mask=torch.ones_like(x), **kw)
      wall = time.perf_counter() - t
    new = out[0, len(ids):].tolist()
    return {"output_ids": new, "num_tokens": len(new), "wall_s": wall,
            "tokens_per_s": len(new) / wall if wall > 0 else float("nan")}
