"""Which graph is being captured right now, so a GraphAudit called inside a capture binds to it.

`torch.cuda.graph` does not say which graph it is capturing, so whoever opens a
capture pushes a frame here: the emulated stand-in always does, the pytest
plugin's patched `torch.cuda.CUDAGraph` does, and so does `audited_graph`
around a plain `torch.cuda.graph` block. Captures the audit makes for its own
experiments are pushed as `internal`: nothing is audited inside them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from parity.graphs.collector import paused_gc  # noqa: F401 (the audit's captures pause it too)


@dataclass
class CaptureFrame:
    graph: object
    internal: bool = False
    audits: list = field(default_factory=list)     # GraphAudits that captured inside this frame
    hooks: object = None                           # the auto-audit's block hooks, when the plugin is on


_STACK: list[CaptureFrame] = []


def current_frame() -> CaptureFrame | None:
    """The innermost open capture, or None."""
    return _STACK[-1] if _STACK else None


def frame_of(graph) -> CaptureFrame | None:
    """The open frame capturing `graph`, or None."""
    for frame in reversed(_STACK):
        if frame.graph is graph:
            return frame
    return None


def push(graph, internal: bool = False) -> CaptureFrame:
    """Open a frame for `graph` (or return the one already open for it)."""
    frame = frame_of(graph)
    if frame is None:
        frame = CaptureFrame(graph, internal or any(f.internal for f in _STACK))
        _STACK.append(frame)
    return frame


def pop(graph) -> CaptureFrame | None:
    """Close the frame of `graph`; returns it (None when none was open)."""
    frame = frame_of(graph)
    if frame is not None:
        _STACK.remove(frame)
    return frame


@contextlib.contextmanager
def capturing(graph, internal: bool = False):
    """Mark `graph` as being captured for the duration of the block."""
    opened = frame_of(graph) is None
    frame = push(graph, internal)
    try:
        yield frame
    finally:
        if opened:
            pop(graph)


def internal(graph):
    """A capture the audit makes for itself: never audited."""
    return capturing(graph, internal=True)


def cuda_capturing() -> bool:
    """True inside a CUDA stream capture. A process that has not initialised CUDA captures nothing, and asking
    would initialise it: in a child forked from a CUDA process that fails ("initialization error")."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
