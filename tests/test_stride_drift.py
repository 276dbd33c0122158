"""Stride drift (issue 34 item 3, vLLM #50046 / #51318): a role handed at another layout of the storage the graph
captured. The stride stage compares every captured role's (storage, offset, sizes, strides) with what the role
holds at the divergent forward, and names one only when handing the reference the captured layout reproduces
the graph's outputs bit for bit (`parity/audit/handed.py`, on the harness's lab: `parity/diagnose/handed.py`; on
the audit's, the last two tests: a re-viewed role, and a rebound one pointed back at its persistent buffer)."""

from __future__ import annotations

import pytest
import torch

from parity.diagnosis.kinds import BUFFER_REASSIGNED
from parity.audit import handed, repairs
from parity.diagnose.bisector import Bisector
from parity.engine.metadata import MetadataBuilder
from parity.engine.parts import EngineParts
from parity.engine.spec_decode import SpecDecodeEngine
from parity.faults.seam import apply
from parity.graphs.factory import install_graphs, install_padded_reference
from parity.graphs.policy import CapturePolicy
from tests.conftest import engine_config, make_specs
from tests.test_diagnose_stages import FreshSlotsView, _Located, locate

pytestmark = pytest.mark.xdist_group("diagnose-stages")


@pytest.fixture(autouse=True)
def inference():
    with torch.no_grad():
        yield


def test_the_stride_stage_names_the_block_table_read_at_the_captured_stride(random_pair):
    parts, _ = apply(["block-table-stride-drift"])
    lab = locate(parts, random_pair)
    assert [(d.name, d.holder) for d in lab.drifts()] == [("block_table", "metadata object")]
    found = handed.stage(lab)
    assert (found.kind, found.buffers) == (BUFFER_REASSIGNED, ["block_table"]), found.evidence
    assert found.captured_address == found.live_address and lab.replays == 1
    capacity, width = lab.graph.owner("target").buffers["block_table"].shape
    assert f"captured stride [{width}, 1]" in found.evidence[0] and f"live stride [1, {capacity}]" in found.evidence[0]


class PitchedPositions(MetadataBuilder):
    """A test-local drift of another role: live batches hand positions as every other entry of a doubled view
    (stride 2), writing them there; capture handed the contiguous view."""

    def build(self, rows, *args, **kwargs):
        self._live = True
        try:
            return super().build(rows, *args, **kwargs)
        finally:
            self._live = False

    def make_view(self, num_tokens_padded, *args):
        meta = super().make_view(num_tokens_padded, *args)
        if getattr(self, "_live", False):
            meta.positions = self.buffers["positions"][: 2 * num_tokens_padded: 2]
            meta.positions.copy_(self.buffers["positions"][:num_tokens_padded].clone())
        return meta


def test_the_stride_stage_names_another_role_drifted_the_same_way(random_pair):
    lab = locate(EngineParts(target_builder=PitchedPositions), random_pair)
    found = handed.stage(lab)
    assert (found.kind, found.buffers) == (BUFFER_REASSIGNED, ["positions"]), (found.evidence, lab.ruled_out)


def test_the_stride_stage_passes_a_role_rebound_to_another_storage(random_pair):
    lab = locate(EngineParts(target_builder=FreshSlotsView), random_pair)
    assert lab.drifts() == [] and handed.stage(lab) is None and lab.replays == 0
    assert repairs.stage(lab).buffers == ["slot_mapping"]


def relaid(t: torch.Tensor) -> torch.Tensor:
    """The same storage and shape [slots, heads, dim], laid out heads-major: strides (dim, slots * dim, 1)."""
    slots, heads, dim = t.shape
    view = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, t.shape,
                                                               (dim, slots * dim, 1))
    view.copy_(t.clone())
    return view


