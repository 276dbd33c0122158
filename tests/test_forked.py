"""Isolation by fork (parity/harness/forked.py): results in order, a child's failure named, a hang bounded."""

from __future__ import annotations

import os
import time

import pytest

from parity.harness.forked import ForkedError, fork_map
from parity.harness.release import frozen_heap


def _square_in_a_child(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_results_come_back_in_order_each_from_a_process_of_its_own():
    seen = []
    results = fork_map(_square_in_a_child, range(5), jobs=2, on_result=lambda item, result: seen.append(item))
    assert [value for value, _ in results] == [0, 1, 4, 9, 16]
    assert sorted(seen) == [0, 1, 2, 3, 4], "each result is announced in this process as it comes back"
    pids = {pid for _, pid in results}
    assert len(pids) == 5 and os.getpid() not in pids


def _fail_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("two is not allowed")
    if x == 3:
        os._exit(7)     # dies without a result
    return x


def test_a_child_that_raises_or_dies_is_named_with_its_cause():
    with pytest.raises(ForkedError, match="(?s)^2: .*ValueError: two is not allowed"):
        fork_map(_fail_on_two, [1, 2])
    outcomes = fork_map(_fail_on_two, [1, 2, 3], return_errors=True)
    assert outcomes[0] == 1
    assert isinstance(outcomes[1], ForkedError) and "ValueError" in str(outcomes[1])
    assert isinstance(outcomes[2], ForkedError) and "exited 7 without a result" in str(outcomes[2])


def test_a_child_past_its_timeout_is_killed():
    started = time.monotonic()
    [outcome] = fork_map(lambda _: time.sleep(60), [0], timeout=0.5, return_errors=True)
    assert isinstance(outcome, ForkedError) and "timed out after 0.5 s" in str(outcome)
    assert time.monotonic() - started < 30


def test_what_a_child_prints_goes_to_its_log(tmp_path):
    fork_map(lambda x: print(f"hello from {x}"), ["a"], log_dir=tmp_path)
    assert (tmp_path / "0.log").read_text() == "hello from a\n"


def test_a_frozen_heap_nests_and_is_released_once():
    import gc

    assert gc.get_freeze_count() == 0
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with frozen_heap():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0
