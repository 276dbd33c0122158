"""The overlapped loop through the user's path, `parity run --scenario scenarios/overlap.yaml`.

Marked `costly` (`make test-costly`, which CI runs after `make test`; minutes of
CPU: each STAGING_RACE diagnosis re-runs the mode a dozen times): every overlap fault of the catalog drifts in each mode it shows in,
named STAGING_RACE with its buffers, and passes elsewhere; overlap.yaml passes in
all five modes over ten seeds (no false alarm).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity.faults.catalog import FAULTS
from parity.graphs.modes import MODES
from tests.robustkit import call

pytestmark = pytest.mark.costly

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "overlap.yaml"
OVERLAP_FAULTS = [name for name, f in FAULTS.items() if f.scenario == "overlap"]


def run(tmp_path, *extra, scenario: Path = SCENARIO) -> dict:
    out = tmp_path / "run"
    code, _, err = call(["run", "--scenario", str(scenario), "--backend", "emulated", "--quiet", "--out", str(out),
                         *extra])
    assert code in (0, 1), err
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("name", OVERLAP_FAULTS)
def test_each_overlap_fault_is_named_where_it_shows(tmp_path, name):
    fault = FAULTS[name]
    summary = run(tmp_path, "--inject", name)
    assert summary["modes"]["eager"]["verdict"] == "pass"
    for mode in MODES[1:]:
        diagnosis = summary["diagnoses"].get(mode)
        if mode in fault.manifests_in:
            assert summary["modes"][mode]["verdict"] == "drift", mode
            assert diagnosis["kind"] == fault.kind and diagnosis["buffers"] == list(fault.buffers), diagnosis
            assert diagnosis["step"] is not None and diagnosis["phase"] and diagnosis["experiment"]
        else:
            assert summary["modes"][mode]["verdict"] == "pass" and diagnosis is None, mode


@pytest.mark.parametrize("seed", range(10))
def test_overlap_scenario_passes_over_ten_seeds(tmp_path, seed):
    """overlap.yaml with sampled drafts (temperature 0.8), so that each seed draws other tokens."""
    text = SCENARIO.read_text().replace("temperature: 0.0", "temperature: 0.8")
    text = text.replace("prompts: prompts/", f"prompts: {SCENARIO.parent}/prompts/")
    sampled = tmp_path / "overlap-sampled.yaml"
    sampled.write_text(text)
    summary = run(tmp_path, "--seed", str(seed), scenario=sampled)
    assert summary["verdict"] == "pass", {m: v["verdict"] for m, v in summary["modes"].items()}
