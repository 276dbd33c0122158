"""parity.audit on two capture-time mistakes a shadow run alone cannot place, each on a hand-made callable:

- an input absent (None) when the graph was captured: the code that reads it never ran at capture, so the
  graph lacks its work (here: a cache write). Named CAPTURE_CONTEXT with the write it skips and the input;
- a counter the callable advances itself: the graph baked the value its capture read, a replay neither reads
  the live one nor moves it. Named FROZEN_AT_CAPTURE by its path, and the audit's own eager runs leave it
  where the program left it (they run the callable, which moves it).
"""

from __future__ import annotations

import torch

from parity.audit import GraphAudit, audited_graph
from parity.audit import emulated as G


class CachedStep:
    def __init__(self, extra=None):
        self.x = torch.zeros(4)
        self.cache = torch.zeros(4)
        self.extra = extra
        self.w = torch.linspace(0.5, 2.0, 4)

    def __call__(self):
        y = self.x * self.w
        if self.extra is not None:
            self.cache.copy_(y + self.extra)
        return y + self.cache


class CountingStep:
    def __init__(self):
        self.out = torch.zeros(3, 4)
        self.col = 0
        self.x = torch.ones(4)

    def __call__(self):
        self.out[self.col % 3].copy_(self.x * (self.col + 1))
        self.col += 1
        return self.x * 2


def _captured(step):
    audit = GraphAudit(step, name="step", on_mismatch="record")
    graph = G.CUDAGraph()
    with audited_graph(graph, audit, pool=G.graph_pool_handle()):
        audit()
    return audit, graph


def test_an_input_absent_at_capture_names_the_write_the_graph_skips_and_the_input():
    step = CachedStep()
    audit, graph = _captured(step)
    step.extra = torch.ones(4)
    step.x.copy_(torch.arange(4.0))
    graph.replay()
    [error] = audit.errors
    assert (error.kind, error.buffers) == ("CAPTURE_CONTEXT", ["self.cache", "self.extra"]), error.diagnosis
    assert "present" in error.diagnosis["experiment"]
    assert any("never writes" in line for line in error.diagnosis["evidence"])


def test_an_input_present_at_capture_gives_no_diagnosis():
    step = CachedStep(extra=torch.zeros(4))
    audit, graph = _captured(step)
    step.extra.copy_(torch.ones(4))
    step.x.copy_(torch.arange(4.0))
    graph.replay()
    assert audit.errors == []


def test_a_counter_the_callable_advances_is_named_and_the_audit_leaves_it_alone():
    step = CountingStep()
    step.col = 2                  # the capture reads 2 (and moves it to 3)
    audit, graph = _captured(step)
    step.col = 0                  # the program resets it; a replay neither reads nor moves it
    graph.replay()
    assert step.col == 0, "the audit's eager runs advanced the program's counter"
    [error] = audit.errors
    assert (error.kind, error.buffers) == ("FROZEN_AT_CAPTURE", ["self.col"]), error.diagnosis
    evidence = " ".join(error.diagnosis["evidence"])
    assert "captured 2, live 0" in evidence and "advanced by the forward itself" in evidence
