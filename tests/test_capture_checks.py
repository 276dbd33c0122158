"""The graph runner's own checks: an op no graph can capture (CAPTURE_ERROR at the engine's line) and a graph
looked up for another key than its batch's (WRONG_GRAPH / DESCRIPTOR_MISMATCH, refused before it replays).

The same test bodies run on the emulated backend and, marked gpu, on CUDA: each illegal op is refused by both,
and the line named is the same.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch

from parity.diagnose import capture_error
from parity.diagnose.descriptor import kind_of
from parity.diagnosis.kinds import CAPTURE_ERROR, DESCRIPTOR_MISMATCH, WRONG_GRAPH
from parity.graphs.capture import capture
from parity.graphs.capture_errors import CaptureError, engine_source, import_name
from parity.graphs.descriptor import BatchDescriptor, CapturedFor, Dispatch, WrongGraph
from parity.graphs.dispatcher import Dispatcher
from parity.graphs.factory import make_backend
from parity.graphs.manager import GraphEntry, GraphExecutor

HERE = import_name(__file__)


def _item(x):
    return (x * int(x[0].item()),)


def _tolist(x):
    return (x[: len([v for v in x.tolist() if v > 0])],)


def _cpu(x):
    return (x + x.cpu().sum().to(x.device),)


def _print(x):
    return (x * len(repr(x)),)


def _nonzero(x):
    return (torch.nonzero(x > 0).float(),)


def _mask(x):
    return (x[x > 0] * 2,)


def _branch(x):
    return (x * 2 if x.sum() > 0 else x,)


ILLEGAL = {"item": _item, "tolist": _tolist, "cpu": _cpu, "print": _print, "nonzero": _nonzero, "mask": _mask,
           "branch": _branch}


def _line_of(body) -> int:
    lines, first = inspect.getsourcelines(body)
    return first + 1     # the body's one statement


def refused_on(backend_name: str, body) -> None:
    """`body` runs eagerly, cannot be captured on `backend_name` (the backend says so), and leaves the backend
    able to capture a clean body right after."""
    backend = make_backend(backend_name, torch.device("cuda" if backend_name == "cuda" else "cpu"))
    x = torch.arange(1, 9, dtype=torch.float32, device=backend.device)
    body(x)                                  # legal in eager code
    backend.warmup(lambda: body(x))
    with pytest.raises(Exception) as caught:
        capture(backend, backend.new_pool("p"), lambda: body(x), piecewise=False)
    assert backend.refused_while_capturing(caught.value), caught.value
    source = engine_source(caught.value.__traceback__)
    assert (source.file, source.line) == (HERE, _line_of(body)), source
    clean = capture(backend, backend.new_pool("p"), lambda: (x * 3,), piecewise=False)
    x.copy_(torch.arange(2, 10, dtype=torch.float32, device=backend.device))
    assert torch.equal(clean.replay()[0], x * 3)


@pytest.mark.parametrize("name", list(ILLEGAL))
def test_the_emulated_backend_refuses_what_cuda_refuses_and_names_the_line(name):
    refused_on("emulated", ILLEGAL[name])


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ILLEGAL))
def test_cuda_refuses_the_same_ops_at_the_same_line(name):
    refused_on("cuda", ILLEGAL[name])


def test_an_engine_failing_for_another_reason_is_not_a_capture_error():
    backend = make_backend("emulated", torch.device("cpu"))
    with pytest.raises(IndexError) as caught:
        capture(backend, backend.new_pool("p"), lambda: (torch.zeros(2)[5],), piecewise=False)
    assert not backend.refused_while_capturing(caught.value)


@dataclass
class Meta:
    live: torch.Tensor


def _counting_forward(num_tokens, num_reqs, meta):
    n = int(meta.live.sum().item())
    return (torch.ones(num_tokens, device=meta.live.device) * n,)


def capture_error_of(backend_name: str) -> CaptureError:
    device = torch.device("cuda" if backend_name == "cuda" else "cpu")
    backend = make_backend(backend_name, device)
    executor = GraphExecutor("target", "full", backend, backend.new_pool("target"),
                             Dispatcher("full", (4, 8), 4, 8, {"verify": 1}), [])
    with pytest.raises(CaptureError) as caught:
        executor.capture_phase("verify", _counting_forward, lambda t, r: Meta(torch.ones(t, device=device)), 8,
                               lambda: None)
    return caught.value


@pytest.mark.parametrize("backend_name", ["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_capture_error_names_the_graph_and_the_line_and_is_diagnosed(backend_name):
    error = capture_error_of(backend_name)
    assert (error.captured_for.owner, error.captured_for.phase, error.captured_for.runtime_mode) == (
        "target", "verify", "full")
    assert error.source.name == f"{HERE}:{_line_of(_counting_forward)}"
    assert error.source.function == "_counting_forward" and ".item()" in error.source.code
    d = capture_error.diagnose("full", error)
    assert d.kind == CAPTURE_ERROR and d.buffers == [error.source.name, "_counting_forward"] and d.step is None
    assert d.phase == "verify" and d.owner == "target" and d.experiment
    assert any(error.source.code in line for line in d.evidence)


# --- what a graph was captured for, checked at replay -------------------------------------------

class Graph:
    def __init__(self):
        self.replays = 0

    def replay(self, meta=None):
        self.replays += 1
        return ()


def executor_with(entries: dict, graph_key=None) -> GraphExecutor:
    executor = GraphExecutor("drafter", "piecewise", None, None, None, [])
    if graph_key is not None:
        executor.graph_key = graph_key
    for captured_for, graph in entries.items():
        key = executor.graph_key(captured_for.phase, captured_for.runtime_mode, captured_for.descriptor)
        if key not in executor.graphs:
            executor.graphs[key] = GraphEntry(graph, (), captured_for.descriptor.num_tokens, 4, {}, captured_for)
    return executor


FOUR = BatchDescriptor(4, None, False)
PREFILL, STEP = (CapturedFor("drafter", phase, "piecewise", FOUR) for phase in ("draft_prefill", "draft_step"))
STEP_DISPATCH = Dispatch("draft_step", "piecewise", 3, 3, 4, 4, FOUR)


def test_a_graph_of_another_phase_is_refused_before_it_replays():
    prefill = Graph()
    executor = executor_with({PREFILL: prefill, STEP: Graph()}, graph_key=lambda phase, runtime, d: (runtime, d))
    with pytest.raises(WrongGraph) as caught:
        executor.execute(STEP_DISPATCH, None, None)
    assert prefill.replays == 0 and executor.replays == 0
    assert (caught.value.replayed, caught.value.wanted) == (PREFILL, STEP)
    record = caught.value.as_dict()
    assert record["differs"] == ["phase"] and "draft_prefill" in record["replayed"]["graph"]
    assert "draft_step" in record["wanted"]["graph"]


def test_the_graph_captured_for_the_batch_replays():
    step = Graph()
    executor = executor_with({PREFILL: Graph(), STEP: step})
    executor.execute(STEP_DISPATCH, None, None)
    assert step.replays == 1 and executor.replays == 1


def test_what_differs_decides_the_kind():
    eight = CapturedFor("drafter", "draft_step", "piecewise", BatchDescriptor(8, None, False))
    assert STEP.differing(eight) == ["descriptor"] and kind_of(["descriptor"]) == DESCRIPTOR_MISMATCH
    assert PREFILL.differing(STEP) == ["phase"] and kind_of(["phase"]) == WRONG_GRAPH
    full = CapturedFor("drafter", "draft_prefill", "full", BatchDescriptor(8, None, False))
    assert STEP.differing(full) == ["phase", "runtime_mode", "descriptor"]
    assert kind_of(STEP.differing(full)) == WRONG_GRAPH
    assert STEP.describe() == "drafter draft_step piecewise graph for 4 tokens"
    assert CapturedFor("target", "verify", "full", BatchDescriptor(16, 4, True)).describe() == (
        "target verify full graph for 16 tokens x 4 rows (uniform)")
