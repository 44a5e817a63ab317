"""`python -m vocabjax.generate`: generate text with a target model and report timing as JSON.

  python -m vocabjax.generate --target qwen2.5-coder-1.5b-instruct --chat \\
      --prompt "Write a Python function that reverses a string." --max-new-tokens 64

  python -m vocabjax.generate --target qwen2.5-coder-1.5b-instruct \\
      --draft qwen2.5-coder-0.5b-instruct --method chain --gamma 4 --chat --prompt "..."

`--target`/`--draft` take a local HF directory, a .gguf file or a registry name (`python -m
vocabjax.zoo list`). Several `--prompt` flags (or `--batch-size`) make a batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

import jax

from vocabjax.checkpoints.loader import load_model
from vocabjax.decoding.profile import run_split, skipped_drafting, step_split
from vocabjax.decoding.sampling import SamplingParams
from vocabjax.io import atomic_write_json, check_output_file
from vocabjax.methods import METHODS
from vocabjax.prompts import encode_prompts, seed_arg
from vocabjax import distributed
from vocabjax.sharding import make_mesh, parse_mesh

CLI_METHODS = ("ar", "chain", "tree", "eagle", "medusa", "crossvocab", "pld")  # --method choices


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
  target: str
  prompts: tuple[str, ...]
  chat: bool = False
  max_new_tokens: int = 64
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  stop: tuple[str, ...] = ()
  max_len: int | None = None  # cache slots; default: prompt + max_new_tokens rounded up
  dtype: str = "auto"
  draft_dtype: str | None = None  # the drafter's weights (default: dtype)
  output: str | None = None
  quiet: bool = False
  draft: str | None = None
  method: str = "ar"  # ar | chain | tree | eagle | medusa | crossvocab | pld
  gamma: int = 4
  tree_top_k: int = 4
  tree_depth: int = 4
  tree_total_tokens: int = 16
  max_ngram: int = 3  # pld: longest context n-gram matched
  pld_candidates: int = 1  # pld: matches whose continuations form a tree (1: a chain)
  time_split: bool = False  # time drafter / drafter LM head / verification after the run
  batch_size: int | None = None  # repeat the prompts cyclically up to this many rows
  rows: int | None = None  # ar: continuous batching with this many cache rows (None: one batch)
  draft_vocab: str | None = None  # a saved static subset (.npz, `calibrate select`): trimmed head
  ranker: str | None = None  # a SpecVocab ranker (.safetensors, `train.ranker`): per-step vocab
  ranker_k: int = 2048  # candidates per step with --ranker
  eagle_head: str | None = None  # an EAGLE-3 head directory (`train.eagle`) for --method eagle
  eagle_lm_head: str = "own"  # own: the head's rows (d2t); target: the target's LM head
  eagle_min_confidence: float = 0.0  # eagle: draft only where the head's top probability reaches it
  medusa_heads: str | None = None  # a Medusa head directory (`train.medusa`) for --method medusa
  medusa_choices: str = ""  # Medusa's medusa_choices as JSON ("": every path of ranks < top-k)
  medusa_top_k: int = 1  # ranks per head of the full tree when no choices are given (1: chain)
  mesh: str | None = None  # "data=D,model=M": run on a device mesh (`vocabjax.sharding`)
  coordinator: str | None = None  # jax.distributed: process 0's HOST:PORT (`vocabjax.distributed`)
  num_processes: int | None = None
  process_id: int | None = None
  ngram: bool = True  # crossvocab: the online n-gram cache (False: direct mapping only, UAG)
  distilled: str | None = None  # crossvocab: a `train.distill` output's drafter/ directory
  adaptive: bool = False  # crossvocab: stop drafting by the distilled acceptance head
  threshold: float = 0.5  # crossvocab --adaptive: stop when P(a rejection) exceeds this
  rule: str = "exact"  # crossvocab sampling with n-gram merges: exact or omnidraft

  def __post_init__(self):
    if self.method not in CLI_METHODS:
      raise ValueError(f"unknown method {self.method!r}; choose one of {CLI_METHODS}")
    if self.method == "eagle":
      if not self.eagle_head:
        raise ValueError("--method eagle needs --eagle-head (an EAGLE-3 head directory)")
    elif self.method == "medusa":
      if not self.medusa_heads:
        raise ValueError("--method medusa needs --medusa-heads (a Medusa head directory)")
      if self.ranker or self.draft or self.time_split:
        raise ValueError("--method medusa drafts with heads on the target: --draft, --ranker "
                         "and --time-split do not apply (--draft-vocab restricts the heads)")
    elif self.method == "pld":
      if self.draft or self.draft_vocab or self.ranker or self.time_split:
        raise ValueError("--method pld drafts from the context, with no drafter: --draft, "
                         "--draft-vocab, --ranker and --time-split do not apply")
    elif self.method != "ar" and not self.draft:
      raise ValueError(f"--method {self.method} needs --draft")
    if self.pld_candidates != 1 and self.method != "pld":
      raise ValueError(f"--pld-candidates belongs to --method pld, not {self.method}")
    if (self.eagle_head or self.eagle_min_confidence) and self.method != "eagle":
      raise ValueError(f"--eagle-* flags belong to --method eagle, not {self.method}")
    if (self.medusa_heads or self.medusa_choices or self.medusa_top_k != 1) and \
        self.method != "medusa":
      raise ValueError(f"--medusa-* flags belong to --method medusa, not "
                       f"{self.method}")
    if self.draft_vocab and self.method == "ar":
      raise ValueError("--draft-vocab trims a drafter's head: use it with --method chain/tree")
    if self.ranker and self.method == "ar":
      raise ValueError("--ranker picks a drafter's vocabulary: use it with --method chain/tree")
    if self.ranker and self.draft_vocab:
      raise ValueError("give --draft-vocab (static subset) or --ranker (SpecVocab), not both")
    if self.method != "crossvocab" and (self.distilled or self.adaptive or not self.ngram):
      raise ValueError("--distilled / --adaptive / --no-ngram belong to --method crossvocab")
    if self.method == "crossvocab" and (self.draft_vocab or self.ranker or self.time_split):
      raise ValueError("--method crossvocab drafts over the drafter's own vocabulary; "
                       "--draft-vocab, --ranker and --time-split do not apply")
    if self.adaptive and not self.distilled:
      raise ValueError("--adaptive needs --distilled (a directory holding an acceptance head)")
    if self.batch_size is not None and self.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
    if self.rows is not None:
      if self.rows < 1:
        raise ValueError(f"--rows must be >= 1, got {self.rows}")
      if self.method != "ar":
        raise ValueError(f"--rows (continuous batching) decodes with --method ar, not "
                         f"{self.method}")
      if self.mesh is not None:
        raise ValueError("--rows (continuous batching) runs on one device: drop --mesh")
    if self.output:
      check_output_file(self.output, "--output")
    if any(stop == "" for stop in self.stop):
      raise ValueError("--stop '' would stop at the first token: stop strings must be "
                       "non-empty")
    if self.mesh is not None:
      parse_mesh(self.mesh)
    if distributed.settings(self.coordinator, self.num_processes, self.process_id) and \
        not self.mesh:
      raise ValueError("a multi-process run decodes on a mesh over every process's devices: "
                       "give --mesh too")  # the shape's syntax; its device count is checked at build time
    method_spec(self)  # the method's own parameter checks (the registry's), before any loading


def method_params(config: GenerateConfig) -> tuple[str, dict]:
  """The registered method (`vocabjax.methods.METHODS`) and its parameters for these flags:
  --ranker turns chain / tree drafting into `specvocab`, --draft-vocab is the `subset`."""
  tree = {"top_k": config.tree_top_k, "depth": config.tree_depth,
          "total_tokens": config.tree_total_tokens}
  subset = {"subset": config.draft_vocab} if config.draft_vocab else {}
  if config.method == "ar":
    return "ar", {}
  if config.method == "pld":
    return "pld", {"gamma": config.gamma, "max_ngram": config.max_ngram,
                   "candidates": config.pld_candidates}
  if config.method == "crossvocab":
    return "crossvocab", {"gamma": config.gamma, "ngram": config.ngram,
                          "drafter": config.distilled or "", "adaptive": config.adaptive,
                          "threshold": config.threshold, "rule": config.rule}
  if config.method == "medusa":
    return "medusa", {"heads": config.medusa_heads, "choices": config.medusa_choices,
                      "top_k": config.medusa_top_k, **subset}
  if config.method == "eagle":
    ranked = {"ranker": config.ranker, "k": config.ranker_k} if config.ranker else {}
    return "eagle", {"head": config.eagle_head, "lm_head": config.eagle_lm_head, **tree,
                     "min_confidence": config.eagle_min_confidence, **subset, **ranked}
  if config.ranker:
    shape = {"gamma": config.gamma} if config.method == "chain" else tree
    return "specvocab", {"ranker": config.ranker, "k": config.ranker_k, **shape}
  if config.method == "chain":
    return "chain", {"gamma": config.gamma, **subset}
  return "tree", {**tree, **subset}


def method_spec(config: GenerateConfig):
  """(the registered method, its parsed parameters) for `config`; bad parameters are
  ValueErrors (ConfigError) naming the value."""
  name, raw = method_params(config)
  method = METHODS[name]
  return method, method.parse(raw, f"--method {config.method}")


def build_decoder(config: GenerateConfig, model):
  """The decoder for `config` from the library's method registry (loads the drafter when the
  method needs one)."""
  method, params = method_spec(config)
  draft = None
  if method.needs_draft:
    draft = load_model(config.draft, dtype=config.draft_dtype or config.dtype,
                       load_tokenizer=method.name == "crossvocab")
  mesh = None
  if config.mesh:
    mesh = make_mesh(**parse_mesh(config.mesh))
  return method.make(model, draft, params, mesh)


def main(config: GenerateConfig) -> dict:
  sampling = SamplingParams(config.temperature, config.top_k, config.top_p)  # validates
  if config.max_new_tokens <= 0:
    raise ValueError(f"max_new_tokens must be > 0, got {config.max_new_tokens}")
  distributed.initialize(config.coordinator, config.num_processes, config.process_id)
  t0 = time.perf_counter()
  model = load_model(config.target, dtype=config.dtype)
  load_s = time.perf_counter() - t0
  prompts = list(config.prompts)
  if config.batch_size:
    prompts = [prompts[i % len(prompts)] for i in range(config.batch_size)]
  prompt_ids = encode_prompts(model.tokenizer, prompts, config.chat)
  common = dict(max_new_tokens=config.max_new_tokens, sampling=sampling, seed=config.seed,
                eos_token_ids=model.eos_token_ids, max_len=config.max_len)
  spec_stats = None
  common.update(stop_strings=config.stop, tokenizer=model.tokenizer)
  dec = build_decoder(config, model)
  if config.method != "ar":
    load_s = time.perf_counter() - t0
  if config.rows is not None:  # a finished row takes the next prompt
    res = dec.generate_continuous(prompt_ids, rows=config.rows, **common)
  else:
    res = dec.generate(prompt_ids, **common)
  if config.method != "ar":
    st = res.stats
    spec_stats = {"tau": st.tau, "acceptance_rate": st.acceptance_rate,
                  "target_forwards": st.target_forwards + 1,  # + prefill
                  "drafted_per_step_row": st.drafted, "accepted_per_step_row": st.accepted}
    if hasattr(st, "record"):  # crossvocab: n-gram merges, drafter tokens, the cache's size;
      spec_stats.update(st.record())  # pld: steps that found a match
      if hasattr(dec, "ngram"):
        spec_stats["ngram_cache"] = dec.ngram.stats
    if config.time_split:
      split = step_split(dec, batch_size=len(prompt_ids), max_len=dec.cache_len(
          max(map(len, prompt_ids)), config.max_new_tokens, config.max_len))
      spec_stats["time_split_per_step"] = split.as_dict()
      spec_stats["time_split"] = run_split(split, st.target_forwards, res.decode_s,
                                           **skipped_drafting(st))
  texts = [model.tokenizer.decode(t, skip_special_tokens=True) for t in res.tokens]
  main_process = jax.process_index() == 0  # under jax.distributed, process 0 reports
  if not config.quiet and main_process:
    for i, text in enumerate(texts):
      if len(texts) > 1:
        print(f"--- [{i}] ---")
      print(text)
  stats = {
      "target": model.source,
      "config": dataclasses.asdict(model.config),
      "settings": {k: v for k, v in dataclasses.asdict(config).items() if k != "output"},
      "dtype": str(model.dtype.__name__ if hasattr(model.dtype, "__name__") else model.dtype),
      "backend": jax.default_backend(),
      "machine": platform.node(),
      "prompt_ids": prompt_ids,
      "output_ids": res.tokens,
      "texts": texts,
      "finish_reasons": res.finish_reasons,
      "timing": {"load_s": load_s, "compile_s": res.compile_s, "prefill_s": res.prefill_s,
                 "decode_s": res.decode_s, "generated_tokens": res.num_generated,
                 "tokens_per_s": res.tokens_per_s},
      "speculative": spec_stats,
  }
  extra = f", tau {spec_stats['tau']:.2f}" if spec_stats else ""
  print(f"[vocabjax] {config.method}: {res.num_generated} tokens, {res.tokens_per_s:.2f} tok/s "
        f"(prefill {res.prefill_s:.2f}s, compile {res.compile_s:.1f}s, load {load_s:.1f}s"
        f"{extra})", file=sys.stderr)
  if config.output and main_process:
    atomic_write_json(config.output, stats)
  return stats


def parse_args(argv=None) -> GenerateConfig:
  p = argparse.ArgumentParser(prog="python -m vocabjax.generate", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", required=True, help="HF dir, .gguf file or registry name")
  p.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
  p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
  p.add_argument("--max-new-tokens", type=int, default=64,
                 help="tokens to generate per prompt (default 64)")
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--top-k", type=int, default=0, help="0 = off")
  p.add_argument("--top-p", type=float, default=1.0,
                 help="nucleus sampling mass in (0, 1]; 1 = off (with --temperature > 0)")
  p.add_argument("--seed", type=seed_arg, default=0,
                 help="random seed of sampling (greedy output does not depend on it)")
  p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
  p.add_argument("--max-len", type=int, default=None, help="KV cache slots per row")
  p.add_argument("--dtype", default="auto", help="auto (f32 on CPU, bf16 on GPU/TPU), f32, bf16, int8 "
                 "(weight-only int8 with per-row scales; activations stay f32)")
  p.add_argument("--draft-dtype", help="the drafter's weights (default: --dtype); the target "
                 "verifies, so output stays exact")
  p.add_argument("--output", help="write token ids and timing here as JSON")
  p.add_argument("--time-split", action="store_true",
                 help="after the run, time the step's parts (drafter, drafter LM head, "
                      "verification) as separate programs and add the split to the stats")
  p.add_argument("--quiet", action="store_true", help="do not print the text")
  p.add_argument("--draft", help="drafter: HF dir, .gguf or registry name (same vocabulary, "
                 "or another tokenizer's with --method crossvocab)")
  p.add_argument("--method", default="ar", choices=CLI_METHODS,
                 help="decoding method (default ar: plain autoregressive)")
  p.add_argument("--gamma", type=int, default=4, help="chain, crossvocab, pld: drafts per step")
  p.add_argument("--max-ngram", type=int, default=3,
                 help="pld: longest context n-gram matched (down to 1)")
  p.add_argument("--pld-candidates", type=int, default=1,
                 help="pld: continuations of up to this many matches verified as one tree "
                      "(default 1: a chain of --gamma drafts)")
  p.add_argument("--tree-top-k", type=int, default=4,
                 help="tree, eagle: children expanded per node (default 4)")
  p.add_argument("--tree-depth", type=int, default=4,
                 help="tree, eagle: drafting depth, levels of the tree (default 4)")
  p.add_argument("--tree-total-tokens", type=int, default=16,
                 help="tree, eagle: draft tokens verified per step (default 16)")
  p.add_argument("--rows", type=int, default=None,
                 help="--method ar: continuous batching, this many cache rows decode the "
                      "prompts and a finished row takes the next one (default: one batch)")
  p.add_argument("--batch-size", type=int, default=None,
                 help="repeat the prompts cyclically to this many rows")
  p.add_argument("--draft-vocab", help="static drafter vocabulary subset (.npz from "
                 "`python -m vocabjax.calibrate select`): the drafter's LM head is trimmed")
  p.add_argument("--ranker", help="SpecVocab ranker (.safetensors from `python -m "
                 "vocabjax.train.ranker`): the drafter's candidates are chosen per step")
  p.add_argument("--ranker-k", type=int, default=2048, help="candidates per step (--ranker)")
  p.add_argument("--no-ngram", action="store_true",
                 help="crossvocab: direct mapping only (the UAG baseline), no n-gram cache")
  p.add_argument("--distilled", help="crossvocab: a distilled drafter (`python -m "
                 "vocabjax.train.distill` output's drafter/ directory)")
  p.add_argument("--adaptive", action="store_true",
                 help="crossvocab: adaptive draft length by the distilled acceptance head")
  p.add_argument("--threshold", type=float, default=0.5,
                 help="crossvocab --adaptive: stop drafting when P(a rejection) exceeds this")
  p.add_argument("--rule", default="exact", choices=("exact", "omnidraft"),
                 help="crossvocab, temperature > 0 with the n-gram cache: exact (lossless, the "
                      "default) or omnidraft (the paper's approximate q')")
  p.add_argument("--eagle-head", help="EAGLE-3 head directory (`python -m vocabjax.train.eagle`"
                 " or SpecForge's export) for --method eagle; drafts the --tree-* tree")
  p.add_argument("--eagle-lm-head", default="own", choices=("own", "target"),
                 help="the head's own (reduced) LM head, or the target's (then --draft-vocab "
                 "/ --ranker restrict it)")
  p.add_argument("--eagle-min-confidence", type=float, default=0.0,
                 help="eagle: draft only in steps where the head's top probability at the root "
                 "reaches this (EAGLE-2's confidence; the other steps verify one token, as "
                 "plain decoding); 0 drafts every step")
  p.add_argument("--mesh", help="run on a device mesh, e.g. data=1,model=8 (tensor-parallel "
                 "target and drafter, batch rows over data; chain, tree, the vocabulary "
                 "methods, eagle and medusa)")

  distributed.add_arguments(p)
  p.add_argument("--medusa-heads", help="Medusa head directory (`python -m vocabjax.train.medusa`"
                 " or Medusa's own) for --method medusa")
  p.add_argument("--medusa-choices", default="",
                 help="medusa: the static tree as Medusa's medusa_choices in JSON, e.g. "
                      "'[[0], [1], [0, 0]]' (default: every path of ranks < --medusa-top-k "
                      "down to the last head)")
  p.add_argument("--medusa-top-k", type=int, default=1,
                 help="medusa without --medusa-choices: ranks per head (default 1: a chain)")
  a = p.parse_args(argv)
  return GenerateConfig(target=a.target, prompts=tuple(a.prompt), chat=a.chat,
                        max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                        top_k=a.top_k, top_p=a.top_p, seed=a.seed, stop=tuple(a.stop),
                        max_len=a.max_len, dtype=a.dtype, draft_dtype=a.draft_dtype,
                        output=a.output, quiet=a.quiet,
                        time_split=a.time_split,
                        draft=a.draft, method=a.method, gamma=a.gamma, max_ngram=a.max_ngram,
                        pld_candidates=a.pld_candidates,
                        tree_top_k=a.tree_top_k,
                        tree_depth=a.tree_depth, tree_total_tokens=a.tree_total_tokens,
                        batch_size=a.batch_size, rows=a.rows, draft_vocab=a.draft_vocab,
                        ranker=a.ranker,
                        ranker_k=a.ranker_k, eagle_head=a.eagle_head,
                        eagle_lm_head=a.eagle_lm_head,
                        eagle_min_confidence=a.eagle_min_confidence, medusa_heads=a.medusa_heads,
                        medusa_choices=a.medusa_choices, medusa_top_k=a.medusa_top_k,
                        mesh=a.mesh, coordinator=a.coordinator,
                        num_processes=a.num_processes, process_id=a.process_id,
                        ngram=not a.no_ngram,
                        distilled=a.distilled, adaptive=a.adaptive, threshold=a.threshold,
                        rule=a.rule)


def cli(argv=None) -> int:
  """The command line: a user's mistake is one `error:` line, exit 2."""
  try:
    main(parse_args(argv))
  except (ValueError, FileNotFoundError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(cli())
