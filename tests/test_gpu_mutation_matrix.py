"""The fault x mode matrix with real CUDA graphs: the catalog's expectations, and the same diagnosis as emulated.

Same bug, same answer: for every fault and every mode, the kind, the buffers
and the site (owner, phase, step) the CUDA run names must be the ones the
emulated backend names on the same scenario.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.faults.catalog import FAULTS
from parity.faults.matrix import run_matrix
from parity.graphs.modes import MODES

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def matrices():
    return {backend: run_matrix("tiny-llama3-eagle", backend, scenarios_dir=ROOT / "scenarios")
            for backend in ("cuda", "emulated")}


def _answer(summary: dict, mode: str):
    d = summary.get("diagnoses", {}).get(mode)
    site = None if d is None else (d["kind"], tuple(d["buffers"]), d.get("owner"), d.get("phase"), d.get("step"))
    return summary["modes"][mode]["verdict"], site


@pytest.mark.parametrize("name", list(FAULTS))
def test_cuda_matrix_matches_the_catalog(matrices, name):
    fault, summary = FAULTS[name], matrices["cuda"][name]
    for mode in MODES:
        verdict = summary["modes"][mode]["verdict"]
        diagnosis = summary.get("diagnoses", {}).get(mode)
        if mode in fault.manifests_in and fault.kind == "NOT_EXERCISED":
            assert verdict == "not_exercised", f"{name} in {mode} on cuda: {verdict}"
        elif mode in fault.manifests_in:
            assert verdict == "drift", f"{name} did not show in {mode} on cuda"
            assert diagnosis["kind"] == fault.kind and set(fault.buffers) <= set(diagnosis["buffers"]), diagnosis
        else:
            assert verdict == "pass", f"{name} flagged in {mode} on cuda: {summary['modes'][mode]['reasons']}"


@pytest.mark.parametrize("name", list(FAULTS))
def test_same_bug_same_answer_on_both_backends(matrices, name):
    for mode in MODES:
        assert _answer(matrices["cuda"][name], mode) == _answer(matrices["emulated"][name], mode), (name, mode)