def test_the_stride_stage_names_a_kv_cache_re_laid_after_capture(random_pair):
    """Every target KV tensor re-laid after capture: eager prefills write the new layout, the decode graphs of
    FULL_DECODE_ONLY read and write the captured one. The stage hands every layer's tensors back together."""
    specs = make_specs(3, seed=1, max_tokens=6)
    make = lambda: SpecDecodeEngine(*random_pair, engine_config(), "cpu")  # noqa: E731
    mode = "full_decode_only"

    def relay(engine):      # the engine's code, so the reference runs it too
        cache = engine.owner("target").kv_cache
        for tensors in (cache.keys, cache.values):
            tensors[:] = [relaid(t) for t in tensors]

    def graphs(engine, copied=()):
        install_graphs(engine, mode, "emulated", None, None, CapturePolicy())
        relay(engine)

    def reference(engine):
        install_padded_reference(engine, mode, None, None, poison=False)
        relay(engine)

    class Locator(Bisector):
        def _explain(self, ref, graph, ev_r, ev_g, snaps, out_r, out_g, worst, names):
            raise _Located(self.divergence(ref, graph, ev_r, ev_g, snaps, out_r, out_g, worst))

    with pytest.raises(_Located) as located:
        Locator(make, reference, graphs, specs, mode).run()
    lab = located.value.lab
    assert {(d.name, d.holder) for d in lab.drifts()} == {("kv_cache", "kv cache")}
    found = handed.stage(lab)
    assert (found.kind, found.buffers) == (BUFFER_REASSIGNED, ["kv_cache"]), (found.evidence, lab.ruled_out)
    assert lab.replays == 1 and "tensors; the first" in found.evidence[0]


class Grid:
    """Reads `meta["grid"]`, at capture a row-major view of the workspace `ws`, and writes `cache`."""

    def __init__(self, device: str = "cpu"):
        self.ws = torch.zeros(32, device=device)
        self.w = torch.randn(4, generator=torch.Generator().manual_seed(0)).to(device)
        self.cache = torch.zeros(4, device=device)
        self.meta = {"grid": self.ws[:16].view(4, 4)}

    def forward(self):
        out = self.meta["grid"] @ self.w
        self.cache.copy_(out)
        return out * 2


def repitched(owner: Grid, step: int) -> None:
    """Each step hands the grid column-major: the same storage, address and shape at other strides."""
    view = owner.ws.as_strided((4, 4), (1, 4))
    view.copy_(torch.arange(16.0, device=owner.ws.device).view(4, 4) + step)
    owner.meta = {"grid": view}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_audits_lab_names_a_role_handed_at_other_strides_of_the_captured_storage(monkeypatch, device):
    """The same stage on the audit's `ShadowLab`: no address moved (no repair to try), and the eager run handed
    the captured layout reproduces the replay."""
    from tests.test_repairs_stage import lab_at_mismatch
    lab, _graph = lab_at_mismatch(monkeypatch, Grid(device), repitched)
    assert lab.rebinds == [] and [(d.name, d.holder) for d in lab.drifts()] == [("self.meta['grid']", "path")]
    found = handed.stage(lab)
    assert (found.kind, found.buffers) == (BUFFER_REASSIGNED, ["self.meta['grid']"]), (found, lab.ruled_out)
    assert "captured stride [4, 1]" in found.evidence[0] and "live stride [1, 4]" in found.evidence[0]
    assert found.replays == lab.replays == 1
    assert lab.handed([]) is None and handed.stage(lab) is not None, "the lab stands at its pre-state after"


class TwoHolders:
    """Reads one persistent buffer `pos` through two holders: itself, and `meta["pos"]` (the same tensor at
    capture)."""

    def __init__(self, device: str = "cpu"):
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(16, 8, generator=gen).to(device)
        self.other = torch.randn(16, 8, generator=gen).to(device)
        self.pos = torch.arange(4, device=device)
        self.cache = torch.zeros(4, 8, device=device)
        self.meta = {"pos": self.pos}

    def forward(self):
        out = self.table[self.pos] + self.other[self.meta["pos"]]
        self.cache.copy_(out)
        return out * 2


def fresh_meta_pos(owner: TwoHolders, step: int) -> None:
    owner.meta = {"pos": torch.arange(4, device=owner.pos.device) + step}   # the buffer itself keeps its values


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_audits_lab_points_a_rebound_role_back_when_a_copy_would_change_its_other_holder_too(monkeypatch,
                                                                                                   device):
    """`handed.pointed_back` on the audit's `ShadowLab`: copying the fresh positions into the buffer changes the
    read through `self.pos` too, so no repair restores parity; the eager run with `meta['pos']` pointed back at
    the buffer reproduces the replay."""
    from tests.test_repairs_stage import lab_at_mismatch
    lab, _graph = lab_at_mismatch(monkeypatch, TwoHolders(device), fresh_meta_pos)
    assert lab.drifts() == [] and handed.stage(lab) is None
    assert repairs.stage(lab) is None, "a copy into the buffer changes both holders' reads"
    assert [(d.name, d.rebound) for d in lab.rebound()] == [("self.meta['pos']", True)]
    found = handed.pointed_back(lab)
    assert (found.kind, found.buffers) == (BUFFER_REASSIGNED, ["self.meta['pos']"]), (found, lab.ruled_out)
    assert "pointed back at the persistent buffer" in found.experiment and found.captured_address != found.live_address
