"""A graph mode whose engine raises is a verdict of that mode (harness/crashes.py), the tool's own errors are not."""

from __future__ import annotations

import pytest


def _raise_in(module_globals: dict, code: str):
    exec(compile(code, module_globals["__file__"], "exec"), module_globals)


def test_an_engine_exception_is_named_by_its_engine_line():
    from parity.engine import tree
    from parity.harness.crashes import engine_crash

    try:   # the engine's own assertion, reached through the engine's code
        tree.select_tree(*_bad_tree_args())
    except AssertionError as error:
        crash = engine_crash(error, step=7)
    assert crash is not None and crash["step"] == 7
    assert crash["source"].startswith("parity/engine/tree.py:") and crash["function"].endswith("select_tree")
    assert "AssertionError" in crash["error"] and "parent" in crash["code"]


def test_an_exception_in_the_tools_own_code_is_not_a_verdict():
    from parity.harness import gate
    from parity.harness.crashes import engine_crash

    scope = {"__file__": gate.__file__, "__name__": "fake"}
    with pytest.raises(ValueError) as raised:
        _raise_in(scope, "raise ValueError('the harness itself')")
    assert engine_crash(raised.value, step=0) is None


def test_the_tools_own_exception_raised_through_the_engine_is_not_a_verdict():
    from parity.engine import tree
    from parity.graphs import rank_guard
    from parity.harness.crashes import engine_crash

    tool = {"__file__": rank_guard.__file__, "__name__": "fake"}
    _raise_in(tool, "def check():\n    raise RuntimeError('a verdict of the tool')\n")
    engine = {"__file__": tree.__file__, "__name__": "fake", "check": tool["check"]}
    _raise_in(engine, "def forward():\n    check()\n")
    with pytest.raises(RuntimeError) as raised:
        engine["forward"]()
    assert engine_crash(raised.value, step=0) is None


def test_a_crashed_mode_drifts_with_the_reason_and_a_failing_gate_check():
    from types import SimpleNamespace

    from parity.analysis.compare import refused_comparison
    from parity.harness.gate import run_checks

    crash = {"step": 3, "error": "AssertionError: boom", "source": "parity/engine/tree.py:47",
             "function": "select_tree", "code": "assert parent < 0"}
    run = SimpleNamespace(short_buffers=None, capture_error=None, wrong_graph=None, crashed=crash)
    eager = SimpleNamespace(drafts=__import__("pandas").DataFrame(
        {"step": [], "req_id": [], "draft_index": [], "num_accepted": []}))
    cmp = refused_comparison("full", eager, 2, run)
    assert cmp.verdict == "drift" and any("parity/engine/tree.py:47" in r for r in cmp.reasons)
    checks = run_checks({"full": run})
    assert [c.passed for c in checks] == [False] and "step 3" in checks[0].message


def _bad_tree_args():
    """Arguments to tree.select_tree whose kept candidate names a parent never kept."""
    return [1, 2], [0.0, -1.0], [-1, 5], 2
