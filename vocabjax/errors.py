"""Error types shared across layers (a leaf module: nothing of vocabjax imported here)."""

from __future__ import annotations



class ConfigError(ValueError):
  """A suite, method or run configuration that cannot be run; the message names the field and
  the value. Raised by the eval suites, the method registry, calibration and the trainers'
  dataset specs; the command lines print it as one `error:` line (exit 2)."""
