"""Drafter-vocabulary policies: the policy contract and the full policy (`policy.py`), static
subsets with d2t / t2d and their selection rules (`subset.py`), the trimmed drafter head
over a subset (`trimmed.py`), SpecVocab's ranked per-step vocabulary (`ranked.py`), and
OmniDraft's translation between two tokenizers (`translate.py`: the direct map, the n-gram
cache, reverse translation). Calibration counting lives in `vocabjax.calibrate`."""

from vocabjax.vocab.subset import SubsetError, VocabSubset, select
from vocabjax.vocab.translate import NgramCache, TranslationError, Translator, build_vocab_map

__all__ = ["NgramCache", "SubsetError", "TranslationError", "Translator", "VocabSubset",
           "build_vocab_map", "select"]
