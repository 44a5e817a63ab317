"""Decoding loops on one pure-functional engine: autoregressive (`autoregressive`), chain and
EAGLE-2 tree speculative decoding with a drafter of the same vocabulary (`speculative`, `tree`,
`verify`), EAGLE-3 heads (`eagle`), Medusa heads (`medusa`), prompt lookup (`pld`), cross-vocabulary drafting
(`crossvocab`, `adaptive`), the decoder contract (`base`) and the per-step time split (`profile`)."""

from vocabjax.decoding.autoregressive import (Decoder, GenerationResult, NonFiniteLogitsError,
                                              generate)
from vocabjax.decoding.crossvocab import CrossVocabDecoder
from vocabjax.decoding.eagle import EagleDecoder
from vocabjax.decoding.medusa import MedusaDecoder
from vocabjax.decoding.pld import PromptLookupDecoder
from vocabjax.sampling import SamplingParams, log_probs, sample
from vocabjax.decoding.speculative import ChainDecoder, TreeDecoder
from vocabjax.decoding.tree import TreeParams

__all__ = ["ChainDecoder", "CrossVocabDecoder", "Decoder", "EagleDecoder", "GenerationResult",
           "MedusaDecoder", "NonFiniteLogitsError", "PromptLookupDecoder", "SamplingParams", "TreeDecoder", "TreeParams", "generate",
           "log_probs", "sample"]
