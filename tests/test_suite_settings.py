"""The suite's compile setting (tests/conftest.py): on the CPU, tests compile with most of XLA's
optimizations off unless marked `full_opt`, which compile as users' programs are compiled; the
tests' subprocesses inherit the setting."""

import os

import jax
import pytest
from jax._src import compiler

from tests.conftest import FAST_COMPILE


def _llvm_level():
  return compiler.get_compile_options(1, 1).executable_build_options.debug_options \
      .xla_backend_optimization_level


def test_unmarked_tests_compile_fast_on_the_cpu():
  assert jax.config.values["jax_disable_most_optimizations"] == FAST_COMPILE
  assert (_llvm_level() == 0) == FAST_COMPILE
  assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == ("1" if FAST_COMPILE else "0")


@pytest.mark.full_opt
def test_marked_tests_compile_as_users_do():
  assert not jax.config.values["jax_disable_most_optimizations"]
  assert _llvm_level() != 0
