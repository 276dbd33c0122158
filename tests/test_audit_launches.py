"""Kernels launched past the dispatcher (Triton's JIT kernels) under the audit and the emulated backend.

Triton does not run on the CPU. A stand-in `triton.runtime.jit.JITFunction`
whose `run` writes with every dispatch mode suspended (a real kernel's writes
never reach one) takes its place on the code path a real one takes
(`parity/graphs/launches.py` wraps `JITFunction.run`). On CUDA the real case is
nano-vllm's Triton KV store (tests/test_audit_nano_vllm.py, marked gpu).
"""

from __future__ import annotations

import contextlib
import sys
import types

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from parity.audit import auto_audit, emulated


class JITFunction:
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    def run(self, *args, grid, warmup, **kwargs):
        with _disable_current_modes():
            self.fn(*args)
        return object()                 # stands for the launched kernel's handle


def _store(key, cache, slots):
    cache.index_copy_(0, slots, key)


@pytest.fixture
def store(monkeypatch):
    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = JITFunction
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    return JITFunction(_store)


class Decoder:
    """A decode step graphed by hand: its KV store a kernel launch, its read of the cache an aten op."""

    def __init__(self, store, bug=None):
        self.cache, self.x = torch.zeros(8, 4), torch.zeros(2, 4)
        self.slots = torch.zeros(2, dtype=torch.long)
        self.store, self.bug = store, bug

    def step(self):
        self.store[(2,)](self.x * 2, self.cache, self.slots)
        return self.cache.sum(0) + self.x

    def generate(self, steps=3):
        self.step()                                                     # warm-up
        self.cache.zero_()
        graph = emulated.CUDAGraph()
        with emulated.graph(graph):
            out = self.step()
        outs = []
        for i in range(steps):
            self.x.copy_(torch.full((2, 4), float(i + 1)))
            slots = torch.tensor([2 * i, 2 * i + 1])
            if self.bug == "rebound":
                self.slots = slots                                      # rebound instead of copied into
            else:
                self.slots.copy_(slots)
            graph.replay()
            outs.append(out.clone())
        return outs


def _run(store, audited: bool, bug=None):
    engine = Decoder(store, bug)
    with torch.no_grad(), (auto_audit(on_mismatch="record") if audited else contextlib.nullcontext()) as session:
        outs = engine.generate()
    return outs, engine.cache, session


def test_a_kernel_launch_is_captured_and_replayed_and_the_audit_leaves_no_trace(store):
    outs, cache, _ = _run(store, audited=False)
    expected = torch.zeros(8, 4)
    for i in range(3):
        expected[2 * i: 2 * i + 2] = 2.0 * (i + 1)      # each replay launched the store again, at the live slots
    assert torch.equal(cache, expected)
    audited, audited_cache, session = _run(store, audited=True)
    assert session.errors == [] and len(session.audits) == 1 and session.audits[0].replays == 3
    assert torch.equal(audited_cache, cache) and all(torch.equal(a, b) for a, b in zip(outs, audited))


def test_a_rebound_input_read_only_by_a_kernel_launch_is_named(store):
    _, _, session = _run(store, audited=True, bug="rebound")
    kinds = {(e.kind, tuple(e.buffers)) for e in session.errors}
    assert kinds == {("BUFFER_REASSIGNED", ("self.slots",))}, kinds
