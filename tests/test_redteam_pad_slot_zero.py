"""Red team (issue 28): padded tokens given slot 0 instead of the PAD slot -1, on examples/vllm_shaped (FULL).

Slot 0 is the first KV slot of request 0, so a padded token overwrites request 0's first key and value, in
eager at the same padded shape too: the run parts from a correct engine while the graph equals its padded
eager run. Truth (docs/bugs.md): PADDING_LEAK naming slot_mapping. Slot 0 is no real entry of the step, so input poisoning
leaves it alone as a pad marker; what the padded rows store is poisoned instead (audit/padded_values.py).
"""

from __future__ import annotations

import pytest

from examples.vllm_shaped import CUDAGraphMode, ModelRunner
from examples.vllm_shaped.runner import MetadataBuilder
from tests.redteam_vllm import audited, parts


class PadSlotZero(MetadataBuilder):
    def build(self, seq_lens, query_lens, blocks, num_reqs_padded, capture=False):
        meta = super().build(seq_lens, query_lens, blocks, num_reqs_padded, capture)
        if not capture:                                          # BUG: padded slots 0, not -1
            num_tokens = sum(query_lens)
            self.buffers.slot_mapping[num_tokens:max(num_tokens, num_reqs_padded)] = 0
        return meta


class Runner(ModelRunner):
    def _allocate(self):
        super()._allocate()
        self.builder = PadSlotZero(self.buffers, self.config, self.bugs)


@pytest.fixture(scope="module")
def outcome():
    return audited(Runner, CUDAGraphMode.FULL)


def test_the_padding_changes_real_outputs(outcome):
    correct, _, graphed = outcome
    assert parts(correct, graphed)


def test_the_padded_slot_is_named(outcome):
    _, session, _ = outcome
    assert session.errors, "nothing found"
    assert {e.kind for e in session.errors} == {"PADDING_LEAK"}, [e.kind for e in session.errors]
    assert all(any("slot_mapping" in b for b in e.buffers) for e in session.errors), [e.buffers for e in session.errors]
