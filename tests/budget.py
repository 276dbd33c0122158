"""The suite's own clock: a test that takes longer than its budget fails, so the suite cannot drift back.

The budget (`--budget-seconds`, else PARITY_TEST_BUDGET_S, else 60 s) holds for each phase of a test:
its setup (a module fixture it is the first to need included) and its call, as
measured on the 2-core CI machine with both cores busy (`make test` runs two
xdist workers). Tests marked `gpu` are exempt: they run on the device, whose
suite has its own figures (README); so are tests marked `costly`, which make
test leaves to make test-costly. `make test` also prints the 15 slowest.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_BUDGET_S = 60.0


def budget_seconds() -> float:
    return float(os.environ.get("PARITY_TEST_BUDGET_S") or DEFAULT_BUDGET_S)


def pytest_addoption(parser):
    parser.addoption("--budget-seconds", type=float, default=None,
                     help="fail a test whose setup or call takes longer (default: PARITY_TEST_BUDGET_S, else 60)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    budget = item.config.getoption("budget_seconds") or budget_seconds()
    exempt = "gpu" in item.keywords or "costly" in item.keywords
    if call.when == "teardown" or not report.passed or exempt or call.duration <= budget:
        return
    report.outcome = "failed"
    report.longrepr = (f"{item.nodeid}: its {call.when} took {call.duration:.1f} s, over the budget of {budget:g} s "
                       f"a test phase (tests/budget.py, PARITY_TEST_BUDGET_S): make it cheaper or split it")
