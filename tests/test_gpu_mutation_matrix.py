"""The fault x mode matrix with real CUDA graphs: the same expectations as on the emulated backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.faults.catalog import FAULTS
from parity.faults.matrix import run_matrix
from parity.graphs.modes import MODES

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def matrix():
    return run_matrix("tiny-llama3-eagle", "cuda", scenarios_dir=ROOT / "scenarios")


@pytest.mark.parametrize("name", list(FAULTS))
def test_cuda_matrix_matches_the_catalog(matrix, name):
    fault, summary = FAULTS[name], matrix[name]
    for mode in MODES:
        verdict = summary["modes"][mode]["verdict"]
        diagnosis = summary.get("diagnoses", {}).get(mode)
        if mode in fault.manifests_in:
            assert verdict == "drift", f"{name} did not show in {mode} on cuda"
            assert diagnosis["kind"] == fault.kind and set(fault.buffers) <= set(diagnosis["buffers"]), diagnosis
        else:
            assert verdict == "pass", f"{name} flagged in {mode} on cuda: {summary['modes'][mode]['reasons']}"
