"""Each diagnosis stage on its own: `stage(lab) -> Diagnosis | None`, on small hand-made bugs.

The lockstep stops at the first divergent forward and hands it over as a
`Divergence`; here it is taken from the lockstep before any stage runs
(`locate`), and each stage is called alone on it. A stage names what its own
experiment isolates and returns None for a bug of another stage's kind (adding
what it tried to `lab.ruled_out`), so the order of the stages decides
nothing a stage could not decide alone. The bugs are one-method subclasses of
an engine part (`EngineParts`), written for these tests; no catalog fault is used.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parity.diagnosis.kinds import (BUFFER_REASSIGNED, CAPTURE_CONTEXT, DESCRIPTOR_MISMATCH, FROZEN_AT_CAPTURE,
                                    PADDING_LEAK)
from parity.audit import handed, repairs
from parity.diagnose import descriptor, host_moves, padding, probes, readset, rebound, recapture, reproducible
from parity.diagnose.bisector import Bisector, PaddingBisector
from parity.engine.metadata import MetadataBuilder
from parity.engine.parts import EngineParts
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs.capture import CapturedGraph
from parity.graphs.factory import install_graphs, install_padded_reference
from parity.graphs.policy import CapturePolicy
from parity.models import paged_attention
from tests.conftest import engine_config, make_specs
from tests.test_host_state import ScheduledTarget

pytestmark = pytest.mark.xdist_group("diagnose-stages")


@pytest.fixture(autouse=True)
def inference():
    """The stages run where the bisector runs them: without autograd."""
    with torch.no_grad():
        yield


class _Located(Exception):
    def __init__(self, lab):
        self.lab = lab


def locate(parts: EngineParts, random_pair, mode: str = "full", padding_stage: bool = False):
    """The first divergent forward of `mode` for engines of `parts` (the CPU pair, emulated graphs), as the
    lab the stages get: the graph run against its padded reference, or (`padding_stage`) the reference on
    clean padding against the reference on poisoned padding."""
    specs = make_specs(3, seed=1, max_tokens=6)
    make = lambda: SpecDecodeEngine(*random_pair, engine_config(), "cpu", parts=parts)  # noqa: E731

    def reference(poison):
        return lambda engine: install_padded_reference(engine, mode, None, None, poison=poison)

    def graphs(engine, copied=()):
        install_graphs(engine, mode, "emulated", None, None, CapturePolicy())

    cls = PaddingBisector if padding_stage else Bisector

    class Locator(cls):
        def _explain(self, ref, graph, ev_r, ev_g, snaps, out_r, out_g, worst, names):
            raise _Located(self.divergence(ref, graph, ev_r, ev_g, snaps, out_r, out_g, worst))

    bisector = (Locator(make, reference(False), reference(True), specs, mode) if padding_stage
                else Locator(make, reference(False), graphs, specs, mode))
    with pytest.raises(_Located) as found:
        bisector.run()
    return found.value.lab


class FreshSlotsView(MetadataBuilder):
    """The view hands attention a fresh copy of the slot mapping each batch instead of the persistent buffer."""

    def make_view(self, *args, **kwargs):
        meta = super().make_view(*args, **kwargs)
        meta.slot_mapping = meta.slot_mapping.clone()
        return meta


class ZeroPadSlots(MetadataBuilder):
    """Padded tokens get slot 0 (a live request's KV row) instead of the PAD slot: a padding bug the graph and
    its reference share."""

    def _fill(self, name, values, pad, num_tokens):
        if name != "slot_mapping":
            return super()._fill(name, values, pad, num_tokens)
        host = torch.tensor(values + [0] * pad, dtype=torch.int64)
        self.buffers[name][: len(host)].copy_(host)


class FreshPositionsEachStep(MetadataBuilder):
    """Each draft step hands attention a fresh positions tensor (the metadata object rebinds the field) and
    advances that one, while RoPE reads the registry's buffer, which stops advancing."""

    def advance_draft_step(self, meta, num_reqs_padded):
        if meta.tree_bits is None:
            meta.positions = meta.positions.clone()
        super().advance_draft_step(meta, num_reqs_padded)


def replay_rebinding_attention_outputs(self, meta=None):
    """A piecewise replay that hands each eager attention result over as a new tensor instead of copying it into
    the output the next piece captured."""
    with paged_attention.one_forward():
        for i, segment in enumerate(self.segments):
            segment.replay()
            if i < len(self.calls):
                self.calls[i].out = self.calls[i].attend(meta)
    return self.outputs


class NoSlotsAtCapture(MetadataBuilder):
    """The capture-time metadata has no slot mapping ("nothing to cache while capturing")."""

    def build_dummy(self, num_tokens_padded, num_reqs_padded):
        meta = super().build_dummy(num_tokens_padded, num_reqs_padded)
        meta.slot_mapping = None
        return meta


def test_the_recapture_stage_names_the_write_a_graph_captured_without_its_input_skips(random_pair, monkeypatch):
    write_kv = paged_attention.write_kv
    monkeypatch.setattr(paged_attention, "write_kv",    # attention caches nothing when there are no slots
                        lambda k, v, slots, key, value: None if slots is None else write_kv(k, v, slots, key, value))
    lab = locate(EngineParts(target_builder=NoSlotsAtCapture, drafter_builder=NoSlotsAtCapture), random_pair)
    assert repairs.stage(lab) is None and not any(v.moved for v in lab.host_values())
    assert [v.name for v in lab.host_values() if v.absent] == ["slot_mapping"]
    found = recapture.stage(lab)
    assert (found.kind, found.buffers) == (CAPTURE_CONTEXT, ["kv_cache", "slot_mapping"]), found.evidence
    assert "kv_cache" in lab.ref_writes and any("writes kv_cache; the captured graph never writes it" in line for line in found.evidence)


def test_the_lab_lists_no_absent_input_when_nothing_was_absent_at_capture(random_pair):
    lab = locate(EngineParts(target_builder=FreshSlotsView), random_pair)
    assert not any(v.absent for v in lab.host_values()) and lab.replays == 0


def test_the_repair_stage_names_a_fresh_metadata_tensor_and_the_host_stage_passes(random_pair):
    lab = locate(EngineParts(target_builder=FreshSlotsView), random_pair)
    assert lab.entry is not None and lab.ev_g.phase == "verify"
    assert not any(v.moved for v in lab.host_values()), "no host value the forward moves differs"
    found = repairs.stage(lab)
    assert found is not None and found.kind == BUFFER_REASSIGNED and found.buffers == ["slot_mapping"], found
    assert "slot_mapping" in lab.reads and found.experiment.startswith("redirect slot_mapping")
    assert found.replays == lab.replays > 0


def test_the_read_and_write_sets_are_what_the_reference_forward_ran_by_role_and_holder(random_pair):
    lab = locate(EngineParts(target_builder=FreshSlotsView), random_pair)
    reads = readset.reference_reads(lab)
    assert lab.replays == 1 and readset.reference_reads(lab) is reads and lab.replays == 1, "traced once per lab"
    # the view's fresh slot mapping is the metadata object's own tensor; positions are the registry's buffer
    assert reads["slot_mapping"] == {"metadata object"} and "registry" in reads["positions"]
    assert "kv_cache" in reads and "kv_cache" in readset.reference_writes(lab)
    assert "kv_cache" in readset.graph_writes(lab) and lab.skipped_writes() == []
    registry = lab.graph.owner(lab.ev_g.owner).buffers
    unread = [name for name in registry.names() if name not in reads]
    assert unread, "a role the forward never reads is not in the read set (it cannot be repaired)"


def test_the_layer_probe_sees_every_decoder_layer_and_the_first_that_differs(random_pair):
    """The fused layers run as functions of the layer modules (no forward hook fires): the probe still sees each."""
    lab = locate(EngineParts(target_builder=FreshSlotsView), random_pair)
    layers = len(lab.graph.owner(lab.ev_g.owner).decoder_layers())
    [line] = probes.probe_layers(lab)
    assert layers > 1 and line.startswith(f"layer probe: all {layers} decoder layer(s) agree"), line
    restore = lab.restore

    def restore_with_other_tokens(run="graph"):     # the graph run's state differs before the forward
        restore(run)
        if run == "graph":
            owner = lab.graph.owner(lab.ev_g.owner)
            owner.buffers["input_ids"].add_(1).remainder_(owner.model.config.vocab_size)
    lab.restore = restore_with_other_tokens
    [line] = probes.probe_layers(lab)
    assert line.startswith("layer probe: decoder layer 0 is the first to differ"), line


def test_the_host_stage_names_a_counter_the_forward_moves_and_the_repair_stage_rules_itself_out(random_pair):
    lab = locate(EngineParts(target_runner=ScheduledTarget), random_pair)
    assert repairs.stage(lab) is None
    assert lab.ruled_out == ["no tensor the reference reads differs from what the graph read"]
    assert rebound.piecewise_outputs(lab) is None and handed.pointed_back(lab) is None
    assert [(v.name, v.moved is not None) for v in lab.host_values()][:1] == [("schedule.step", True)]
    found = recapture.stage(lab)
    assert (found.kind, found.buffers) == (FROZEN_AT_CAPTURE, ["schedule.step"])
    assert found.ruled_out[:len(lab.ruled_out)] == lab.ruled_out, "what the earlier stages ruled out travels along"


def test_the_host_stage_names_a_counter_an_eager_forward_of_the_graph_run_starts_from_elsewhere(random_pair):
    """FULL_DECODE_ONLY runs the first (mixed) verify eagerly: the graph run's captures advanced the counter, the
    reference's eager run did not, so the two runs part at a forward no graph replayed."""
    lab = locate(EngineParts(target_runner=ScheduledTarget), random_pair, mode="full_decode_only")
    assert lab.entry is None and lab.ev_g.phase == "verify", "the graph run ran the divergent forward eagerly"
    found = host_moves.stage(lab)
    assert (found.kind, found.buffers) == (FROZEN_AT_CAPTURE, ["schedule.step"]), found
    assert "replays never do" in found.evidence[1] and "the control" in found.evidence[2]
    assert found.replays == lab.replays == 2, "the re-run with the reference's value, then the control"


def test_the_host_stage_passes_a_forward_that_moved_no_host_value(random_pair):
    lab = locate(EngineParts(target_builder=FreshSlotsView), random_pair)
    assert not lab.moves and host_moves.stage(lab) is None and lab.replays == 0


def test_the_reproducibility_stage_passes_a_forward_that_reproduces_itself(random_pair):
    lab = locate(EngineParts(target_runner=ScheduledTarget), random_pair)
    assert reproducible.stage(lab) is None
    assert lab.replays == 2 + 2 * reproducible.RERUNS, "the padded tokens' write set (plain, poisoned), then re-runs"
    # the lab's one re-capture primitive puts the run back at its pre-state even when the experiment's change fails
    registry = lab.graph.owner(lab.ev_g.owner).buffers
    name = next(n for n in registry.names() if not bool((registry[n] == 7).all()))
    before = registry[name].clone()

    def scribble_then_fail():
        registry[name].fill_(7)
        raise ValueError("the one change cannot be made")
    with pytest.raises(ValueError):
        lab.recapture(None, scribble_then_fail)
    assert torch.equal(registry[name], before) and lab.replays == 2 + 2 * reproducible.RERUNS


def test_the_padding_stage_names_the_slot_mapping_a_shared_padding_bug_breaks(random_pair):
    lab = locate(EngineParts(target_builder=ZeroPadSlots, drafter_builder=ZeroPadSlots), random_pair,
                 padding_stage=True)
    found = padding.stage(lab)
    assert (found.kind, found.buffers) == (PADDING_LEAK, ["slot_mapping"]), found.evidence
    assert "inert" in found.experiment


def test_the_descriptor_stage_compares_the_batch_padding_with_the_graph_shape():
    def lab_with(graph_tokens):
        dispatch = SimpleNamespace(num_tokens_padded=8, num_reqs_padded=2)
        entry = SimpleNamespace(num_tokens=graph_tokens, num_reqs=2)
        lab = SimpleNamespace(dispatch=dispatch, entry=entry)
        lab.diagnosis = lambda kind, buffers, **found: SimpleNamespace(kind=kind, buffers=buffers, **found)
        return lab

    assert descriptor.stage(lab_with(8)) is None
    found = descriptor.stage(lab_with(4))
    assert (found.kind, found.buffers) == (DESCRIPTOR_MISMATCH, ["descriptor"])
    assert "8 tokens x 2 rows" in found.evidence[0] and "4 tokens x 2 rows" in found.evidence[0]


def test_the_piecewise_stage_names_an_attention_output_rebound_after_capture(random_pair, monkeypatch):
    monkeypatch.setattr(CapturedGraph, "replay", replay_rebinding_attention_outputs)
    lab = locate(EngineParts(), random_pair, mode="piecewise")
    assert lab.entry is not None and lab.entry.graph.calls
    found = rebound.piecewise_outputs(lab)
    assert (found.kind, found.buffers) == (BUFFER_REASSIGNED, ["attention_output"]), found
    assert found.captured_address != found.live_address and lab.replays == 1, "one replay delivering the outputs"


def test_the_pointed_back_stage_names_a_role_the_metadata_rebinds_while_the_registry_keeps_the_buffer(random_pair):
    lab = locate(EngineParts(drafter_builder=FreshPositionsEachStep), random_pair)
    assert lab.ev_g.phase == "draft_step" and lab.ev_g.draft_step >= 1, "the first forward after an advance"
    found = handed.pointed_back(lab)
    assert (found.kind, found.buffers) == (BUFFER_REASSIGNED, ["positions"]), found
    assert {"registry", "metadata object"} <= lab.reads["positions"], "read through both holders"
    assert "pointed back at the persistent buffer" in found.experiment
