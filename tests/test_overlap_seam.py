"""The overlapped loop under the padding-numerics seam: ten seeds of overlap.yaml, five modes, no false alarm.

The seam (`parity/harness/simulated_numerics.py`) marks each padded forward with a flag its builder writes. In the
overlapped loop the flag is staged like every host-built input; written straight to the device (as it was), the
next batch's build overwrote it before the forward that reads it ran, and every graph mode of overlap.yaml drifted
against its padded reference (emulated backend, seed 0, 0.1, bf16), a false alarm of the seam's own making.
Marked `costly` (make test-costly): ten seeds of the false-alarm bench's cut of the scenario.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.harness.clean_alarms import clean_alarms, shipped_scenarios

pytestmark = pytest.mark.costly

OVERLAP = Path(__file__).resolve().parent.parent / "scenarios" / "overlap.yaml"


def test_overlap_is_in_the_false_alarm_bench():
    assert OVERLAP in shipped_scenarios()


def test_overlap_under_the_seam_passes_over_ten_seeds():
    result = clean_alarms(paths=[OVERLAP], seeds=10, requests=3, max_tokens=8, backend="emulated")
    assert result["mode_runs"] == 40 and result["false_alarms"] == 0, [
        (r["seed"], r["mode"]) for r in result["rows"] if r["verdict"] == "drift"]
    assert result["max_abs_logprob_diff"] > 0, "the seam moved the padded references"
