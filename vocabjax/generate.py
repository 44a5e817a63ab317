"""`python -m vocabjax.generate`: generate text with a target model and report timing as JSON.

  python -m vocabjax.generate --target qwen2.5-coder-1.5b-instruct --chat \\
      --prompt "Write a Python function that reverses a string." --max-new-tokens 64

  python -m vocabjax.generate --target qwen2.5-coder-1.5b-instruct \\
      --draft qwen2.5-coder-0.5b-instruct --method chain --set gamma=4 --chat --prompt "..."

`--method` is any registered method (`vocabjax.methods.METHODS`, listed below with their
parameters) and `--set KEY=VALUE` its parameters under the registry's names, exactly what an
eval suite's `methods:` entry holds. `--target`/`--draft` take a local HF directory, a .gguf
file or a registry name (`python -m vocabjax.zoo list`). Several `--prompt` flags (or
`--batch-size`) make a batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from typing import Any, Sequence

import jax

from vocabjax.checkpoints import hub
from vocabjax.checkpoints.hub import add_allow_bin_argument, allow_bin_from_args
from vocabjax.checkpoints.loader import dtype_name, load_model
from vocabjax.decoding.profile import run_split, skipped_drafting, step_split
from vocabjax.sampling import SamplingParams
from vocabjax.io import atomic_write_json, check_output_file
from vocabjax.errors import ConfigError, disk_full, disk_full_message
from vocabjax.methods import METHODS
from vocabjax.prompts import encode_prompts, seed_arg
from vocabjax import distributed
from vocabjax.sharding import make_mesh, parse_mesh

@dataclasses.dataclass(frozen=True)
class GenerateConfig:
  """One `python -m vocabjax.generate` run. `method` is a registered method
  (`vocabjax.methods.METHODS`) and `params` its parameters under the registry's names (what a
  suite's `methods:` entry holds): one validation path for both."""

  target: str
  prompts: tuple[str, ...]
  method: str = "ar"
  params: tuple[tuple[str, Any], ...] = ()  # (name, value) pairs; the registry parses them
  draft: str | None = None
  chat: bool = False
  chat_template_kwargs: tuple[tuple[str, Any], ...] = ()  # the chat template's variables
  max_new_tokens: int = 64
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  draft_in_set: bool = True  # drafts within the request's top-k / top-p (`SamplingParams`)
  seed: int = 0
  stop: tuple[str, ...] = ()
  max_len: int | None = None  # cache slots; default: prompt + max_new_tokens rounded up
  dtype: str = "auto"
  draft_dtype: str | None = None  # the drafter's weights (default: dtype)
  output: str | None = None
  quiet: bool = False
  stream: bool = False  # print the text as the steps keep tokens (one prompt)
  time_split: bool = False  # time drafter / drafter LM head / verification after the run
  batch_size: int | None = None  # repeat the prompts cyclically up to this many rows
  rows: int | None = None  # continuous batching with this many cache rows (None: one batch)
  mesh: str | None = None  # "data=D,model=M": run on a device mesh (`vocabjax.sharding`)
  coordinator: str | None = None  # jax.distributed: process 0's HOST:PORT (`vocabjax.distributed`)
  num_processes: int | None = None
  process_id: int | None = None

  def __post_init__(self):
    if self.method not in METHODS:
      raise ValueError(f"unknown method {self.method!r}; choose one of {sorted(METHODS)}")
    method = METHODS[self.method]
    if method.needs_draft and not self.draft:
      raise ValueError(f"--method {self.method} needs --draft")
    if not method.needs_draft and self.draft:
      raise ValueError(f"--method {self.method} drafts without a drafter model: drop --draft")
    if self.time_split and not method.timed:
      raise ValueError(f"--time-split times a compiled drafter's calls and the verification; "
                       f"--method {self.method} has none (timed: {sorted(timed_methods())})")
    if self.batch_size is not None and self.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
    if self.rows is not None:
      if self.rows < 1:
        raise ValueError(f"--rows must be >= 1, got {self.rows}")
      if self.mesh is not None and parse_mesh(self.mesh).get("data", 1) != 1:
        raise ValueError("--rows (continuous batching) prefills one prompt at a time: it runs "
                         "on one device or a model-parallel mesh (data=1): drop data from "
                         "--mesh")
    if self.chat_template_kwargs and not self.chat:
      raise ValueError(f"--chat-kwarg {self.chat_template_kwargs[0][0]}=... sets a chat "
                       f"template variable: give --chat too")
    if self.stream:
      if self.quiet:
        raise ValueError("--stream prints the text as it comes and --quiet prints none: "
                         "choose one")
      if self.rows is not None:
        raise ValueError("--stream prints one prompt's text as one row decodes it: drop --rows")
      n = self.batch_size or len(self.prompts)
      if n != 1:
        raise ValueError(f"--stream prints one prompt's text; this run has {n} prompts")
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


