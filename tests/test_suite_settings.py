"""The suite's compile setting (tests/conftest.py): a fast run compiles its CPU programs with
LLVM at -O0 and XLA:CPU's older emitters through XLA_FLAGS and leaves the tests that need
users' settings (marked `integration` or `full_opt`) to a full run, which compiles everything
as users' programs are compiled."""

import os

import pytest

from tests.helpers.compile import (FAST_COMPILE, FAST_XLA_OPTIONS, USERS_SETTINGS,
                                   subprocess_xla_flags)


def _set_flags() -> dict[str, str]:
  """{name: value} of the XLA_FLAGS this process runs with."""
  out = {}
  for flag in os.environ.get("XLA_FLAGS", "").split():
    name, _, value = flag.lstrip("-").partition("=")
    out[name] = value
  return out


def test_the_flags_follow_the_setting():
  flags = _set_flags()
  for k, v in FAST_XLA_OPTIONS.items():
    assert (flags.get(k) == str(v).lower()) == FAST_COMPILE, (k, flags)
  assert flags["xla_force_host_platform_device_count"] == "8"
  # a subprocess gets the same setting, with the devices it asks for
  sub = subprocess_xla_flags(2).split()
  assert sub[0] == "--xla_force_host_platform_device_count=2"
  assert all(
      (f"--{k}={str(v).lower()}" in sub) == FAST_COMPILE for k, v in FAST_XLA_OPTIONS.items())


def test_a_fast_run_leaves_out_what_needs_users_settings(pytester):
  """Collected in a fast run, marked tests are deselected (never run at the fast setting)."""
  pytester.makeconftest("from tests.helpers.compile import leave_to_full_run\n\n\n"
                        "def pytest_collection_modifyitems(config, items):\n"
                        "  leave_to_full_run(config, items)\n")
  pytester.makepyfile(test_marks="""
      import pytest

      def test_plain():
        pass

      @pytest.mark.integration
      def test_integration():
        raise AssertionError("ran at the fast setting")

      @pytest.mark.full_opt
      def test_full_opt():
        raise AssertionError("ran at the fast setting")
  """)
  result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-W", "ignore")
  if FAST_COMPILE:
    result.assert_outcomes(passed=1, deselected=2)
  else:
    result.assert_outcomes(passed=1, failed=2)
  assert set(USERS_SETTINGS) == {"integration", "full_opt"}


@pytest.mark.full_opt
def test_marked_tests_run_at_users_settings():
  assert not set(FAST_XLA_OPTIONS) & set(_set_flags())
