"""Model shapes for the engine benchmark: configs alone, no weights.

A model is named as `vocabjax.checkpoints.known.resolve_config` takes it (a key of `KNOWN`, a
config.json or a directory holding one, a .gguf file or a cached registry model).

`PAIRS` are the target/drafter pairs the benchmark runs by default.
"""

from __future__ import annotations

from vocabjax.checkpoints.known import KNOWN, ShapeError, resolve_config

__all__ = ["KNOWN", "PAIRS", "ShapeError", "resolve_config"]

PAIRS: dict[str, tuple[str, str]] = {
    "qwen2.5-coder": ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"),
    "qwen2.5-7b": ("qwen2.5-7b-instruct", "qwen2.5-0.5b-instruct"),
    "llama-3.1-8b": ("llama-3.1-8b-instruct", "llama-3.2-1b-instruct"),
    "qwen3-8b": ("qwen3-8b", "qwen3-0.6b"),
    "gemma-3-1b": ("gemma-3-1b", "gemma-3-270m"),
    "gemma-3-4b": ("gemma-3-4b", "gemma-3-270m"),
}
