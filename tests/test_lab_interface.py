"""The one interface every experiment runs on (`parity.audit.lab.Lab`), on both diagnosers' divergent forwards.

The audit's `ShadowLab` (a user's graphed callable against its eager shadow run) and the harness's `Divergence`
(the first divergent forward of a lockstep against the padded reference) answer the same four questions: run the
forward under test (one change applied), does it match the reference, re-capture it with host values overridden,
and what is this tensor called. Each is checked on a forward that really diverges, so every assertion can fail.
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import check
from parity.audit.lab import Lab, ShadowLab
from parity.audit.state import Result, Snapshot, compare, delta
from parity.diagnose.lab import Divergence
from parity.engine.parts import EngineParts
from parity.graphs.roles import Path
from tests.test_audit_absent_and_counters import CachedStep, _captured
from tests.test_diagnose_stages import FreshSlotsView, locate


@pytest.fixture(autouse=True)
def inference():
    with torch.no_grad():
        yield


def test_the_harness_divergence_is_a_lab_its_repair_restores_parity_and_it_names_by_role(random_pair):
    lab = locate(EngineParts(target_builder=FreshSlotsView), random_pair)
    assert isinstance(lab, Divergence) and isinstance(lab, Lab)
    assert not lab.matches(lab.run()), "the divergent forward re-run unchanged still differs"
    live, captured = lab.ev_g.meta.slot_mapping, lab.entry.capture_meta.slot_mapping
    assert live.data_ptr() != captured.data_ptr()
    # the graph reads the capture-time slot mapping: the live one's values there restore parity
    assert lab.matches(lab.run(lambda: captured[: live.shape[0]].copy_(live)))
    assert lab.replays == 2
    assert lab.name(lab.graph.owner(lab.ev_g.owner).buffers["slot_mapping"]) == "slot_mapping"
    assert lab.name(torch.zeros(1)) is None
    again = lab.recapture({})    # a fresh capture from the capture-time metadata reads the same addresses
    assert not lab.matches(lab.run(graph=again))


def test_the_audit_shadow_lab_is_a_lab_whose_recapture_with_the_live_input_restores_parity(monkeypatch):
    labs = []

    def keep(lab, mismatch, started):
        labs.append(lab)
        return lab.audit._diagnosis("UNEXPLAINED", [])
    monkeypatch.setattr(check, "localise", keep)
    step = CachedStep()
    audit, graph = _captured(step)
    step.extra = torch.ones(4)       # absent at capture: the graph lacks the cache write
    step.x.copy_(torch.arange(4.0))
    graph.replay()
    [lab] = labs
    assert isinstance(lab, ShadowLab) and isinstance(lab, Lab)
    assert not lab.matches(lab.run())
    assert lab.name(step.cache) == "self.cache" and lab.name(torch.zeros(1)) is None
    extra = next(path for path in lab.record.host if str(path) == "self.extra")
    assert isinstance(extra, Path)
    assert not lab.matches(lab.run(graph=lab.recapture({extra: None}))), "the control: as captured, still apart"
    assert lab.matches(lab.run(graph=lab.recapture({})))
    assert lab.replays == 3


def test_both_layers_measure_a_difference_alike_and_a_snapshot_gives_any_view_as_it_was():
    nan, inf = float("nan"), float("inf")
    apart = delta(torch.tensor([1.0, nan, nan, inf, 0.0]), torch.tensor([1.0, nan, 2.0, inf, -0.5]))
    assert apart.tolist() == [0.0, 0.0, inf, 0.0, 0.5], "a NaN on one side only is infinitely apart, on both none"
    big = torch.tensor([2 ** 40 + 1], dtype=torch.int64)
    found = compare(Result([big]), Result([big - 1]), ["ids"])
    assert found is not None and found.max_abs_diff == 1.0, "integers are measured exactly"
    buffer, other = torch.arange(6.0), torch.zeros(2)
    keep = Snapshot([buffer[2:4]])          # a view: its whole storage is saved
    buffer.fill_(-1.0)
    assert keep.before(buffer[4:]).tolist() == [4.0, 5.0] and keep.before(other) is other
    keep.restore()
    assert buffer.tolist() == list(range(6))
