"""WRONG_GRAPH from the replaying function's parameters (`parity.audit.replay_checks.wrong_graph`), on two small
hand-made graphs: a dispatcher handed one forward's function that replays the other's graph is named; the same
replay with that function in a plain local (picked up from an attribute, meant for the next replay) is not."""

from __future__ import annotations

import torch

from parity.audit import auto_audit, emulated


class Steps:
    """Two forwards over one static input, each captured in its own graph and pool."""

    def __init__(self):
        self.x = torch.arange(6.0)
        self.graphs = {}
        for fn in (self.double, self.negate):
            graph = emulated.CUDAGraph()
            with emulated.graph(graph, pool=emulated.graph_pool_handle()):
                out = fn()
            self.graphs[fn.__name__] = (graph, emulated.weak_ref_tensors(out))

    def double(self):
        return self.x * 2

    def negate(self):
        return -self.x

    def run(self, fn, key):
        """Replays the graph under `key` for `fn` (the bug: a key that is not fn's)."""
        graph, out = self.graphs[key]
        graph.replay()
        return out.clone()

    def run_then(self, key):
        after = self.negate        # meant for a later replay, not this one
        graph, out = self.graphs[key]
        graph.replay()
        return out.clone(), after


def test_a_dispatcher_handed_one_forward_that_replays_the_others_graph_is_wrong_graph():
    with auto_audit(every=1) as session:
        steps = Steps()
        assert torch.equal(steps.run(steps.double, "double"), torch.arange(6.0) * 2)
        assert not session.errors
        steps.run(steps.negate, "double")
    assert [(e.kind, e.buffers) for e in session.errors] == [("WRONG_GRAPH", ["fn"])]


def test_a_function_in_a_plain_local_is_no_intent():
    with auto_audit(every=1) as session:
        steps = Steps()
        out, _ = steps.run_then("double")
    assert torch.equal(out, torch.arange(6.0) * 2) and not session.errors
