"""Red team (issue 28): the draft step replays the target's decode graph, on examples/gpt_fast.

The engine keeps its graphs in one dict keyed by batch size, so the draft's lookup at size 4 finds the decode
graph captured there first: every draft step replays the target's decode[4] (in the target's pool) instead
of the draft graph. The draft never writes its history, and decode[4]'s replay overwrites the smaller decode
graphs' logits before the engine reads them. Truth (docs/bugs.md): WRONG_GRAPH (a graph captured for another
forward), named by `replay_checks.wrong_graph` from the replaying frame's `fn`; before it, OUTPUT_ALIASED on
decode[2] / decode[1], the symptom.
"""

from __future__ import annotations

import pytest
import torch

from examples.gpt_fast import Engine, audited_generate

PROMPTS, MAX_NEW = [5, 9, 17], [8, 5, 2]


class SizeKeyed(Engine):
    def _capture(self):
        super()._capture()
        graphs = dict(self.decode)                               # BUG: one dict keyed by batch size only
        graphs.setdefault(self.max_batch, self.draft_graph)
        self.draft_graph = graphs[self.max_batch]


@pytest.fixture(scope="module")
def outcome():
    eager = Engine(graphs=False)
    eager_tokens, eager_logits = eager.generate(PROMPTS, MAX_NEW)
    session, tokens, logits = audited_generate(SizeKeyed, PROMPTS, MAX_NEW)
    return eager_logits, session, logits


def test_the_wrong_graph_parts_from_eager(outcome):
    eager_logits, _, logits = outcome
    assert not all(torch.equal(a, b) for a, b in zip(eager_logits, logits))


def test_the_wrong_graph_is_named(outcome):
    _, session, _ = outcome
    assert session.errors, "nothing found"
    assert {e.kind for e in session.errors} == {"WRONG_GRAPH"}, [(e.kind, e.buffers) for e in session.errors]
    # the engine's `_run(self, fn, graph_entry, ...)` holds fn = draft_step while it replays decode[4]
    assert {tuple(e.buffers) for e in session.errors} == {("fn",)}, [e.buffers for e in session.errors]
