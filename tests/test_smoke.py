"""`make smoke`: the first thing a contributor runs, in seconds: everything imports, a tiny scenario passes in
every mode, and one injected fault is found and named. `make test` runs these too."""

from __future__ import annotations

import importlib
import json
import pkgutil

import pytest

import parity
from parity.faults.catalog import FULL_MODES
from parity.graphs.modes import MODES
from tests.robustkit import call, run_args, tiny_scenario

pytestmark = pytest.mark.smoke
SMALL = {"num_requests": 2, "arrivals": [0, 0], "max_num_seqs": 2, "modes": list(MODES)}
# NOTE: the CUDA kernels' modules need triton, which a CPU machine need not have; they are imported on the device.
NEEDS_TRITON = ("triton",)


def test_every_module_imports():
    for module in pkgutil.walk_packages(parity.__path__, "parity."):
        if not any(part in module.name for part in NEEDS_TRITON) and not module.name.endswith("__main__"):
            importlib.import_module(module.name)


def test_a_tiny_scenario_passes_in_every_mode(tmp_path):
    code, _, err = call(run_args(tiny_scenario(tmp_path, **SMALL), "--out", str(tmp_path / "run"),
                                 modes=",".join(MODES)))
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {mode: m["verdict"] for mode, m in summary["modes"].items()} == dict.fromkeys(MODES, "pass")


def test_an_injected_fault_is_named_where_it_shows(tmp_path):
    scenario = tiny_scenario(tmp_path, **SMALL)
    code, _, err = call(["run", "--scenario", str(scenario), "--backend", "emulated", "--quiet", "--modes", "all",
                         "--inject", "reassign-seq-lens", "--out", str(tmp_path / "run")])
    assert code == 1, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for mode in MODES:
        verdict = summary["modes"][mode]["verdict"]
        assert verdict == ("drift" if mode in FULL_MODES else "pass"), (mode, verdict)
    for mode in FULL_MODES:
        diagnosis = summary["diagnoses"][mode]
        assert (diagnosis["kind"], diagnosis["buffers"]) == ("BUFFER_REASSIGNED", ["seq_lens"]), (mode, diagnosis)
