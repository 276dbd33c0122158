"""The repair stage (`parity.audit.repairs.stage`) on small hand-made graphs, through the audit's `ShadowLab`.

Each graph is a few-line method captured through `parity.audit` on the emulated backend (on CUDA graphs with the
`gpu` marker); the lab is the one the shadow check hands its localisation (kept here instead of localised). The same stage runs on the harness's
`Divergence` (tests/test_diagnose_stages.py): it sees only the lab's interface, so its verdicts below come from
the repairs the lab lists and the replays it runs, and each assertion fails when the stage or the lab is wrong.
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import GraphAudit, audited_graph, check, emulated, repairs
from parity.audit.repairs import Repair, attempt, units
from parity.diagnosis.kinds import BUFFER_REASSIGNED, STALE_BUFFER

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def inference():
    with torch.no_grad():
        yield


class Rows:
    """Reads a row table at `meta["pos"]` (the persistent `static_pos` at capture), adds `bias`, writes `cache`."""

    def __init__(self, device: str = "cpu"):
        self.table = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)).to(device)
        self.static_pos = torch.zeros(4, dtype=torch.long, device=device)
        self.bias = torch.zeros(8, device=device)
        self.cache = torch.zeros(4, 8, device=device)
        self.meta = {"pos": self.static_pos}

    def forward(self):
        rows = self.table[self.meta["pos"]] + self.bias
        self.cache.add_(rows)
        return rows * 2


def lab_at_mismatch(monkeypatch, owner: Rows, bug):
    """(the ShadowLab of the first replay that differs from its shadow run, after `bug(owner, step)` each step;
    the graph, which the lab replays: the audit holds it weakly)."""
    labs = []

    def keep(lab, mismatch, started):
        labs.append(lab)
        return lab.audit._diagnosis("UNEXPLAINED", [])
    monkeypatch.setattr(check, "localise", keep)
    audit = GraphAudit(owner.forward, name="rows", on_mismatch="record")
    G = torch.cuda if owner.cache.is_cuda else emulated
    graph = G.CUDAGraph()
    if owner.cache.is_cuda:     # a warm-up outside capture, as torch.cuda.graph asks: cuBLAS's handle is made here
        owner.forward()
        torch.cuda.synchronize()
    with audited_graph(graph, audit):     # on CUDA too: the block attaches the audit to the graph's replays
        audit()
    for step in range(1, 4):
        bug(owner, step)
        graph.replay()
        if labs:
            return labs[0], graph
    raise AssertionError("no replay differed from its shadow run")


def positions(owner, step):
    return torch.arange(4, device=owner.cache.device) + step


def stale(owner, step):
    owner.meta = {"pos": positions(owner, step)}      # a fresh tensor; the persistent one is never refreshed


def reassigned_cache(owner, step):
    owner.cache = owner.cache.clone()                 # the graph keeps writing the old cache
    owner.static_pos.copy_(positions(owner, step))


def two_stale(owner, step):
    owner.meta = {"pos": positions(owner, step)}
    owner.bias = torch.full((8,), float(step), device=owner.cache.device)   # both reads must follow the live ones


@pytest.mark.parametrize("device", DEVICES)
def test_a_persistent_buffer_never_refreshed_is_the_stale_buffer_the_copy_names(monkeypatch, device):
    lab, _graph = lab_at_mismatch(monkeypatch, Rows(device), stale)
    found = repairs.stage(lab)
    assert found.kind == STALE_BUFFER and found.buffers == ["self.static_pos"]
    assert "restores bitwise parity" in found.evidence[-1] and found.experiment.startswith("copy the live")
    assert lab.replays >= 1 and found.replays == lab.replays


@pytest.mark.parametrize("device", DEVICES)
def test_a_written_buffer_reallocated_after_capture_is_redirected_reads_and_writes(monkeypatch, device):
    owner = Rows(device)
    lab, _graph = lab_at_mismatch(monkeypatch, owner, reassigned_cache)
    [unit] = lab.repairs()
    [repair] = unit.applied
    assert repair.live_tensor is owner.cache and repair.kind == BUFFER_REASSIGNED
    assert not lab.matches(lab.run(lambda: repair.tensor.copy_(owner.cache))), \
        "copying alone still compares the orphan's writes with eager's: the writes must be redirected too"
    found = repairs.stage(lab)
    assert found.kind == BUFFER_REASSIGNED and found.buffers == ["self.cache"]


@pytest.mark.parametrize("device", DEVICES)
def test_two_tensors_rebound_at_once_are_named_together_when_neither_alone_restores_parity(monkeypatch, device):
    lab, _graph = lab_at_mismatch(monkeypatch, Rows(device), two_stale)
    assert len(lab.repairs()) == 2
    found = repairs.stage(lab)
    assert found.buffers == ["self.bias", "self.static_pos"]
    assert "(together: no single repair restores parity)" in found.experiment


@pytest.mark.parametrize("device", DEVICES)
def test_a_lab_with_nothing_to_repair_passes_the_stage_with_that_ruled_out(monkeypatch, device):
    lab, _graph = lab_at_mismatch(monkeypatch, Rows(device), stale)
    lab.rebinds = []                    # as if no role had moved: the lab lists no repair
    assert lab.repairs() == [] and repairs.stage(lab) is None
    assert lab.ruled_out == ["no tensor the reference reads differs from what the graph read"]


@pytest.mark.parametrize("device", DEVICES)
def test_an_attempt_puts_back_what_it_wrote_and_a_futile_repair_runs_nothing(monkeypatch, device):
    owner = Rows(device)
    lab, _graph = lab_at_mismatch(monkeypatch, owner, stale)
    captured = owner.static_pos
    before, replays = captured.clone(), lab.replays
    fix = Repair(STALE_BUFFER, "pos", "test", "copy", captured, slice(None), positions(owner, 1))
    assert attempt(lab, [fix]) and torch.equal(captured, before), "the repair's write is undone after the run"
    assert lab.replays == replays + 1
    futile = Repair(STALE_BUFFER, "pos", "test", "copy", captured, slice(None), before, futile=True)
    assert not attempt(lab, [futile]) and lab.replays == replays + 1, "a futile repair is ruled out unreplayed"
    assert units([fix])[0].applied == units([fix])[0].told == [fix]


def test_units_keep_each_repair_alone_but_one_variable_together():
    t = torch.zeros(2)
    alone = [Repair(STALE_BUFFER, "pos", "registry", "refresh", t, slice(None), t) for _ in range(2)]
    cache = [Repair(STALE_BUFFER, "kv_cache", "kv cache", f"redirect {i}", t, slice(None), t, variable="kv")
             for i in range(2)]
    found = units([cache[0], *alone, cache[1]])
    assert [u.applied for u in found] == [[alone[0]], [alone[1]], cache], "one role's two tensors: two variables"
    assert all(u.told == u.applied for u in found)
