"""Red team (issue 28): a per-step int32 cast of the positions handed to a FULL graph, on examples/vllm_shaped.

The runner passes `b.positions[:n].to(torch.int32)`: a fresh tensor every step. The FULL graph replays on the
cast it was captured with (capture-time positions), so every replay reads stale positions and the run parts
from eager. Truth (issue 28 item 2, docs/bugs.md): a tensor built afresh by a cast and handed to a kernel is
BUFFER_REASSIGNED naming its path (args[1]). The wrapper replays without the live arguments; the audit
finds them in the wrapper's call (`KeyedAudit.wrapper_arguments`); before that it reported nothing.
"""

from __future__ import annotations

import pytest
import torch

from examples.vllm_shaped import CUDAGraphMode, ModelRunner
from examples.vllm_shaped.forward_context import BatchDescriptor, set_forward_context
from tests.redteam_vllm import audited, parts


class PositionsCast(ModelRunner):
    def _run(self, input_ids, positions, meta, mode, num_tokens):
        b = self.buffers
        b.input_ids[:num_tokens] = torch.tensor(input_ids + [0] * (num_tokens - len(input_ids)))
        b.positions[:num_tokens] = torch.tensor(positions + [0] * (num_tokens - len(positions)))
        layers = {layer.attn.name: meta for layer in self.model.layers}
        descriptor = BatchDescriptor(num_tokens, uniform=True) if mode != CUDAGraphMode.NONE else None
        with set_forward_context(layers, descriptor, mode):      # BUG: a fresh int32 cast every step
            return self.forward(b.input_ids[:num_tokens], b.positions[:num_tokens].to(torch.int32))


@pytest.fixture(scope="module")
def outcome():
    return audited(PositionsCast, CUDAGraphMode.FULL, reference_class=PositionsCast)


def test_the_cast_parts_from_eager(outcome):
    eager, _, graphed = outcome
    assert parts(eager, graphed)


def test_the_cast_is_named_buffer_reassigned(outcome):
    _, session, _ = outcome
    assert session.errors, "nothing found"
    assert {e.kind for e in session.errors} == {"BUFFER_REASSIGNED"}, [e.kind for e in session.errors]
    assert all("args[1]" in e.buffers for e in session.errors), [e.buffers for e in session.errors]
