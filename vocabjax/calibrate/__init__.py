"""Calibration for static drafter vocabularies (VocabTrim, FR-Spec): sharded token counting,
counts files and plots. CLI: `python -m vocabjax.calibrate {count,select,plot}`."""

from vocabjax.calibrate.counting import TokenCounter, count_tokens, token_mesh
from vocabjax.calibrate.counts import (CalibrationError, Counts, coverage, plot, special_ids,
                                       tokenizer_identity)
from vocabjax.calibrate.run import CountJob, run_count

__all__ = ["CalibrationError", "CountJob", "Counts", "TokenCounter", "count_tokens", "coverage",
           "plot", "run_count", "special_ids", "token_mesh", "tokenizer_identity"]
