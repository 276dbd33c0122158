"""The suite's clock (tests/budget.py): a test over its budget fails; one within it passes; gpu tests are exempt."""

from __future__ import annotations


pytest_plugins = ["pytester"]

SLOW_SUITE = """
import time
import pytest

def test_quick():
    pass

def test_slow_call():
    time.sleep(0.6)

@pytest.fixture(scope="module")
def slow_fixture():
    time.sleep(0.6)

def test_slow_setup(slow_fixture):
    pass

@pytest.mark.gpu
def test_slow_on_the_device():
    time.sleep(0.6)
"""


def test_a_test_over_its_budget_fails_and_says_why(pytester):
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs CUDA\n")
    pytester.makepyfile(test_suite=SLOW_SUITE)
    result = pytester.runpytest_inprocess("-p", "budget", "-p", "no:cacheprovider", "--budget-seconds", "0.3")
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_slow_call: its call took *s, over the budget of 0.3 s*"])
    result.stdout.fnmatch_lines(["*test_slow_setup: its setup took *s, over the budget of 0.3 s*"])


def test_the_budget_defaults_to_a_minute_and_reads_the_environment(monkeypatch):
    import budget

    monkeypatch.delenv("PARITY_TEST_BUDGET_S", raising=False)
    assert budget.budget_seconds() == 60.0
    monkeypatch.setenv("PARITY_TEST_BUDGET_S", "90")
    assert budget.budget_seconds() == 90.0
