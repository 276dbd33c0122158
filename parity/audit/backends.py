"""The two kinds of graph an audit can sit on: real `torch.cuda.CUDAGraph`s and the emulated stand-in.

What differs between them is small and lives here: how an output is held
without keeping its memory (so the audit never changes what the caching
allocator or the emulated pool hands out), and how a callable is re-captured
for the frozen-value experiments (CUDA: warm-up and capture on a side stream
into a fresh pool, as vLLM and `torch.cuda.make_graphed_callables` do).
"""

from __future__ import annotations

import torch

from parity.audit import capture as capture_stack
from parity.audit import emulated
from parity.audit.trace import WriteLog

# Saved at import, before any patching: internal captures must never be audited themselves.
_TORCH_GRAPH = getattr(torch.cuda, "CUDAGraph", None)
_TORCH_GRAPH_CTX = getattr(torch.cuda, "graph", None)


class CudaBackend:
    name = "cuda"

    def sync(self) -> None:
        torch.cuda.synchronize()

    def recapture(self, fn, args: tuple, kwargs: dict, start=lambda: None):
        """(graph, outputs): `fn` warmed up and captured on a side stream into a fresh pool; no trace left.
        `start()` runs before each call (it puts host values where the capture must find them: the warm-up
        moves any the callable advances itself)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), WriteLog() as log, torch.cuda.stream(stream):
            start()
            fn(*args, **kwargs)
        torch.cuda.current_stream().wait_stream(stream)
        log.undo()
        torch.cuda.synchronize()
        graph = _TORCH_GRAPH()
        start()
        with capture_stack.internal(graph), capture_stack.paused_gc(), torch.no_grad():
            with _TORCH_GRAPH_CTX(graph, pool=torch.cuda.graph_pool_handle(), stream=stream):
                outputs = fn(*args, **kwargs)
        torch.cuda.synchronize()
        return graph, outputs


class EmulatedBackend:
    name = "emulated"

    def sync(self) -> None:
        """Nothing runs asynchronously on the CPU."""

    def recapture(self, fn, args: tuple, kwargs: dict, start=lambda: None):
        """(graph, outputs): `fn` captured by the emulated stand-in into a fresh pool (capture leaves no trace);
        `start()` runs before the call."""
        graph = emulated.CUDAGraph()
        start()
        with capture_stack.internal(graph), torch.no_grad():
            with emulated.graph(graph, pool=emulated.graph_pool_handle()):
                outputs = fn(*args, **kwargs)
        return graph, outputs


def backend_for(graph) -> CudaBackend | EmulatedBackend:
    """The backend a graph object belongs to."""
    if _TORCH_GRAPH is not None and isinstance(graph, _TORCH_GRAPH):
        return CudaBackend()
    return EmulatedBackend()
