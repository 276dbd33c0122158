"""An emulated stand-in for torch.cuda's graph API, so the same engine code runs on the CPU.

    G = torch.cuda if torch.cuda.is_available() else parity.audit.emulated
    g = G.CUDAGraph()
    with G.graph(g, pool=G.graph_pool_handle()):
        out = step(static_inputs)
    g.replay()

Same names and semantics as torch.cuda: `CUDAGraph` (`capture_begin(pool)`,
`capture_end()`, `replay()`, `reset()`, `pool()`), the `graph(...)` context
manager, `graph_pool_handle()`, `is_current_stream_capturing()`, plus
`weak_ref_tensors()` (vLLM's helper: hold outputs without keeping their
memory). It records with `parity.graphs.emulated` (the harness's recorder and
its caching-allocator pools), so replay reads the captured tensors, Python
values are frozen at capture, host syncs during capture raise and pools alias
as on CUDA. Capture really executes on the CPU, so it runs under an undo log
and leaves no trace, as a CUDA capture (which executes nothing) does.
"""

from __future__ import annotations

import itertools

import torch
from torch.utils._pytree import tree_map

from parity.audit import capture as capture_stack
from parity.audit.aliases import non_owning
from parity.audit.trace import WriteLog
# NOTE: only the backend's begin/end/abort/new_pool are used, so a reorganisation of
# parity.graphs behind that interface does not reach the audit.
from parity.graphs.emulated import EmulatedBackend as _Recorders
# Streams and events: the model of asynchronous copies the overlapped loop uses (docs/overlap.md).
from parity.graphs.streams import Event, Stream, stream  # noqa: F401
from parity.graphs import streams as _streams

_RECORDERS = _Recorders(torch.device("cpu"))
_POOL_NUMBERS = itertools.count()
# Set by the auto-audit (pytest --parity-audit) to audit every capture; None otherwise.
AUTO_HOOKS = None


def graph_pool_handle():
    """A new graph memory pool (share it between captures as with torch.cuda.graph_pool_handle())."""
    return _RECORDERS.new_pool(f"pool{next(_POOL_NUMBERS)}")


class CUDAGraph:
    """The emulated counterpart of torch.cuda.CUDAGraph."""

    def __init__(self, keep_graph: bool = False):
        self._segment = None
        self._capture = None
        self._pool = None

    def capture_begin(self, pool=None, capture_error_mode: str = "global", **_ignored) -> None:
        if self._capture is not None or self._segment is not None:
            raise RuntimeError("this graph is already captured or capturing; reset() it first")
        self._pool = pool if pool is not None else graph_pool_handle()
        undo, grad = WriteLog(), torch.no_grad()
        undo.__enter__()
        grad.__enter__()
        self._capture = (undo, grad, _RECORDERS.begin(self._pool))
        frame = capture_stack.push(self)
        if AUTO_HOOKS is not None and not frame.internal:
            AUTO_HOOKS.capture_began(self, frame)

    def capture_end(self) -> None:
        frame = capture_stack.frame_of(self)
        if AUTO_HOOKS is not None and frame is not None and not frame.internal:
            AUTO_HOOKS.capture_ending(self, frame)
        undo, grad, recorder = self._capture
        self._segment = _RECORDERS.end(recorder)
        self._close(undo, grad)
        if AUTO_HOOKS is not None and frame is not None and not frame.internal:
            AUTO_HOOKS.capture_ended(self, frame)

    def _abort(self) -> None:
        frame = capture_stack.frame_of(self)
        if AUTO_HOOKS is not None and frame is not None and not frame.internal:
            AUTO_HOOKS.capture_ending(self, frame)
        undo, grad, recorder = self._capture
        _RECORDERS.abort(recorder)
        self._close(undo, grad)

    def _close(self, undo, grad) -> None:
        grad.__exit__(None, None, None)
        undo.__exit__(None, None, None)
        undo.undo()
        self._capture = None
        capture_stack.pop(self)

    def replay(self) -> None:
        if self._segment is None:
            raise RuntimeError("replay() before a capture")
        self._segment.replay()

    def reset(self) -> None:
        self._segment = None

    def pool(self):
        return self._pool


class graph:
    """Context manager capturing into an emulated CUDAGraph (the signature of torch.cuda.graph)."""

    def __init__(self, cuda_graph: CUDAGraph, pool=None, stream=None, capture_error_mode: str = "global",
                 **_ignored):
        self.cuda_graph = cuda_graph
        self.pool = pool

    def __enter__(self) -> None:
        self.cuda_graph.capture_begin(pool=self.pool)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.cuda_graph._abort()
            return
        self.cuda_graph.capture_end()


def is_current_stream_capturing() -> bool:
    """True inside an emulated capture."""
    frame = capture_stack.current_frame()
    return frame is not None and isinstance(frame.graph, CUDAGraph)


def weak_ref_tensors(outputs):
    """Aliases of `outputs` that keep none of their pool memory, as vLLM's weak_ref_tensors does on CUDA.

    As on CUDA, the memory goes back to the pool when the last tensor owning it
    dies (the pool watches those tensors), not before: an output still held
    elsewhere (a piece's output the next piece is about to read) keeps its block.
    """
    return tree_map(lambda t: non_owning(t) if isinstance(t, torch.Tensor) else t, outputs)


def current_stream(device=None):
    """The immediate default stream of the streams model (`parity.graphs.streams`)."""
    return _streams.current_stream(device)


def synchronize(device=None) -> None:
    """Run every queued side-stream copy (`parity.graphs.streams`): a host sync."""
    _streams.synchronize(device)
