"""Decoding loops: autoregressive now; chain and tree speculative decoding build on it."""

from vocabjax.decoding.autoregressive import Decoder, GenerationResult, generate
from vocabjax.decoding.sampling import SamplingParams, log_probs, sample

__all__ = ["Decoder", "GenerationResult", "SamplingParams", "generate", "log_probs", "sample"]
