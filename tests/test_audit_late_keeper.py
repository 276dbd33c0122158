"""A persistent buffer reached only through a registry built after capture still counts as kept (cheap.py).

nano-vllm's shape: the graph reads its inputs through a global context whose
fields are per-step tensors at replay; the runner keeps the captured buffers in
a dict it builds after its capture loop and copies each step's values into
them. Declared with a getter that has nothing at capture, the dict is found at
replay: no BUFFER_REASSIGNED, and a buffer the runner forgets to fill is still
named (STALE_BUFFER, through the dict).
"""

from __future__ import annotations

import torch

from parity.audit import auto_audit, emulated

CONTEXT = {"now": None}


class _Context:
    def __init__(self, lens):
        self.lens = lens


def _step(x):
    return x * CONTEXT["now"].lens[:, None].float()


def _run(stale: bool, registry: bool = True):
    runner = {}
    static = {"context": lambda: CONTEXT["now"], "graph_vars": lambda: runner.get("graph_vars")}
    if not registry:
        del static["graph_vars"]
    configure = lambda fn, args: {"static_inputs": static}  # noqa: E731
    x, lens = torch.ones(4, 3), torch.zeros(4, dtype=torch.int32)
    with torch.no_grad(), auto_audit(every=1, configure=configure) as session:
        CONTEXT["now"] = _Context(lens)
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            out = _step(x)
        runner["graph_vars"] = {"lens": lens}               # built after the capture loop, as nano-vllm does
        for i in range(1, 4):
            CONTEXT["now"] = _Context(torch.full((4,), i, dtype=torch.int32))   # this step's fresh tensor
            if not stale:
                runner["graph_vars"]["lens"].copy_(CONTEXT["now"].lens)
            graph.replay()
            assert torch.equal(out, x * i) != stale
    return {(e.kind, tuple(e.buffers)) for e in session.errors}


def test_a_buffer_kept_by_a_registry_built_after_capture_is_not_reassigned():
    assert _run(stale=False) == set()


def test_a_buffer_the_runner_forgets_to_fill_is_stale_through_the_late_registry():
    assert _run(stale=True) == {("STALE_BUFFER", ("static['graph_vars']['lens']",))}


def test_with_the_registry_undeclared_nothing_reaches_the_captured_buffer():
    # NOTE: the control: the context's field moved and no live path reaches what the graph reads.
    assert _run(stale=False, registry=False) == {("BUFFER_REASSIGNED", ("static['context'].lens",))}
