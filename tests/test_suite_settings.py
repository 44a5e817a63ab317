"""The suite's compile setting (tests/conftest.py): on the CPU, tests compile fast (LLVM -O0,
XLA:CPU's older elementwise emitters) unless marked `full_opt`, which compile as users'
programs are compiled."""

import jax
import pytest
from jax._src import compiler

from tests.conftest import FAST_COMPILE, FAST_XLA_OPTIONS


def _overrides():
  """The XLA options jax compiles a CPU program with now."""
  opts = compiler.get_compile_options(num_replicas=1, num_partitions=1,
                                      backend=jax.devices("cpu")[0].client)
  return dict(opts.env_option_overrides)


def test_unmarked_tests_compile_fast_on_the_cpu():
  got = _overrides()
  for k in FAST_XLA_OPTIONS:
    assert (k in got) == FAST_COMPILE, (k, got)


@pytest.mark.full_opt
def test_marked_tests_compile_as_users_do():
  assert not set(FAST_XLA_OPTIONS) & set(_overrides())


def test_tpu_programs_always_compile_as_users_do():
  """Only CPU programs are compiled fast: a deviceless TPU compile gets users' options."""
  from vocabjax.testing.tpu_aot import tpu_devices

  opts = compiler.get_compile_options(num_replicas=1, num_partitions=1,
                                      backend=tpu_devices("v5e:1x1")[0].client)
  assert not set(FAST_XLA_OPTIONS) & set(dict(opts.env_option_overrides))