def timed_methods() -> list[str]:
  return [n for n, m in METHODS.items() if m.timed]


def method_spec(config: GenerateConfig):
  """(the registered method, its parsed parameters) for `config`; bad parameters are
  ValueErrors (ConfigError) naming the parameter and the value."""
  method = METHODS[config.method]
  raw = dict(config.params)
  if len(raw) != len(config.params):
    dup = sorted({k for k, _ in config.params if sum(k == j for j, _ in config.params) > 1})
    raise ConfigError(f"--set gives {dup} more than once")
  return method, method.parse(raw, f"--method {config.method}")


def parse_chat_kwargs(items: Sequence[str]) -> tuple[tuple[str, Any], ...]:
  """`--chat-kwarg KEY=VALUE` flags -> (name, value) pairs: true/false, integers and numbers
  as YAML reads them (`enable_thinking=false` is the boolean), anything else a string."""
  import yaml

  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise ConfigError(f"--chat-kwarg {item!r}: expected KEY=VALUE, e.g. "
                        f"--chat-kwarg enable_thinking=false")
    try:
      parsed = yaml.safe_load(value)
    except yaml.YAMLError:
      parsed = value
    out[key.strip()] = parsed if isinstance(parsed, (bool, int, float)) else value
  return tuple(sorted(out.items()))


def parse_set(items: Sequence[str], method: str) -> tuple[tuple[str, Any], ...]:
  """`--set KEY=VALUE` flags -> (name, value) pairs typed by the method's parameter dataclass
  (int, float, bool: true/false/yes/no/1/0, str); an unknown name or an unparsable value is a
  ConfigError naming it."""
  if method not in METHODS:
    raise ConfigError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
  fields = METHODS[method].fields
  out = []
  for item in items:
    key, sep, value = item.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
      raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set gamma=4")
    if key not in fields:
      raise ConfigError(f"--set {key}={value}: method {method!r} has no parameter {key!r}; it "
                        f"takes {sorted(fields) or 'none'}")
    out.append((key, _typed(value, fields[key], f"--set {key}={value}")))
  return tuple(out)


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _typed(value: str, typ: type, where: str):
  if typ is bool:
    if value.lower() in _TRUE + _FALSE:
      return value.lower() in _TRUE
    raise ConfigError(f"{where}: expected a boolean (true/false), got {value!r}")
  if typ in (int, float):
    try:
      return typ(value)
    except ValueError:
      raise ConfigError(f"{where}: expected {typ.__name__}, got {value!r}") from None
  return value


def methods_help() -> str:
  """Every registered method and its parameters, from the parameter dataclasses."""
  lines = ["methods (--method NAME) and their parameters (--set KEY=VALUE; * = required):"]
  for name, m in METHODS.items():
    defaults = m.defaults
    params = ", ".join(f"{k}{'' if k in defaults else '*'}: {t.__name__}"
                       + (f" = {defaults[k]!r}" if k in defaults else "")
                       for k, t in m.fields.items())
    draft = " [--draft]" if m.needs_draft else ""
    lines.append(f"  {name}{draft}: {params or '(none)'}")
  return "\n".join(lines)


def build_decoder(config: GenerateConfig, model, mesh=None):
  """The decoder for `config` from the library's method registry (loads the drafter when the
  method needs one, onto `mesh` as the target was)."""
  method, params = method_spec(config)
  draft = None
  if method.needs_draft:
    draft = load_model(config.draft, dtype=config.draft_dtype or config.dtype,
                       load_tokenizer=method.name == "crossvocab", mesh=mesh)
  return method.make(model, draft, params, mesh)


