"""Decoding on one pure-functional engine: plain autoregressive decoding (`autoregressive`) and
speculative decoding (`speculative.SpeculativeEngine`) running a proposer (`proposer`: the
contract and its capabilities), one file per proposer: a drafter model's chain or EAGLE-2 tree
(`drafter`), EAGLE heads (`eagle`), Medusa heads (`medusa`), prompt lookup (`pld`), an n-gram
table (`ngram`), SuffixDecoding (`suffix`), device and host trees merged (`hybrid`), a drafter
with another tokenizer (`crossvocab`); verification (`verify`, `tree`), the decoder contract
(`base`) and the per-step time split (`profile`)."""

from vocabjax.decoding.autoregressive import Decoder, generate
from vocabjax.decoding.base import GenerationResult
from vocabjax.decoding.crossvocab import CrossVocabProposer
from vocabjax.decoding.drafter import ChainProposer, TreeProposer
from vocabjax.decoding.eagle import EagleProposer
from vocabjax.decoding.engine import NonFiniteLogitsError
from vocabjax.decoding.medusa import MedusaProposer
from vocabjax.decoding.pld import LookupProposer
from vocabjax.decoding.proposer import Proposer
from vocabjax.decoding.speculative import SpeculativeEngine
from vocabjax.decoding.tree import TreeParams
from vocabjax.sampling import SamplingParams, log_probs, sample

__all__ = ["ChainProposer", "CrossVocabProposer", "Decoder", "EagleProposer", "GenerationResult",
           "LookupProposer", "MedusaProposer", "NonFiniteLogitsError", "Proposer",
           "SamplingParams", "SpeculativeEngine", "TreeParams", "TreeProposer", "generate",
           "log_probs", "sample"]
