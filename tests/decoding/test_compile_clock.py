"""Compilation never lands in the speed figures: what JAX reports compiling (jax.monitoring's
duration events) inside a request's prefill or its steps moves from `prefill_s` / `decode_s` to
`compile_s`, once (a program the decoders' cache timed itself is not counted twice), in the
one-batch loop and in continuous batching alike."""

import time

import jax
import numpy as np
import pytest

from vocabjax.decoding.engine import (CompileClock, OutputCollector, Request, continuous_loop,
                                      fold_in, host_loop, split)

BACKEND = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"


def _request(B=1, n=2):
  fold_in(split(jax.random.key(0))[0], 1)  # compiled before: only the fakes compile in a loop
  out = OutputCollector(B, n)
  return Request([[1, 2]] * B, np.array([2] * B), 8, 2, np.zeros((B, 2), np.int32),
                 jax.random.key(0), out)


def _compiling(seconds, sleep, event=BACKEND):
  """Work that sleeps `sleep` s and reports `seconds` s of compilation."""
  time.sleep(sleep)
  jax.monitoring.record_event_duration_secs(event, seconds)


def test_compilation_inside_the_prefill_and_the_steps_is_compile_time():
  req = _request(n=3)

  def start():
    _compiling(0.25, 0.3)
    return np.array([5]), None

  def advance(carry, step, key, active):
    if step == 1:  # a helper jitted on first use: only the clock sees it
      _compiling(0.1, 0.15, TRACE)
      return carry, np.array([[6]]), 0.0
    _compiling(0.2, 0.25)  # a program the cache built and timed: both see it, counted once
    return carry, np.array([[7]]), 0.2

  with CompileClock() as every:  # the fakes and what JAX really compiles (fold_in's first use)
    res = host_loop(req, start, advance, compile_s=1.0)
  assert res.tokens == [[5, 6, 7]] and res.steps == 2
  assert 0.55 - 1e-9 <= res.compile_s - 1.0 <= every.seconds + 1e-9  # the 0.2 s program once
  assert res.prefill_s + 0.25 >= 0.3 and res.prefill_s < 0.3  # the sleep, less the compile
  assert res.decode_s + every.seconds - 0.25 >= 0.15 + 0.25  # the steps' sleeps, less theirs


def test_continuous_batching_takes_compilation_out_of_its_prefills_and_steps():
  req = _request(B=2, n=2)

  def fill(carry, b, i, key):
    if i is None:
      return carry, None, 0.0
    _compiling(0.2, 0.25)
    return carry, 3, 0.0

  def advance(carry, step, key, active):
    _compiling(0.1, 0.12)
    return carry, np.full((1, 1), 4), 0.0

  with CompileClock() as every:
    res = continuous_loop(req, 1, None, fill, advance, compile_s=0.0)
  assert res.tokens == [[3, 4], [3, 4]] and res.steps == 2
  # the fakes, and whatever else compiled inside the timed parts (not the keys split before)
  assert 2 * 0.2 + 2 * 0.1 - 1e-9 <= res.compile_s <= every.seconds + 1e-9
  assert res.prefill_s + 2 * 0.2 >= 2 * 0.25 and res.prefill_s < 2 * 0.25
  assert res.decode_s + 2 * 0.1 >= 2 * 0.12


def test_a_clock_counts_only_its_own_thread_and_span():
  import threading

  with CompileClock() as outer:
    jax.monitoring.record_event_duration_secs(BACKEND, 1.0)
    with CompileClock() as inner:
      jax.monitoring.record_event_duration_secs(TRACE, 0.5)
      jax.monitoring.record_event_duration_secs("/jax/other/event", 9.0)  # not a compile
    t = threading.Thread(target=lambda: jax.monitoring.record_event_duration_secs(BACKEND, 7.0))
    t.start()
    t.join()
  jax.monitoring.record_event_duration_secs(BACKEND, 3.0)  # after: no clock runs
  assert outer.seconds == pytest.approx(1.5) and inner.seconds == pytest.approx(0.5)
