"""OUTPUT_ALIASED through the audit: a view of a graph's output kept past the graph's own next replay.

A tiny forward graphed at one batch size, its output held weakly (as vLLM
holds it). Eagerly every call returns a new tensor, so a view taken after one
call keeps that call's values; the graph's next replay rewrites them. Reading
such a view later is the bug; taking the view again after each replay, or an
output that is a buffer the callable writes in place (the same tensor eagerly
too), is not. The program may replay inside `torch.inference_mode()` and read
after leaving it: the watcher must still see the read.
"""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from parity.audit import GraphAudit, auto_audit, emulated, lifetime
from parity.audit.rearm import Rearm


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Forward:
    def __init__(self, device: str):
        self.x = torch.linspace(-1, 1, 2 * 64, device=device).view(2, 64)
        self.w = torch.linspace(-1, 1, 64 * 64, device=device).view(64, 64)
        self.buffer = torch.zeros(2, 64, device=device)

    def step(self) -> torch.Tensor:
        return torch.relu(self.x @ self.w) * 2

    def step_into_buffer(self) -> torch.Tensor:
        self.buffer.copy_(torch.relu(self.x @ self.w) * 2)
        return self.buffer


def run(program, body: str = "step", inference: bool = False, device: str = "cpu"):
    """Capture `body` (on the emulated backend on the CPU, as a torch.cuda graph on CUDA), then `program`."""
    fwd = Forward(device)
    grad = torch.inference_mode if inference else contextlib.nullcontext
    with grad():
        if device == "cuda":
            g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):                # warm-up, as torch.cuda graphs need
                getattr(fwd, body)()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(g):
                out = getattr(fwd, body)()
        else:
            g = emulated.CUDAGraph()
            with emulated.graph(g):
                strong = getattr(fwd, body)()
            out = emulated.weak_ref_tensors(strong)
            del strong
    return program(fwd, g, out, grad)


def kept_across_its_own_replay(fwd, g, out, grad):
    with grad():
        g.replay()
        kept = out[:1]                                   # BUG: a view of this replay's output, kept
        fwd.x.add_(1)
        g.replay()
    return kept.clone()


def taken_again_after_each_replay(fwd, g, out, grad):
    with grad():
        g.replay()
        first = out[:1].clone()
        fwd.x.add_(1)
        g.replay()
    return torch.cat([first, out[:1].clone()])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inference", [False, True], ids=["no_grad", "inference_mode"])
def test_a_view_kept_past_its_graphs_next_replay_is_output_aliased(inference, device):
    """Also with the default device set (`torch.set_default_device`, a function mode at the bottom of the stack, as
    nano-vllm's runner leaves it): the watcher's re-arming mode goes on top of it."""
    torch.set_default_device("cpu")
    try:
        with auto_audit(on_mismatch="record") as session:
            got = run(kept_across_its_own_replay, inference=inference, device=device)
    finally:
        torch.set_default_device(None)
    assert [(e.kind, e.buffers) for e in session.errors] == [("OUTPUT_ALIASED", ["out"])]
    assert "its own next replay" in session.errors[0].diagnosis["evidence"][0]
    assert "test_audit_kept_outputs.py" in session.errors[0].diagnosis["evidence"][1]    # where the program read it
    assert torch.equal(got, run(kept_across_its_own_replay, inference=inference, device=device))   # its own values
    modes = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
    assert torch._C._len_torch_dispatch_stack() == 0 and not any(isinstance(m, Rearm) for m in modes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inference", [False, True], ids=["no_grad", "inference_mode"])
def test_a_view_taken_again_after_each_replay_is_no_alias(inference, device):
    with auto_audit(on_mismatch="raise") as session:
        run(taken_again_after_each_replay, inference=inference, device=device)
    assert session.errors == []


@pytest.mark.parametrize("device", DEVICES)
def test_an_output_the_callable_writes_in_place_is_the_same_tensor_eagerly(device):
    with auto_audit(on_mismatch="raise") as session:
        run(kept_across_its_own_replay, body="step_into_buffer", device=device)
    assert session.errors == []


def test_the_watcher_leaves_the_stack_when_the_last_audit_dies():
    """The watcher sees every op the program runs while an audited graph lives: once the graph and its audit are
    gone (no auto_audit scope ends it for an audit made by hand), nothing is left on the dispatch stack."""
    gc.collect()      # audits of earlier tests in reference cycles: each takes the watcher off when collected
    assert not lifetime.audits() and torch._C._len_torch_dispatch_stack() == 0
    fwd = Forward("cpu")
    audit = GraphAudit(fwd.step, name="step", on_mismatch="raise")
    graph = emulated.CUDAGraph()
    with emulated.graph(graph):
        audit()
    graph.replay()
    assert torch._C._len_torch_dispatch_stack() == 1       # on between replays: views of its output are watched
    del audit, graph
    assert torch._C._len_torch_dispatch_stack() == 0
