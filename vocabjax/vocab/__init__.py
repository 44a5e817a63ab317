"""Drafter-vocabulary policies: the policy contract and the full policy (`policy.py`), static
subsets with d2t / t2d and their selection rules (`subset.py`), the trimmed drafter head
over a subset (`trimmed.py`), and SpecVocab's ranked per-step vocabulary (`ranked.py`).
Calibration counting lives in `vocabjax.calibrate`."""

from vocabjax.vocab.subset import SubsetError, VocabSubset, select

__all__ = ["SubsetError", "VocabSubset", "select"]
