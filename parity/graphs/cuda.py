"""The `cuda` backend: torch.cuda.CUDAGraph segments captured with capture_begin/end.

Explicit capture_begin()/capture_end() (rather than the torch.cuda.graph
context manager) let a piecewise capture end a segment at every attention
call, run attention eagerly on the capture stream, and begin the next segment.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parity.graphs.touched import Touched


class _ReadTracer(TorchDispatchMode):
    """Collects the storages every captured op touches and writes, for the capture manifest."""

    def __init__(self):
        super().__init__()
        self.touched = Touched()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.touched.add(func, args, kwargs)
        return func(*args, **kwargs)


class CudaSegment:
    def __init__(self, graph: torch.cuda.CUDAGraph, touched: Touched):
        self.graph = graph
        self.read_storages = touched.read_storages
        self.write_storages = touched.write_storages

    def replay(self) -> None:
        self.graph.replay()


class _Capture:
    def __init__(self, graph, tracer, stream_ctx):
        self.graph, self.tracer, self.stream_ctx = graph, tracer, stream_ctx


class _NonOwning:
    """A __cuda_array_interface__ over raw memory: torch.as_tensor then owns nothing."""

    def __init__(self, t: torch.Tensor):
        self.__cuda_array_interface__ = {
            "shape": (t.numel() * t.element_size(),), "typestr": "|u1",
            "data": (t.data_ptr(), False), "version": 2, "strides": None,
        }


def non_owning(t: torch.Tensor) -> torch.Tensor:
    raw = torch.as_tensor(_NonOwning(t), device=t.device)
    return raw.view(t.dtype).view(t.shape)


class CudaBackend:
    name = "cuda"

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def new_pool(self, name: str):
        return torch.cuda.graph_pool_handle()

    def warmup(self, fn, iterations: int = 2) -> None:
        """Run `fn` eagerly on a side stream so lazy initialisation stays out of the capture."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for _ in range(iterations):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        torch.cuda.synchronize(self.device)

    def begin(self, pool) -> _Capture:
        torch.cuda.synchronize(self.device)
        stream_ctx = torch.cuda.stream(self.stream)
        stream_ctx.__enter__()
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=pool)
        tracer = _ReadTracer()
        tracer.__enter__()
        return _Capture(graph, tracer, stream_ctx)

    def end(self, capture: _Capture) -> CudaSegment:
        capture.tracer.__exit__(None, None, None)
        capture.graph.capture_end()
        capture.stream_ctx.__exit__(None, None, None)
        torch.cuda.synchronize(self.device)
        return CudaSegment(capture.graph, capture.tracer.touched)

    def abort(self, capture: _Capture) -> None:
        capture.tracer.__exit__(None, None, None)
        try:
            capture.graph.capture_end()
        except RuntimeError:
            pass
        capture.stream_ctx.__exit__(None, None, None)

    @staticmethod
    def refused_while_capturing(exc: BaseException) -> bool:
        """Whether `exc`, raised inside a capture whose body ran eagerly in the warm-up, is CUDA refusing an op
        while the stream captures (a host sync, a pageable copy: "operation not permitted when stream is
        capturing") rather than the engine failing."""
        return isinstance(exc, RuntimeError) and "captur" in str(exc).lower()

    def finish(self, pool, outputs: tuple, segments, weak_outputs: bool) -> tuple:
        """End of a capture. The caching allocator already reclaimed what died; with weak
        outputs (as vLLM holds them) the outputs' memory goes back to the pool as well."""
        if not weak_outputs:
            return outputs
        return tuple(non_owning(t) if isinstance(t, torch.Tensor) else t for t in outputs)
