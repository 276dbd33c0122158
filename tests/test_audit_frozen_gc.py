"""A capture while the collector is frozen is audited as any other (vLLM freezes it while it captures).

vLLM captures its graphs under `gc.freeze()` unless VLLM_ENABLE_CUDAGRAPH_GC is
set: every object made before the capture is set aside, and
`gc.get_referrers` no longer sees it. The auto audit finds a module's function
that a capture block called by the name its module holds (a method by its
object, a module by itself, as before); with the collector's help only, it
was not found ("calls a callable the audit cannot rebuild").
"""

from __future__ import annotations

import gc

import pytest
import torch

from parity.audit import auto_audit, emulated


GAIN = {"value": 1.0}     # a host value the graph bakes: set after capture, eager and the replay part


def _step(x, scale):
    return x * scale * GAIN["value"]


@pytest.mark.parametrize("bug", [False, True], ids=["clean", "host value moved"])
def test_a_capture_under_a_frozen_collector_is_audited(bug):
    x, scale = torch.ones(4), torch.full((4,), 2.0)
    GAIN["value"] = 1.0
    with torch.no_grad(), auto_audit(every=1) as session:
        graph = emulated.CUDAGraph()
        gc.collect()
        gc.freeze()
        try:
            with emulated.graph(graph):
                out = _step(x, scale)
        finally:
            gc.unfreeze()
        scale.fill_(3.0)
        GAIN["value"] = 2.0 if bug else 1.0
        graph.replay()
    assert [a.name for a in session.audits] == ["_step()"]
    assert torch.equal(out, x * 3) and bool(session.errors) == bug, session.errors
