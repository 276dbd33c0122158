"""Tensors a graph reads through its owner's attributes: named in the manifest, diagnosed when rebound.

The registry and the metadata object are not the only holders: a graph also
reads the model's weights and buffers (RoPE's inv_freq) and whatever tensors
the proposer keeps. The capture manifest names each by its attribute path from
the owner; the bisector compares the path's live tensor with the captured one.
The engine below rebinds the drafter's inv_freq after capture (a dynamic-RoPE
style update): the harness is told nothing, and must name that attribute.
"""

from __future__ import annotations

import torch

from parity.diagnosis.kinds import BUFFER_REASSIGNED
from parity.engine.parts import EngineParts
from parity.engine.proposer import EagleProposer
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs.factory import install_graphs
from parity.graphs.manifest import live_object_tensor
from parity.harness.request import RunRequest
from parity.harness.session import run_session
from tests.conftest import engine_config

ROPE = "head.rotary_emb.inv_freq"


def test_the_manifest_names_what_a_graph_reads_through_the_owner(random_pair):
    engine = SpecDecodeEngine(*random_pair, engine_config())
    install_graphs(engine, "full", "emulated")
    for owner, rope in (("target", "model.hf.model.rotary_emb.inv_freq"), ("drafter", ROPE)):
        executor = engine.owner(owner).executor
        for entry in executor.graphs.values():
            objects = {e.name: e for e in entry.manifest if e.holder == "object"}
            assert rope in objects, sorted(objects)
            assert live_object_tensor(objects[rope], engine.owner(owner)) is objects[rope].tensor
            # Registry buffers keep their registry names: an attribute path never names them twice.
            registry = {e.name for e in entry.manifest if e.holder == "registry"}
            storages = [e.tensor.untyped_storage().data_ptr() for e in entry.manifest]
            assert registry and len(storages) == len(set(storages))


class RopeRebindingProposer(EagleProposer):
    """Once a request passes 40 tokens, the drafter's rotary frequencies are stretched by assigning a new tensor
    (host side, between forwards: what a dynamic-RoPE update that re-registers the buffer does)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rotary = self.head.rotary_emb
        # The pair is shared by every run of a session: each engine starts from the head's first frequencies.
        if not hasattr(rotary, "first_inv_freq"):
            rotary.first_inv_freq = rotary.inv_freq.clone()
        rotary.inv_freq = rotary.first_inv_freq.clone()

    def prepare_prefill(self, rows, plans, starts, emitted, features):
        rotary = self.head.rotary_emb
        if max(p.seq_len for p in plans) > 40 and torch.equal(rotary.inv_freq, rotary.first_inv_freq):
            rotary.inv_freq = rotary.first_inv_freq * 0.5
        return super().prepare_prefill(rows, plans, starts, emitted, features)


def test_an_attribute_rebound_after_capture_is_named_by_its_path():
    parts = EngineParts(proposer=RopeRebindingProposer)
    outcome = run_session(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"), "emulated",
                                     parts=parts))
    assert outcome.summary["modes"]["full"]["verdict"] == "drift"
    found = outcome.summary["diagnoses"]["full"]
    assert found["kind"] == BUFFER_REASSIGNED and found["buffers"] == [ROPE], found
    assert found["owner"] == "drafter" and found["experiment"]
    assert found["captured_address"] != found["live_address"]
    assert any("(drafter object)" in line for line in found["evidence"]), found["evidence"]
