"""`parity run --verbose`'s last line: where the process's time went around the session (the 8B gate spends
tens of seconds outside its runs; this line says whether in start-up, the session or the report)."""

from __future__ import annotations

import sys
import time

import pytest

from parity.commands.memory import print_process, process_age


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_process_age_counts_from_the_process_start_and_moves_with_the_clock():
    first = process_age()
    time.sleep(0.05)
    second = process_age()
    assert 0 < first < second, (first, second)
    assert second - first >= 0.04


def test_the_line_splits_the_age_at_the_session(monkeypatch, capsys):
    monkeypatch.setattr("parity.commands.memory.process_age", lambda: 10.0)
    print_process(1.5, 7.25)
    assert capsys.readouterr().out == ("process: 1.50 s before the session (start-up, imports), session 5.75 s, "
                                       "report 2.75 s; 10.00 s so far\n")


def test_no_line_where_the_age_is_unknown(monkeypatch, capsys):
    monkeypatch.setattr("parity.commands.memory.process_age", lambda: None)
    print_process(1.5, 7.25)
    print_process(None, None)
    assert capsys.readouterr().out == ""