def main(config: GenerateConfig) -> dict:
  """Generate for `config`; its stats. `quiet`: no text and no download or checksum bars."""
  with hub.showing_progress(False if config.quiet else None):
    return _generate(config)


def _generate(config: GenerateConfig) -> dict:
  sampling = SamplingParams(config.temperature, config.top_k, config.top_p,
                            config.draft_in_set)  # validates
  if config.max_new_tokens <= 0:
    raise ValueError(f"max_new_tokens must be > 0, got {config.max_new_tokens}")
  distributed.initialize(config.coordinator, config.num_processes, config.process_id)
  mesh = make_mesh(**parse_mesh(config.mesh)) if config.mesh else None
  t0 = time.perf_counter()
  model = load_model(config.target, dtype=config.dtype, mesh=mesh)
  load_s = time.perf_counter() - t0
  prompts = list(config.prompts)
  if config.batch_size:
    prompts = [prompts[i % len(prompts)] for i in range(config.batch_size)]
  prompt_ids = encode_prompts(model.tokenizer, prompts, config.chat,
                              dict(config.chat_template_kwargs))
  common = dict(max_new_tokens=config.max_new_tokens, sampling=sampling, seed=config.seed,
                eos_token_ids=model.eos_token_ids, max_len=config.max_len)
  spec_stats = None
  common.update(stop_strings=config.stop, tokenizer=model.tokenizer)
  dec = build_decoder(config, model, mesh)
  if config.method != "ar":
    load_s = time.perf_counter() - t0
  main_process = jax.process_index() == 0  # under jax.distributed, process 0 reports
  if config.rows is not None:  # a finished row takes the next prompt
    res = dec.generate_continuous(prompt_ids, rows=config.rows, **common)
  else:
    streamer = None
    if config.stream and main_process:
      from transformers import TextStreamer

      streamer = TextStreamer(model.tokenizer, skip_prompt=True, skip_special_tokens=True)
    res = dec.generate(prompt_ids, **common, streamer=streamer)
  if config.method != "ar":
    st = res.stats
    spec_stats = {"tau": st.tau, "acceptance_rate": st.acceptance_rate,
                  "target_forwards": st.target_forwards + 1,  # + prefill
                  "drafted_per_step_row": st.drafted, "accepted_per_step_row": st.accepted}
    # crossvocab: n-gram merges, drafter tokens, the cache's size; pld: steps that matched
    spec_stats.update(dec.run_record(res))
    if config.time_split:
      split = step_split(dec, batch_size=len(prompt_ids), max_len=dec.cache_len(
          max(map(len, prompt_ids)), config.max_new_tokens, config.max_len))
      spec_stats["time_split_per_step"] = split.as_dict()
      spec_stats["time_split"] = run_split(split, st.target_forwards, res.decode_s,
                                           **skipped_drafting(st))
  texts = [model.tokenizer.decode(t, skip_special_tokens=True) for t in res.tokens]
  if not config.quiet and not config.stream and main_process:
    for i, text in enumerate(texts):
      if len(texts) > 1:
        print(f"--- [{i}] ---")
      print(text)
  stats = {
      "target": model.source,
      "config": dataclasses.asdict(model.config),
      "settings": {**{k: v for k, v in dataclasses.asdict(config).items() if k != "output"},
                   "params": dataclasses.asdict(method_spec(config)[1])},  # with defaults
      "dtype": dtype_name(model.dtype),
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
                              epilog=methods_help(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", required=True,
                 help="HF dir, .gguf file, registry name or hub id (org/name[@revision])")
  p.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
  p.add_argument("--method", default="ar", choices=sorted(METHODS),
                 help="a registered decoding method (default ar: plain autoregressive); its "
                      "parameters are listed below")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="a parameter of --method under the registry's name (repeatable), e.g. "
                      "--method chain --set gamma=4 --set subset=sub.npz")
  p.add_argument("--draft", help="drafter: HF dir, .gguf or registry name (same vocabulary, "
                 "or another tokenizer's with --method crossvocab)")
  p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
  p.add_argument("--chat-kwarg", action="append", default=[], metavar="KEY=VALUE",
                 help="a chat template variable (repeatable), e.g. enable_thinking=false "
                      "for Qwen3's template")
  p.add_argument("--max-new-tokens", type=int, default=64,
                 help="tokens to generate per prompt (default 64)")
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--top-k", type=int, default=0, help="sampling: 0 = off")
  p.add_argument("--top-p", type=float, default=1.0,
                 help="nucleus sampling mass in (0, 1]; 1 = off (with --temperature > 0)")
  p.add_argument("--draft-outside-set", action="store_true",
                 help="drafters sample from their temperature-only law, not within the "
                      "request's top-k / top-p (output unchanged; acceptance lower)")
  p.add_argument("--seed", type=seed_arg, default=0,
                 help="random seed of sampling (greedy output does not depend on it)")
  p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
  p.add_argument("--max-len", type=int, default=None, help="KV cache slots per row")
  p.add_argument("--dtype", default="auto", help="auto (a GGUF file's own quantized blocks on one CPU "
                 "device; else f32 on CPU, bf16 on GPU/TPU), f32 (a GGUF file's values "
                 "dequantized), bf16, "
                 "int8 (weight-only int8 with per-row scales; activations stay f32), int4 "
                 "(weight-only, any checkpoint quantized into Q4_0 blocks: groups of 32 weights, "
                 "a float16 scale each), gguf (a GGUF file's own quantized blocks, kept as "
                 "stored), gguf-q8 (those blocks multiplied as llama.cpp does: activations "
                 "quantized to 8 bits, integer dot products; CPU)")
  p.add_argument("--draft-dtype", help="the drafter's weights (default: --dtype); the target "
                 "verifies, so output stays exact")
  p.add_argument("--output", help="write token ids and timing here as JSON")
  p.add_argument("--time-split", action="store_true",
                 help="after the run, time the step's parts (drafter, drafter LM head, "
                      "verification) as separate programs and add the split to the stats")
  p.add_argument("--quiet", action="store_true",
                 help="print neither the text nor the downloads' and checksums' bars")
  p.add_argument("--stream", action="store_true",
                 help="print the text as it is generated (one prompt): a speculative step "
                      "prints its whole accepted block at once")
  p.add_argument("--rows", type=int, default=None,
                 help="continuous batching (every method): this many cache rows decode the "
                      "prompts and a finished row takes the next one (default: one batch)")
  p.add_argument("--batch-size", type=int, default=None,
                 help="repeat the prompts cyclically to this many rows")
  p.add_argument("--mesh", help="run on a device mesh, e.g. data=1,model=8 (tensor-parallel "
                 "target and drafter, batch rows over data)")
  add_allow_bin_argument(p)
  distributed.add_arguments(p)
  a = p.parse_args(argv)
  allow_bin_from_args(a)
  with hub.showing_progress(False if a.quiet else None):  # --set may name files by hub id
    return _config(a)


def _config(a) -> GenerateConfig:
  return GenerateConfig(target=a.target, prompts=tuple(a.prompt), method=a.method,
                        params=parse_set(a.set, a.method), draft=a.draft, chat=a.chat,
                        chat_template_kwargs=parse_chat_kwargs(a.chat_kwarg),
                        max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                        top_k=a.top_k, top_p=a.top_p, draft_in_set=not a.draft_outside_set,
                        seed=a.seed, stop=tuple(a.stop),
                        max_len=a.max_len, dtype=a.dtype, draft_dtype=a.draft_dtype,
                        output=a.output, quiet=a.quiet, stream=a.stream,
                        time_split=a.time_split,
                        batch_size=a.batch_size, rows=a.rows, mesh=a.mesh,
                        coordinator=a.coordinator, num_processes=a.num_processes,
                        process_id=a.process_id)


def cli(argv=None) -> int:
  """The command line: a user's mistake is one `error:` line, exit 2."""
  try:
    main(parse_args(argv))
  except (ValueError, FileNotFoundError, KeyError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    full = disk_full(e)
    if full is None:
      raise
    print(f"error: {disk_full_message(full)}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(cli())
