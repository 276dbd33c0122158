"""The fault x mode matrix with real CUDA graphs: the catalog's expectations, and the same diagnosis as emulated.

Same bug, same answer: for every fault and every mode, the kind, the buffers
and the site (owner, phase, step) the CUDA run names must be the ones the
emulated backend names on the same scenario. One test per fault runs that
fault on both backends, so the matrix spreads over pytest-xdist workers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.faults.catalog import FAULTS
from parity.commands.matrix import run_matrix
from parity.graphs.modes import MODES

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.gpu


def _answer(summary: dict, mode: str):
    d = summary.get("diagnoses", {}).get(mode)
    site = None if d is None else (d["kind"], tuple(d["buffers"]), d.get("owner"), d.get("phase"), d.get("step"))
    return summary["modes"][mode]["verdict"], site


# As in the CPU matrix: the tensor-parallel faults need two GPUs and --tp 2 (tests/test_tp.py), and the overlapped
# loop's staging races show on CUDA only when a copy is made slow on purpose (tests/test_overlap_gpu.py).
CELLS = [name for name, fault in FAULTS.items() if fault.tp == 1 and fault.scenario != "overlap"]


@pytest.mark.parametrize("name", CELLS)
def test_fault_on_cuda_matches_the_catalog_and_the_emulated_answer(name):
    fault = FAULTS[name]
    cuda, emulated = (run_matrix("tiny-llama3-eagle", backend, names=[name], scenarios_dir=ROOT / "scenarios")[name]
                      for backend in ("cuda", "emulated"))
    for mode in MODES:
        verdict = cuda["modes"][mode]["verdict"]
        diagnosis = cuda.get("diagnoses", {}).get(mode)
        if mode in fault.manifests_in and fault.kind == "NOT_EXERCISED":
            assert verdict == "not_exercised", f"{name} in {mode} on cuda: {verdict}"
        elif mode in fault.manifests_in:
            assert verdict == "drift", f"{name} did not show in {mode} on cuda"
            assert diagnosis["kind"] == fault.kind and set(fault.buffers) <= set(diagnosis["buffers"]), diagnosis
        else:
            assert verdict == "pass", f"{name} flagged in {mode} on cuda: {cuda['modes'][mode]['reasons']}"
    differ = [f"{mode}: cuda {_answer(cuda, mode)} vs emulated {_answer(emulated, mode)}" for mode in MODES
              if _answer(cuda, mode) != _answer(emulated, mode)]
    assert not differ, "\n".join(differ)
