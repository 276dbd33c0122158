"""Streams and events on the CPU: a deterministic model of CUDA's asynchronous copies.

`api(device)` is `torch.cuda` on a CUDA device and this module otherwise, so the
same engine code stages through `G.Stream()`, `G.Event()`, `G.stream(s)`,
`G.current_stream()` and `G.synchronize()` on both.

The model (the CPU runs nothing asynchronously, so the race is modelled, not real):
- the current (default) stream is immediate: what the host issues on it runs at once,
  so the device is always caught up with the host on that stream;
- on a side stream (`with stream(s):`), `Tensor.copy_` is queued, not run: the copy
  reads its source and writes its destination only when something forces it, that is
  when an event recorded after it is waited on (by the default stream's `wait_event`,
  by `Event.synchronize()`) or the stream or the whole device is synchronized. Every
  other op issued under a side stream runs at once;
- so a copy lands as late as the program lets it: a host that rewrites a copy's source
  (a pinned staging buffer) before anything waited on the copy's event, or a forward
  that reads the destination without waiting, sees the race deterministically, where
  on CUDA it would show only under some timings.

`SYNCS` counts the host syncs (`Event.synchronize`, `Stream.synchronize`, `synchronize`).
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

aten = torch.ops.aten
_LIVE: "weakref.WeakSet[Stream]" = weakref.WeakSet()
_STATE = threading.local()


class _Counter:
    def __init__(self):
        self.count = 0


SYNCS = _Counter()


class Stream:
    """A queue of copies that run when forced; `default=True`: the immediate stream of the host."""

    def __init__(self, device=None, priority: int = 0, default: bool = False):
        self.default = default
        self._queue: list = []       # (ticket, op): op() runs the copy or forces a waited event
        self.issued = 0              # tickets handed out
        self.done = 0                # tickets run
        _LIVE.add(self)

    def _submit(self, op) -> None:
        self.issued += 1
        if self.default:
            op()
            self.done = self.issued
        else:
            self._queue.append((self.issued, op))

    def _run_until(self, ticket: int) -> None:
        while self._queue and self._queue[0][0] <= ticket:
            number, op = self._queue.pop(0)
            op()
            self.done = number

    def pending(self) -> list:
        """The copies queued and not yet run: (destination, source) pairs."""
        return [getattr(op, "copy", None) for _, op in self._queue if getattr(op, "copy", None) is not None]

    def wait_event(self, event: "Event") -> None:
        """Work issued on this stream from now on runs after `event`'s work."""
        self._submit(event._force)

    def wait_stream(self, other: "Stream") -> None:
        event = Event()
        event.record(other)
        self.wait_event(event)

    def synchronize(self) -> None:
        SYNCS.count += 1
        self._run_until(self.issued)

    def query(self) -> bool:
        return not self._queue


class Event:
    """A mark in a stream: complete once the stream's work issued before it has run."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self._stream: Stream | None = None
        self._ticket = 0

    def record(self, stream: Stream | None = None) -> None:
        self._stream = stream or current_stream()
        self._ticket = self._stream.issued

    def _force(self) -> None:
        if self._stream is not None:
            self._stream._run_until(self._ticket)

    def query(self) -> bool:
        return self._stream is None or self._stream.done >= self._ticket

    def wait(self, stream: Stream | None = None) -> None:
        (stream or current_stream()).wait_event(self)

    def synchronize(self) -> None:
        SYNCS.count += 1
        self._force()


class _CopyOp:
    def __init__(self, dst: torch.Tensor, src: torch.Tensor):
        self.copy = (dst, src)

    def __call__(self) -> None:
        dst, src = self.copy
        with _disable_current_modes():     # forced inside a side stream's block: run it, do not queue it again
            dst.copy_(src)


class _Deferral(TorchDispatchMode):
    """Under a side stream: `copy_` is queued on the stream (dst returned at once), every other op runs."""

    def __init__(self, stream: Stream):
        super().__init__()
        self.stream = stream

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            self.stream._submit(_CopyOp(dst, src))
            return dst
        return func(*args, **kwargs)


def _default() -> Stream:
    if not hasattr(_STATE, "default"):
        _STATE.default = Stream(default=True)
        _STATE.current = _STATE.default
    return _STATE.default


def current_stream(device=None) -> Stream:
    _default()
    return _STATE.current


def default_stream(device=None) -> Stream:
    return _default()


@contextlib.contextmanager
def stream(s: Stream | None):
    """Issue work on `s` (torch.cuda.stream's counterpart); copies on a side stream are queued."""
    if s is None:
        yield
        return
    previous = current_stream()
    _STATE.current = s
    mode = None if s.default else _Deferral(s)
    try:
        if mode is not None:
            mode.__enter__()
        yield
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)
        _STATE.current = previous


def synchronize(device=None) -> None:
    """Run every queued copy of every stream (a host sync)."""
    SYNCS.count += 1
    for s in list(_LIVE):
        s._run_until(s.issued)


def pending_destinations() -> set[int]:
    """The storages that queued copies will still write (read them on the host now and it is a race)."""
    return {dst.untyped_storage().data_ptr() for s in list(_LIVE) for dst, _ in s.pending()}


def api(device: torch.device):
    """The stream API for `device`: torch.cuda on a CUDA device, this module's model otherwise."""
    import sys
    return torch.cuda if torch.device(device).type == "cuda" else sys.modules[__name__]


def pinned(device: torch.device) -> bool:
    """Whether host staging buffers can be page-locked (only with a CUDA device)."""
    return torch.device(device).type == "cuda"
