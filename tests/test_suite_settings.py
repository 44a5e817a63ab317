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


_SELECTION_CONFTEST = (
    "from tests.helpers.selection import EXTENDED_MODES, ExtendedCheck, select_extended\n\n\n"
    "def pytest_configure(config):\n"
    "  config.pluginmanager.register(ExtendedCheck(), 'extended-check')\n\n\n"
    "def pytest_addoption(parser):\n"
    "  parser.addoption('--extended', choices=EXTENDED_MODES, default='no')\n\n\n"
    "def pytest_collection_modifyitems(config, items):\n"
    "  select_extended(config, items)\n")


@pytest.mark.parametrize("mode,passed", [("no", ["test_core", "test_cases[a]"]),
                                         ("only", ["test_extended", "test_cases[b]"]),
                                         ("also", ["test_core", "test_extended", "test_cases[a]",
                                                   "test_cases[b]"])])
def test_the_core_and_the_extended_tests_are_selected_by_their_mark(pytester, mode, passed):
  """The README's command runs the core, `--extended only` the marked tests and the named
  cases of a marked parametrized test (the rest of its cases stay in the core)."""
  pytester.makeconftest(_SELECTION_CONFTEST)
  pytester.makepyfile(test_sel="""
      import pytest

      def test_core():
        pass

      @pytest.mark.extended
      def test_extended():
        pass

      @pytest.mark.extended(params=["b"])
      @pytest.mark.parametrize("x", ["a", "b"], ids=["a", "b"])
      def test_cases(x):
        pass
  """)
  result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-W", "ignore", "-v",
                                        "--extended", mode)
  result.assert_outcomes(passed=len(passed), deselected=4 - len(passed))
  ran = {line.split("::")[1].split(" ")[0] for line in result.outlines if " PASSED" in line}
  assert ran == set(passed)


def test_cases_deselected_by_a_mark_expression_are_still_known_to_the_check(pytester):
  """`-m` deselects before the selection hook runs: the check sees every case all the same."""
  pytester.makeconftest(_SELECTION_CONFTEST)
  pytester.makepyfile(test_sel="""
      import pytest

      @pytest.mark.extended(params=["b"])
      @pytest.mark.parametrize("x", [pytest.param("a", marks=pytest.mark.other), "b"],
                               ids=["a", "b"])
      def test_cases(x):
        pass
  """)
  result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-W", "ignore", "-m", "other")
  result.assert_outcomes(passed=1, deselected=1)


def test_an_extended_case_that_does_not_exist_is_refused(pytester):
  pytester.makeconftest(_SELECTION_CONFTEST)
  pytester.makepyfile(test_sel="""
      import pytest

      @pytest.mark.extended(params=["c"])
      @pytest.mark.parametrize("x", ["a", "b"], ids=["a", "b"])
      def test_cases(x):
        pass
  """)
  result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-W", "ignore")
  assert result.ret == pytest.ExitCode.USAGE_ERROR
  assert ("ERROR: test_sel::test_cases: extended(params=...) names cases it does not have: "
          "['c'] (its cases: ['a', 'b'])") in result.stderr.lines
