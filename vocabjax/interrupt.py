"""Ctrl-C between units of work, not inside an XLA call.

A KeyboardInterrupt raised while XLA runs a program can surface as another exception (JAX
wraps it, e.g. jax-ml/jax#9082) or leave a half-updated host loop. Long commands (eval
suites) run inside `deferred_interrupt()`: the first Ctrl-C only sets a flag and says that the
run stops after the current unit (a question: its record is written first); the loop calls
`check()` between units, which raises KeyboardInterrupt then. A second Ctrl-C interrupts at
once, as usual. Outside the main thread (where signal handlers cannot be set) it does nothing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

_state = {"requested": False, "active": False}


def requested() -> bool:
  """Whether a Ctrl-C was deferred (the loop decides how to stop)."""
  return _state["requested"]


def check() -> None:
  """Raise KeyboardInterrupt if a Ctrl-C was deferred: call between units of work."""
  if _state["requested"]:
    raise KeyboardInterrupt("interrupted by Ctrl-C (deferred to the end of a unit of work)")


@contextlib.contextmanager
def deferred_interrupt(message: str = "stopping after the current question (Ctrl-C again to "
                                      "stop at once)"):
  if threading.current_thread() is not threading.main_thread() or _state["active"]:
    yield
    return
  previous = signal.getsignal(signal.SIGINT)

  def handler(signum, frame):
    if _state["requested"]:  # the second one: at once
      signal.signal(signal.SIGINT, previous)
      raise KeyboardInterrupt
    _state["requested"] = True
    print(f"\n[vocabjax] Ctrl-C: {message}", file=sys.stderr, flush=True)

  _state.update(requested=False, active=True)
  signal.signal(signal.SIGINT, handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
    _state.update(requested=False, active=False)
