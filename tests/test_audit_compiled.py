"""torch.compile'd code under the audit: it runs compiled, captured and shadow-run alike (parity.graphs.compiled).

A counting backend tells whether the compiled artifact ran (it counts its
calls) or torch fell back to eager Python (a dispatch mode that does not
ignore compile internals makes dynamo skip the frame); its artifact hides its
kernels from dispatch modes and differs from eager in the last bits, as
inductor's do, so an audit that ran it eagerly anywhere would show.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from parity.audit import auto_audit, emulated, lifetime


def counted(fn):
    calls = []

    def backend(gm, inputs):
        def run(*args):
            calls.append(1)
            return gm.forward(*args)
        return run
    return torch.compile(fn, backend=backend, dynamic=False), calls


def program(sampler):
    """Two graph sizes in one pool and a compiled sampler run eagerly between replays, while the batch-2
    output is watched (the batch-4 replay overwrote it): the watcher must leave the sampler compiled."""
    x, w = torch.linspace(-1, 1, 4 * 128).view(4, 128), torch.linspace(-1, 1, 128 * 128).view(128, 128)
    pool, g, out = emulated.graph_pool_handle(), {}, {}

    def step(bs):
        a = torch.relu(x[:bs] @ w)
        b, c = a * 2, a + 1
        return (a * b + c) @ w
    for bs in (2, 4):
        g[bs] = emulated.CUDAGraph()
        with emulated.graph(g[bs], pool=pool):
            strong = step(bs)
        out[bs] = emulated.weak_ref_tensors(strong)
        del strong
    g[2].replay()
    g[4].replay()
    return sampler(out[4]), bool(lifetime._WATCHES)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode], ids=lambda m: m.__name__)
def test_compiled_code_between_replays_stays_compiled_under_the_audit_and_computes_the_same(grad_mode):
    """Under inference mode the watcher's re-arming function mode is on the stack too (`rearm.Rearm`): dynamo
    must not trace its key calls into the sampler."""
    sampler, calls = counted(lambda t: (t * 3).softmax(-1).argmax(-1))
    with grad_mode():
        plain, _ = program(sampler)
        before = len(calls)
        with auto_audit(on_mismatch="raise") as session:
            audited, watched = program(sampler)
    assert watched                                        # the watcher was on the stack when the sampler ran
    assert before >= 1 and len(calls) == 2 * before      # the compiled artifact ran audited too, not eager Python
    assert torch.equal(plain, audited) and session.errors == []


class _Fp64Matmul(TorchDispatchMode):
    """The artifact's own kernel: a matmul accumulated in float64, so its last bits differ from eager's."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            return (args[0].double() @ args[1].double()).to(args[0].dtype)
        return func(*args, **(kwargs or {}))


def fused(fn):
    """torch.compile with a backend whose artifact, like inductor's, runs kernels no dispatch mode sees."""
    calls = []

    def backend(gm, inputs):
        def run(*args):
            calls.append(1)
            with _disable_current_modes(), _Fp64Matmul():
                return gm.forward(*args)
        return run
    return torch.compile(fn, backend=backend, dynamic=False), calls


class Decoder:
    """A decode step graphed by hand whose layer is torch.compile'd and writes a KV cache inside it."""

    def __init__(self, G, device, bug=None):
        gen = torch.Generator().manual_seed(0)
        self.w = torch.randn(16, 16, generator=gen).to(device) / 4
        self.cache = torch.zeros(8, 16, device=device)
        self.x, self.pos = torch.zeros(2, 16, device=device), torch.zeros(2, dtype=torch.long, device=device)
        self.layer, self.calls = fused(self._layer)
        self.G, self.bug = G, bug

    def _layer(self, x, pos):
        self.cache.index_copy_(0, pos, x)
        return torch.tanh(x @ self.w) + self.cache.mean(0)

    def step(self):
        return self.layer(self.x, self.pos)

    def generate(self, steps=4):
        x = torch.linspace(-1, 1, 32, device=self.w.device).view(2, 16)
        self.x.copy_(x)
        self.step()                                                     # warm-up: compiles
        self.cache.zero_()
        graph = self.G.CUDAGraph()
        with self.G.graph(graph):
            out = self.step()
        outs = []
        for i in range(steps):
            if self.bug == "rebound":
                self.x = x.clone()                                      # rebound instead of copied into
            else:
                self.x.copy_(x)
            self.pos.copy_(torch.tensor([2 * i, 2 * i + 1]))
            graph.replay()
            outs.append(out.clone())
            x = out * 0.5
        return outs


