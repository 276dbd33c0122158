"""The one-variable search both diagnosers run (`parity.audit.one_variable`): the control first, each candidate
alone, then delta debugging; on hand-made `restores` callables, no engine and no capture."""

from __future__ import annotations

from parity.audit.delta_debug import ddmin
from parity.audit.one_variable import search


def test_ddmin_finds_the_one_minimal_set_in_few_tests():
    calls = []

    def holds(subset):
        calls.append(subset)
        return {3, 11} <= set(subset)

    assert sorted(ddmin(range(16), holds)) == [3, 11]
    assert len(calls) <= 16 * 16, "ddmin is at worst quadratic in the items, never every subset (2**16)"
    assert ddmin([5], lambda s: True) == [5]


def recorder(cause):
    """restores(subset): parity comes back exactly when every candidate of `cause` is at its live value."""
    calls = []

    def restores(subset):
        calls.append(sorted(subset))
        return set(cause) <= set(subset)
    return restores, calls


def test_the_control_runs_first_and_a_restoring_control_stops_the_search():
    restores, calls = recorder(cause=[])
    found = search(["a", "b"], restores)
    assert found.control and found.singles == [] and found.restoring == [] and calls == [[]]


def test_each_candidate_is_tried_alone_in_order_and_every_restoring_one_is_kept():
    found = search(["a", "b", "c"], lambda subset: subset in (["b"], ["c"]))
    assert not found.control and found.singles == [("a", False), ("b", True), ("c", True)]
    assert found.restoring == ["b", "c"] and found.smallest == []


def test_first_stops_at_the_first_candidate_that_restores_parity():
    restores, calls = recorder(cause=["b"])
    found = search(["a", "b", "c"], restores, first=True)
    assert found.restoring == ["b"] and calls == [[], ["a"], ["b"]]


def test_minimise_finds_the_smallest_set_only_when_no_single_one_restores_parity():
    restores, _ = recorder(cause=["b", "d"])
    assert sorted(search(list("abcde"), restores, minimise=True).smallest) == ["b", "d"]
    assert search(list("abcde"), restores).smallest == [], "without minimise, singles only"
    found = search(["a", "b"], lambda subset: False, minimise=True)
    assert found.restoring == [] and found.smallest == [], "nothing restores parity: nothing is named"


def test_no_candidates_still_runs_the_control():
    restores, calls = recorder(cause=["x"])
    found = search([], restores)
    assert not found.control and found.singles == [] and calls == [[]]


def test_together_repairs_a_known_divergence_all_at_once_first_then_alone_then_smallest():
    restores, calls = recorder(cause=["c"])
    found = search(["a", "c", "b"], restores, together=True)
    assert calls[0] == ["a", "b", "c"] and [] not in calls, "no control: the run is known to diverge"
    assert found.restoring == ["c"] and not found.control
    restores, calls = recorder(cause=["x"])
    assert search(["a", "b"], restores, together=True).singles == [] and len(calls) == 1, \
        "all together do not restore parity: none is tried alone"
    restores, calls = recorder(cause=["a"])
    assert search(["a"], restores, together=True).restoring == ["a"] and len(calls) == 1
    assert search([], lambda s: 1 / 0, together=True).singles == [], "no repair: nothing runs"
    restores, _ = recorder(cause=["a", "b"])
    assert sorted(search(list("abc"), restores, together=True, minimise=True).smallest) == ["a", "b"]
