"""The suite's guard against leftover torch modes: a test module that ends (its module fixtures torn down) with
more dispatch or function modes on the stacks than it began with fails its last test, naming them.

A mode left on sends every op of every later test in that worker through Python. The audit's watcher, left on
by audits that had died, made the engine tests of `make test` twice as slow, test by test, and no test run
alone showed it. (Within a module a fixture may hold an audit, and its watcher, alive on purpose.)
"""

from __future__ import annotations

import gc

import pytest
import torch

_MODULE: dict = {}       # the module running now: its path, the stacks before its fixtures, whether it ends


def _stacks() -> tuple[list[str], list[str]]:
    dispatch = [type(torch._C._get_dispatch_stack_at(i)).__name__ for i in range(torch._C._len_torch_dispatch_stack())]
    function = [type(torch._C._get_function_stack_at(i)).__name__ for i in range(torch._C._len_torch_function_stack())]
    return dispatch, function


def _grew(before, after) -> bool:
    return len(after[0]) > len(before[0]) or len(after[1]) > len(before[1])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _MODULE.get("path") != item.path:      # NOTE: before this module's fixtures are set up
        _MODULE.update(path=item.path, before=_stacks())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    _MODULE["ends"] = nextitem is None or nextitem.path != item.path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "teardown" or not _MODULE.get("ends") or _MODULE.get("path") != item.path:
        return
    before, after = _MODULE.pop("before"), _stacks()
    _MODULE.clear()
    if not report.passed:
        return
    if _grew(before, after):
        gc.collect()      # NOTE: an audit in a reference cycle takes the audit's watcher off when it is collected
        after = _stacks()
    if _grew(before, after):
        report.outcome = "failed"
        report.longrepr = (f"{item.path.name} left torch modes on the stacks (dispatch, function): {after}, it began "
                           f"with {before}; every later test in this worker would run its ops through them")
