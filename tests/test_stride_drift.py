"""Stride drift (issue 34 item 3, vLLM #50046 / #51318): a role handed at another layout of the storage the graph
captured. The stride stage compares every captured role's (storage, offset, sizes, strides) with what the role
holds at the divergent forward, and names one only when handing the reference the captured layout reproduces
the graph's outputs bit for bit (`parity/diagnose/stride.py`)."""

from __future__ import annotations

import pytest
import torch

from parity.diagnosis.kinds import BUFFER_REASSIGNED
from parity.diagnose import experiments, stride
from parity.engine.metadata import MetadataBuilder
from parity.engine.parts import EngineParts
from parity.faults.seam import apply
from tests.test_diagnose_stages import FreshSlotsView, locate

pytestmark = pytest.mark.xdist_group("diagnose-stages")


@pytest.fixture(autouse=True)
def inference():
    with torch.no_grad():
        yield


def test_the_stride_stage_names_the_block_table_read_at_the_captured_stride(random_pair):
    parts, _ = apply(["block-table-stride-drift"])
    lab = locate(parts, random_pair)
    assert [(d.name, d.holder) for d in stride.drifts(lab)] == [("block_table", "metadata object")]
    found = stride.stage(lab)
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
    found = stride.stage(lab)
    assert (found.kind, found.buffers) == (BUFFER_REASSIGNED, ["positions"]), (found.evidence, lab.ruled_out)


def test_the_stride_stage_passes_a_role_rebound_to_another_storage(random_pair):
    lab = locate(EngineParts(target_builder=FreshSlotsView), random_pair)
    assert stride.drifts(lab) == [] and stride.stage(lab) is None and lab.replays == 0
    assert experiments.stage(lab).buffers == ["slot_mapping"]
