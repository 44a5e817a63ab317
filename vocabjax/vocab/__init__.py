"""Drafter-vocabulary policies: the policy contract and the full policy (`policy.py`), static
subsets with d2t / t2d, their selection rules and the trimmed drafter head over a subset
(`subset.py`), SpecVocab's ranked per-step vocabulary (`ranked.py`), and
OmniDraft's translation between two tokenizers (`translate.py`: the direct map, the n-gram
cache, reverse translation). Calibration counting lives in `vocabjax.calibrate`."""

from vocabjax.vocab.ranked import Ranker, RankerError, SpeculativeVocab, svd_ranker
from vocabjax.vocab.subset import SubsetError, VocabSubset, select
from vocabjax.vocab.translate import NgramCache, TranslationError, Translator, build_vocab_map

__all__ = ["NgramCache", "Ranker", "RankerError", "SpeculativeVocab", "SubsetError",
           "TranslationError", "Translator", "VocabSubset", "build_vocab_map", "select",
           "svd_ranker"]
