"""Drafter-vocabulary policies. Now: static subsets (d2t / t2d) and their selection rules;
the trimmed drafter head and calibration counting come with issue 5."""

from vocabjax.vocab.subset import SubsetError, VocabSubset, select

__all__ = ["SubsetError", "VocabSubset", "select"]
