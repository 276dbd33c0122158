"""The re-capture experiments (`parity.audit.recaptures`) on small hand-made graphs, through the audit's `ShadowLab`.

Each graph is a few-line callable captured through `parity.audit` on the emulated backend (on CUDA graphs with the
`gpu` marker where the callable is this file's); the lab is the one the
shadow check hands its localisation (kept here instead of localised). The harness's `Divergence` runs the same
experiments on its metadata's host fields (tests/test_diagnose_stages.py); here they see only the lab's interface
(`host_values`, `recapture`, `run`, `matches`, `skipped_writes`), and each assertion fails when they or the lab are
wrong.
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import GraphAudit, audited_graph, check, emulated
from parity.audit import recaptures
from parity.audit.recaptures import HostValue, describe, host_search, set_experiment, single_experiment
from tests.test_audit_absent_and_counters import CachedStep, CountingStep

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def inference():
    with torch.no_grad():
        yield


class Scaled:
    """Bakes two host values: `a + b` is read once, at capture."""

    def __init__(self, device: str = "cpu"):
        self.x = torch.arange(4.0, device=device)
        self.a, self.b, self.unused = 1.0, 2.0, 5

    def __call__(self):
        return self.x * (self.a + self.b)


def lab_at_mismatch(monkeypatch, step, bug):
    """(the ShadowLab of the first replay that differs from its shadow run, after `bug(step)`; the graph)."""
    labs = []

    def keep(lab, mismatch, started):
        labs.append(lab)
        return lab.audit._diagnosis("UNEXPLAINED", [])
    monkeypatch.setattr(check, "localise", keep)
    audit = GraphAudit(step, name="step", on_mismatch="record")
    G = torch.cuda if step.x.is_cuda else emulated
    graph = G.CUDAGraph()
    with audited_graph(graph, audit):     # on CUDA too: the block attaches the audit to the graph's replays
        audit()
    bug(step)
    graph.replay()
    assert labs, "the replay matched its shadow run"
    return labs[0], graph


def values_by_name(lab) -> dict[str, HostValue]:
    return {v.name: v for v in lab.host_values()}


@pytest.mark.parametrize("device", DEVICES)
def test_a_host_value_baked_at_capture_is_the_one_whose_live_value_alone_restores_parity(monkeypatch, device):
    def bug(step):
        step.a, step.unused = 3.0, 6          # `unused` differs too, but the graph never read it
    lab, _graph = lab_at_mismatch(monkeypatch, Scaled(device), bug)
    values = values_by_name(lab)
    assert set(values) == {"self.a", "self.unused"} and values["self.a"].captured == 1.0
    found = host_search(lab, lab.host_values())
    assert not found.control, "as captured, the re-capture still differs"
    assert [(v.name, restores) for v, restores in found.singles] == [("self.a", True), ("self.unused", False)]
    named = recaptures.stage(lab)
    assert (named.kind, named.buffers) == ("FROZEN_AT_CAPTURE", ["self.a"])
    assert "captured 1.0, live 3.0" in named.evidence[0]
    assert named.ruled_out[-1] == describe(values["self.unused"]) and named.also == []


@pytest.mark.parametrize("device", DEVICES)
def test_values_that_restore_parity_only_together_are_the_smallest_set(monkeypatch, device):
    def bug(step):
        step.a, step.b = 2.0, 3.0       # live a + b = 5; either alone at its live value gives 4
    lab, _graph = lab_at_mismatch(monkeypatch, Scaled(device), bug)
    found = host_search(lab, lab.host_values(), minimise=True)
    assert not found.control and found.restoring == []
    assert sorted(v.name for v in found.smallest) == ["self.a", "self.b"]
    named = set_experiment(found.smallest)
    assert named.kind == "FROZEN_AT_CAPTURE" and "together" in named.description


def test_an_input_absent_at_capture_names_the_skipped_write_and_the_input(monkeypatch):
    def bug(step):
        step.extra = torch.ones(4)
        step.x.copy_(torch.arange(4.0))
    lab, _graph = lab_at_mismatch(monkeypatch, CachedStep(), bug)
    [value] = [v for v in lab.host_values() if v.absent]
    assert value.name == "self.extra" and lab.skipped_writes() == ["self.cache"]
    named = single_experiment(lab, value, True)
    assert (named.kind, named.buffers) == ("CAPTURE_CONTEXT", ["self.cache", "self.extra"])
    assert describe(value).startswith("re-capture with only self.extra present")
    assert host_search(lab, [value]).restoring == [value]


def test_a_counter_the_forward_advances_is_told_as_moved_by_it(monkeypatch):
    lab, _graph = lab_at_mismatch(monkeypatch, CountingStep(), lambda step: None)
    [value] = lab.host_values()
    assert (value.name, value.captured, value.live, value.moved) == ("self.col", 0, 1, (1, 2)), \
        "its capture moved it 0 -> 1, a replay leaves it, the eager run moves it on"
    found = host_search(lab, [value])
    assert found.restoring == [value] and not found.control
    assert any("advanced by the forward itself" in line for line in single_experiment(lab, value, True).evidence)


@pytest.mark.parametrize("device", DEVICES)
def test_a_failed_recapture_is_ruled_out_not_raised(monkeypatch, device):
    def bug(step):
        step.a = 3.0
    lab, _graph = lab_at_mismatch(monkeypatch, Scaled(device), bug)
    broken = HostValue(object(), "nowhere", 0, 1)      # a key the lab cannot set
    lab.recapture = lambda overrides: (_ for _ in ()).throw(ValueError("cannot be set"))
    found = host_search(lab, [broken])
    assert not found.control and found.restoring == []
    assert any("failed: cannot be set" in line for line in lab.ruled_out)


@pytest.mark.parametrize("device", DEVICES)
def test_the_stage_names_the_smallest_set_and_hands_a_restoring_control_to_the_lab(monkeypatch, device):
    def bug(step):
        step.a, step.b = 2.0, 3.0
    lab, _graph = lab_at_mismatch(monkeypatch, Scaled(device), bug)
    named = recaptures.stage(lab)
    assert (named.kind, sorted(named.buffers)) == ("FROZEN_AT_CAPTURE", ["self.a", "self.b"])
    lab, _graph = lab_at_mismatch(monkeypatch, Scaled(device), bug)
    lab.host_values = lambda: []          # the control (a fresh capture) now restores parity
    assert recaptures.stage(lab) is None and lab.ruled_out == []
    assert recaptures.stage(lab, fresh=lambda lab: "fresh") == "fresh"


def test_the_stage_rules_out_every_value_when_none_restores_parity(monkeypatch):
    def bug(step):
        step.a, step.unused = 3.0, 6
    lab, _graph = lab_at_mismatch(monkeypatch, Scaled(), bug)
    lab.recapture = lambda overrides: None
    lab.run = lambda change=None, graph=None, redirect=(): None
    lab.matches = lambda result: False      # whatever the cause, no re-capture restores parity
    assert recaptures.stage(lab) is None
    assert lab.ruled_out == [recaptures.CONTROL, *(describe(v) for v in lab.host_values())]
