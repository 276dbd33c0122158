"""Runs one after another in bounded memory: nothing of a run (engine, executors, graphs) outlives it.

On the CPU the figures of `release.measured` are not measured (they are on
CUDA: tests/test_gpu_memory.py); what is checked here is what makes them
come back to the baseline: when a run ends, no engine, graph executor or
captured graph of it is alive, for mode runs, padded references and the
bisector's engines alike; and an OutOfMemoryError inside a run is one line
naming it, with nothing left behind.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

import parity.harness.modes as harness_modes
from parity.cli import main
from parity.engine.spec_decode import SpecDecodeEngine
from parity.errors import OutOfDeviceMemory
from parity.faults.seam import apply
from parity.graphs.capture import CapturedGraph
from parity.graphs.manager import GraphExecutor
from parity.harness.modes import run_mode, run_modes
from parity.harness.request import RunRequest
from parity.harness.scenario import load_scenario
from parity.harness.session import run_session
from parity.models.pair import load_pair

SCENARIO = "scenarios/default.yaml"
HEAVY = (SpecDecodeEngine, GraphExecutor, CapturedGraph)


def alive(but=None) -> list[str]:
    """Class names of the engines, graph executors and captured graphs still reachable (garbage collected first).

    Names, not the objects: a list of them would keep them alive.
    """
    gc.collect()
    return [type(o).__name__ for o in gc.get_objects() if issubclass(type(o), HEAVY) and o is not but]


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny-llama3-eagle")


@pytest.fixture(scope="module")
def small():
    scenario = load_scenario(SCENARIO)
    return dataclasses.replace(scenario, num_requests=3, arrivals=(0, 0, 1), max_tokens=6)


def test_no_engine_or_graph_outlives_its_run(pair, small, monkeypatch):
    """Checked at the start of every run (nothing of the last one may be alive) and after the last."""
    starts = []

    class Checked(SpecDecodeEngine):
        def __init__(self, *args, **kwargs):
            starts.append(alive(but=self))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(harness_modes, "SpecDecodeEngine", Checked)
    assert alive() == []
    runs = run_modes(pair, small, ("eager", "piecewise", "full", "full_decode_only", "full_and_piecewise"),
                     "emulated", torch.device("cpu"))
    assert len(starts) == len(runs.all_runs()) == 8      # eager, 4 graph modes, 3 padded references
    assert all(found == [] for found in starts), starts
    assert alive() == []
    full = runs.runs["full"]
    assert sum(full.capture["graphs"].values()) > 0, "the full run captured graphs (and gave them back)"
    assert full.memory is None, "memory is measured on CUDA only"
    assert set(full.timing) == {"capture_seconds", "run_seconds"} and full.timing["capture_seconds"] > 0


def test_bisection_engines_are_released(small):
    parts, policy = apply(["reassign-seq-lens"])
    request = RunRequest("tiny-llama3-eagle", SCENARIO, ("eager", "full"), "emulated", parts=parts, policy=policy)
    outcome = run_session(request)
    assert outcome.summary["verdict"] == "drift" and outcome.summary["diagnoses"]["full"]["kind"] != "NONE"
    assert alive() == []


def test_summary_has_memory_timing_and_plan():
    outcome = run_session(RunRequest("tiny-llama3-eagle", SCENARIO, ("eager", "full"), "emulated"))
    summary = outcome.summary
    measured = summary["measured"]
    assert measured["memory"] == {"eager": None, "full": None, "ref:full": None}
    assert measured["timing"]["runs"]["full"]["capture_seconds"] > 0
    assert set(measured["timing"]) >= {"load_seconds", "analysis_seconds", "runs"}
    assert set(measured["timing"]["runs"]) == {"eager", "full", "ref:full"}
    assert measured["memory_plan"]["fits"] and set(measured["memory_plan"]["modes"]) == {"eager", "full"}


def _oom_engine(monkeypatch):
    class OutOfMemory(SpecDecodeEngine):
        def run(self, specs, progress=None):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(harness_modes, "SpecDecodeEngine", OutOfMemory)


def test_out_of_memory_in_a_run_is_one_line_naming_it(pair, small, monkeypatch):
    _oom_engine(monkeypatch)
    with pytest.raises(OutOfDeviceMemory) as caught:
        run_mode(pair, small, "full", "emulated", torch.device("cpu"))
    message = str(caught.value)
    assert "\n" not in message and "the full run of default" in message
    assert "max_num_batched_tokens (128)" in message and "--modes" in message
    assert caught.value.__context__ is None, "the failed run's traceback (which holds its engine) is dropped"
    assert alive() == []


def test_out_of_memory_exits_2_in_one_line_without_a_report(monkeypatch, capsys, tmp_path):
    _oom_engine(monkeypatch)
    out = tmp_path / "run"
    code = main(["run", "--modes", "eager,full", "--backend", "emulated", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "out of device memory in the eager run" in err
    assert "Traceback" not in err and not out.exists()
