"""Every catalogued fault x every mode, through the same path `parity run` takes.

Where a fault shows on its home scenario, the run drifts and the diagnosis
names the fault's kind and buffers; everywhere else (eager, PIECEWISE for
attention-metadata faults, ...) nothing is flagged. The harness is told
nothing about which fault is active: it only sees engines built from the
scenario and the injected names.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from parity.faults.catalog import FAULTS
from parity.faults.matrix import run_matrix
from parity.graphs.modes import MODES

ROOT = Path(__file__).resolve().parent.parent
GRAPH_MODES = [m for m in MODES if m != "eager"]


@pytest.fixture(scope="module")
def matrix():
    return run_matrix("tiny-llama3-eagle", "emulated", scenarios_dir=ROOT / "scenarios")


@pytest.mark.parametrize("name", list(FAULTS))
def test_fault_is_found_where_it_shows_and_nowhere_else(matrix, name):
    fault = FAULTS[name]
    summary = matrix[name]
    assert summary["modes"]["eager"]["verdict"] == "pass"
    for mode in GRAPH_MODES:
        verdict = summary["modes"][mode]["verdict"]
        diagnosis = summary["diagnoses"].get(mode)
        if mode in fault.manifests_in and fault.kind == "NOT_EXERCISED":
            assert verdict == "not_exercised", f"{name} in {mode}: {verdict}"
        elif mode in fault.manifests_in:
            assert verdict == "drift", f"{name} did not show in {mode}"
            assert diagnosis is not None and diagnosis["kind"] == fault.kind, (mode, diagnosis)
            assert set(fault.buffers) <= set(diagnosis["buffers"]), (mode, diagnosis["buffers"])
            # Named only by an experiment that isolated it: the diagnosis says which.
            assert diagnosis["experiment"], (mode, diagnosis["evidence"])
            assert diagnosis["phase"] is not None
            # A capacity shortfall is found before capture, at no step; every other kind at the step it showed.
            assert (diagnosis["step"] is None) == (fault.kind == "SHORT_BUFFER"), diagnosis
        else:
            assert verdict == "pass", f"{name} flagged in {mode}: {summary['modes'][mode]['reasons']}"
            assert diagnosis is None


@pytest.mark.parametrize("name", list(FAULTS))
def test_bisection_stays_within_its_replay_budget(matrix, name):
    named_buffers = 8 + 16   # the target's and the drafter's registries
    budget = 2 * math.ceil(math.log2(named_buffers)) + 4
    for mode, diagnosis in matrix[name]["diagnoses"].items():
        assert diagnosis["replays"] <= budget, (mode, diagnosis["replays"])


def test_the_detector_never_reads_fault_switches():
    """The analysis may not look at which bugs an engine was built with."""
    for path in (ROOT / "parity" / "analysis").glob("*.py"):
        text = path.read_text()
        assert not re.search(r"\bfaults?\b|FAULTS|catalog", text), f"{path.name} mentions the fault switches"
