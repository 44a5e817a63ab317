"""Which tests a run takes: the core (the README's test command) or the extended tests
(`--extended only`, `.ci/run`'s second step), by the `extended` mark.

`@pytest.mark.extended` marks a test as extended; `@pytest.mark.extended(params=[ids])` only
those of its parametrized cases (pytest's case ids, as `[...]` shows them in a node id), the
others staying in the core. Extended tests are end-to-end pipelines (training recipes, suites
through the command line), comparisons with reference implementations beyond one per method,
and further configurations of a property the core already checks."""

from __future__ import annotations

import pytest

EXTENDED_MODES = ("no", "also", "only")


def is_extended(item) -> bool:
  mark = item.get_closest_marker("extended")
  if mark is None:
    return False
  only = mark.kwargs.get("params")
  if only is None:
    return True
  callspec = getattr(item, "callspec", None)
  return callspec is not None and callspec.id in only


def check_extended_params(items) -> None:
  """A case id named in `extended(params=...)` that no collected case has is a typo: refused,
  so that a renamed case cannot slip out of both runs' sight unnoticed."""
  seen: dict = {}
  for item in items:
    mark = item.get_closest_marker("extended")
    if mark is not None and "params" in mark.kwargs:
      callspec = getattr(item, "callspec", None)
      key = (item.module.__name__ if item.module else "", item.originalname)
      ids, named = seen.setdefault(key, (set(), tuple(mark.kwargs["params"])))
      ids.add(callspec.id if callspec is not None else "")
  for (module, name), (ids, named) in seen.items():
    missing = [p for p in named if p not in ids]
    if missing:
      raise pytest.UsageError(f"{module}::{name}: extended(params=...) names cases it does not "
                              f"have: {missing} (its cases: {sorted(ids)})")


class ExtendedCheck:
  """`check_extended_params` over every collected case, before `-m` or `-k` deselect any (a
  plugin: `config.pluginmanager.register(ExtendedCheck())` in `pytest_configure`)."""

  @pytest.hookimpl(tryfirst=True)
  def pytest_collection_modifyitems(self, config, items):
    check_extended_params(items)


def select_extended(config, items) -> None:
  """Keep the core (`--extended no`, the default), both (`also`) or the extended tests alone
  (`only`), in place; the others deselected, as pytest reports deselected tests."""
  mode = config.getoption("extended")
  if mode == "also":
    return
  drop = [i for i in items if is_extended(i) != (mode == "only")]
  if drop:
    config.hook.pytest_deselected(items=drop)
    gone = set(drop)
    items[:] = [i for i in items if i not in gone]
