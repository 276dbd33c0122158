"""Red team (issue 28): a decode graph of another size replayed for a batch, on examples/gpt_fast.

The engine pads 3 live rows to 4 but looks its graph up by the largest size <= 3, so the graph captured for 2
rows replays: the third request gets no logits that step. Truth (docs/bugs.md): a graph
captured for another padded shape of the batch's own phase is DESCRIPTOR_MISMATCH. Today the audit reports
nothing (the graph equals its own callable at its own shape; the lookup is never checked against num_valid).
"""

from __future__ import annotations

import pytest

from examples.gpt_fast import Engine, audited_generate

PROMPTS, MAX_NEW = [5, 9, 17], [8, 5, 2]


class FloorGraph(Engine):
    """BUG: the decode graph is looked up by the largest captured size <= the live rows (too small a graph)."""

    def _run(self, fn, graph_entry, batch, bs, refresh_positions=True):
        if fn == self.decode_step and graph_entry is not None:
            graph_entry = self.decode[max(s for s in self.sizes if s <= self.num_valid)]
        return super()._run(fn, graph_entry, batch, bs, refresh_positions)


@pytest.fixture(scope="module")
def outcome():
    eager = Engine(graphs=False).generate(PROMPTS, MAX_NEW)
    session, tokens, logits = audited_generate(FloorGraph, PROMPTS, MAX_NEW)
    return eager, session, logits


def test_the_wrong_size_is_a_real_graph_bug(outcome):
    (_, eager_logits), _, logits = outcome
    assert [t.shape for t in logits] != [t.shape for t in eager_logits]     # a step's third row is missing


def test_a_graph_of_another_size_is_named(outcome):
    _, session, _ = outcome
    assert session.errors, "nothing found"
    assert {e.kind for e in session.errors} == {"DESCRIPTOR_MISMATCH"}, [e.kind for e in session.errors]
