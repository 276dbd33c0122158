"""WRONG_GRAPH from the replaying function's parameters (`parity.audit.replay_checks.wrong_graph`), on two small
hand-made graphs: a dispatcher handed one forward's function that replays the other's graph is named; the same
replay with that function in a plain local (picked up from an attribute, meant for the next replay) is not; a
replay whose callable cannot even run on its inputs (a graph captured at another batch size) is reported, with the
line that raised and the host values that moved, and never raised into the program."""

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


class Rows:
    """One graph of a forward shaped by a host value (rows), captured at 2 rows: a replay for 4 rows replays it."""

    def __init__(self):
        self.x = torch.arange(6.0)
        self.rows = 2
        self.graph = emulated.CUDAGraph()
        with emulated.graph(self.graph, pool=emulated.graph_pool_handle()):
            self.out = emulated.weak_ref_tensors(self.forward())

    def forward(self):
        return self.x.view(self.rows, -1).sum(dim=1)


def test_a_callable_that_cannot_run_on_the_replays_inputs_is_reported_not_raised_into_the_program():
    with auto_audit(every=1) as session:
        rows = Rows()
        rows.rows = 4                  # the bug: the graph captured at 2 rows replayed for 4
        rows.graph.replay()            # the eager run of forward() raises: the program must not see it
        out = rows.out.clone()
    assert torch.equal(out, torch.tensor([3.0, 12.0]))         # what the graph computes, as unaudited
    [error] = session.errors
    assert error.kind == "UNEXPLAINED" and "raised RuntimeError" in error.diagnosis["evidence"][0]
    assert "test_audit_wrong_graph.py:" in error.diagnosis["evidence"][0]     # the program's line that raised
    assert "self.rows (2 at capture, 4 now)" in error.diagnosis["evidence"][-1]
