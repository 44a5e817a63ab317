"""The contract every decoder keeps: what `python -m vocabjax.eval`, `python -m
vocabjax.generate` and the bench ask of a decoding method, instead of probing it with
`hasattr`.

A speculative method is a proposer (`vocabjax.decoding.proposer`) run by the one engine
(`vocabjax.decoding.speculative.SpeculativeEngine`), registered beside its parameters
(`vocabjax.methods.register`); `DecodingMethod` is what plain decoding and the engine share.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Sequence

from vocabjax.sampling import SamplingParams


@dataclasses.dataclass
class GenerationResult:
  """Generated ids per row (prompt excluded) and where the time went."""

  tokens: list[list[int]]  # new token ids per row, EOS included when hit
  finish_reasons: list[str]  # "eos", "stop" or "length" per row
  prompt_lengths: list[int]
  compile_s: float  # ahead-of-time compilation of prefill and step (0 when cached)
  prefill_s: float  # prefill plus the first sampled token
  decode_s: float  # every later step
  steps: int  # decode steps run (= target forwards after prefill)
  stats: Any = None  # speculative methods: a SpecStats (per-step drafted/accepted counts)

  @property
  def num_generated(self) -> int:
    return sum(len(t) for t in self.tokens)

  @property
  def tokens_per_s(self) -> float:
    """Generated tokens / (prefill + decode) wall time, compilation excluded."""
    total = self.prefill_s + self.decode_s
    return self.num_generated / total if total > 0 else float("nan")

  @property
  def decode_tokens_per_s(self) -> float:
    """Tokens after the first / decode wall time (batch rows counted)."""
    n = self.num_generated - len(self.tokens)
    return n / self.decode_s if self.decode_s > 0 else float("nan")


class DecodingMethod(abc.ABC):
  """A decoder: `generate` plus what a caller needs to size caches, time a step's parts and
  record method-specific counts."""

  method: str = "decoder"  # the registry name (`vocabjax.methods.METHODS`)
  extra_slots: int = 0  # cache slots one step may write past max_new_tokens

  @abc.abstractmethod
  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(), seed: int = 0,
               eos_token_ids: Sequence[int] = (), max_len: int | None = None,
               stop_strings: Sequence[str] = (), tokenizer=None,
               streamer=None) -> GenerationResult:
    """Generate up to `max_new_tokens` per prompt; greedy output equals plain decoding's.
    `streamer` (one prompt): transformers' streamer protocol, `put(ids)` with the prompt and
    then the tokens as they are kept, `end()` when done (`transformers.TextStreamer(tokenizer,
    skip_prompt=True)` prints the text as it comes; its calls count in `decode_s`)."""

  @property
  def times_step_parts(self) -> bool:
    """Whether `vocabjax.decoding.profile.step_split` can time this method's step parts (its
    drafter's calls and the verification): methods with a compiled drafter say so."""
    return False

  def compiled_programs(self) -> dict:
    """{`engine.ProgramKey`: compiled program} of every program this decoder has used so far
    (for inspecting their HLO, collectives, memory; the programs themselves live in the
    process's `engine.PROGRAMS`)."""
    return dict(self._programs.items())

  def run_record(self, result: GenerationResult) -> dict:
    """Method-specific counts of one finished run for an eval record or generate's report
    (e.g. prompt lookup's matched steps, cross-vocabulary n-gram merges): the run's stats'
    own `record()` where it has stats, {} where it has none."""
    return result.stats.record() if result.stats is not None else {}
