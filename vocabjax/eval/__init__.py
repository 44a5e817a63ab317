"""`python -m vocabjax.eval`: suites, metrics (defined once), reports, PyTorch comparison."""

from vocabjax.eval.config import ConfigError, DatasetSpec, EvalConfig, MethodSpec, load_config
from vocabjax.methods import METHODS, register
from vocabjax.eval.metrics import aggregate, mbsu
from vocabjax.eval.report import SUMMARY_SCHEMA, validate_summary
from vocabjax.eval.runner import run_suite

__all__ = ["ConfigError", "DatasetSpec", "EvalConfig", "METHODS", "MethodSpec",
           "SUMMARY_SCHEMA", "aggregate", "load_config", "mbsu", "register", "run_suite",
           "validate_summary"]