def _run(G, device, audited: bool, bug=None):
    engine = Decoder(G, device, bug)
    with torch.no_grad(), (auto_audit(on_mismatch="record") if audited else contextlib.nullcontext()) as session:
        outs = engine.generate()
    return outs, engine, session


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_compiled_layer_captured_under_the_audit_runs_compiled_and_computes_the_same(device):
    G = torch.cuda if device == "cuda" else emulated
    plain, engine, _ = _run(G, device, audited=False)
    # warm-up and capture ran the artifact, and so did each emulated replay (a CUDA replay runs no Python)
    assert len(engine.calls) == (2 if device == "cuda" else 6)
    before = len(engine.calls)
    audited, engine, session = _run(G, device, audited=True)
    assert session.errors == [] and len(session.audits) == 1
    assert all(torch.equal(a, b) for a, b in zip(plain, audited))      # bitwise, the KV cache write included
    # the artifact ran where it runs unaudited (its float64 matmul differs from eager's in the last bits, so
    # an eager capture or an eager shadow run would show as a mismatch above); the shadow checks add calls
    assert len(engine.calls) >= before
    probe = Decoder(G, device)
    probe.x.copy_(torch.linspace(-1, 1, 32, device=device).view(2, 16))
    with torch.no_grad():
        assert not torch.equal(probe._layer(probe.x, probe.pos), probe.layer(probe.x, probe.pos))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_rebound_input_of_a_compiled_layer_is_named_from_its_dry_twin(device):
    # the compiled artifact's reads are hidden from dispatch modes: only its dry twin puts self.x in the read set
    G = torch.cuda if device == "cuda" else emulated
    _, _, session = _run(G, device, audited=True, bug="rebound")
    kinds = {(e.kind, tuple(e.buffers)) for e in session.errors}
    assert kinds == {("BUFFER_REASSIGNED", ("self.x",))}, kinds


def test_a_compiled_call_captured_into_a_pool_replays_on_the_live_input():
    """A compiled region recorded by the emulated backend with a memory pool (as vLLM's and nano-vllm's captures
    use): its own allocations go to the pool, and the replay reads the input as it is now."""
    fn, calls = counted(lambda t: (t * 2).relu() + 1)
    x = torch.linspace(-1, 1, 64).view(8, 8)
    graph, pool = emulated.CUDAGraph(), emulated.graph_pool_handle()
    with torch.no_grad():
        fn(x)                                   # compiled before the capture, as engines warm up
        with emulated.graph(graph, pool=pool):
            out = fn(x)
        x.copy_(x.flip(0))
        graph.replay()
    assert torch.equal(out, (x * 2).relu() + 1) and len(calls) >= 2


def test_the_shadow_run_computes_under_the_torch_state_the_graph_was_captured_in():
    """nano-vllm captures under set_default_dtype(float16) and set_default_device("cuda") and serves under
    float32 and the CPU. The graph keeps what its capture baked (here a float64 factory, so a float64 output);
    a shadow run under the serving state computes something else, and calls the compiled layer under other
    guards (dynamo compiles it again; at its recompile limit it runs eagerly: other kernels, other bits)."""
    compiles = []

    def backend(gm, inputs):
        compiles.append(1)
        return gm.forward
    w = torch.linspace(-1, 1, 256).view(16, 16)
    layer = torch.compile(lambda x: torch.tanh(x @ w) + torch.arange(16) / 16, backend=backend, dynamic=False)
    x = torch.linspace(-1, 1, 32).view(2, 16)

    def step():
        return layer(x)
    dtype = torch.get_default_dtype()
    with torch.no_grad(), auto_audit(on_mismatch="record") as session:
        torch.set_default_dtype(torch.float64)
        torch.set_default_device("cpu")
        try:
            step()                                                      # warm-up: compiles
            graph = emulated.CUDAGraph()
            with emulated.graph(graph):
                out = step()
            captured = len(compiles)
        finally:
            torch.set_default_dtype(dtype)
            torch.set_default_device(None)
        graph.replay()
    assert out.dtype == torch.float64
    assert session.errors == [] and len(session.audits) == 1 and session.audits[0].replays == 1
    assert len(compiles) == captured            # the replay's checks ran the artifacts the capture compiled
    assert torch.get_default_dtype() == dtype and torch.get_default_device() == torch.device("cpu")
