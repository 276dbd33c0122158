"""torch.compile'd regions under dispatch modes: run them compiled, learn what they touch from a dry eager twin.

Dynamo runs a compiled frame as plain Python whenever a TorchDispatchMode on
the stack does not ignore compile internals, so a mode that traces a capture
would put eager kernels in the graph where the unobserved program has the
compiled ones. A mode that subclasses `RegionAware` ignores compile internals
(compiled code runs compiled under it) and is told, at every outermost call of
a `torch.compile`d callable while it is on the stack, what that *region* is:
`region_enter(region)` before the compiled code runs, `region_exit(region,
result)` after. Inside, the compiled artifact's own kernels (inductor's
Triton or C++) never reach a dispatch mode, so `region.reads` and
`region.writes` (the tensors from outside the region it reads and writes in
place) are learned from a *dry twin*: the region's original Python run once
more, eagerly, under a tracer of its own, with every mode paused and leaving
no trace (its writes undone, the generators put back; inside a CUDA
capture it is captured into a throwaway graph on a side stream, which
executes nothing). What runs for the program is the compiled call alone.

The calls are found with `sys.settrace` (chained to any tracer already set) on
the one code object every `torch.compile` wrapper shares; where torch has no
such code object the modes do not ignore compile internals and compiled code
runs eagerly under them, as before.
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten


def _wrapper_code():
    """The code of every torch.compile wrapper; None until dynamo is loaded (no compiled callable exists then)."""
    global _WRAPPER
    module = sys.modules.get("torch._dynamo.eval_frame")
    if _WRAPPER is None and module is not None:
        found = [c for c in module._TorchDynamoContext.__call__.__code__.co_consts
                 if getattr(c, "co_name", None) == "compile_wrapper"]
        _WRAPPER = found[0] if len(found) == 1 else False
    return _WRAPPER or None


_WRAPPER = None
# Saved at import, before an auto-audit patches it: the twin's throwaway capture must never be audited.
_CUDA_GRAPH = getattr(torch.cuda, "CUDAGraph", None)
STATE = {"modes": 0, "previous": None, "traced": False, "open": [], "dry": False}
# (enter, leave): called as the first RegionAware mode enters and after the last one left (launches.py's).
HOOKS: list[tuple] = []


def available() -> bool:
    """Whether compiled calls can be told apart here (else compiled code runs eagerly under the modes).
    Without dynamo loaded there is nothing to tell apart, and no tracer is installed."""
    return _wrapper_code() is not None


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _written(func, args, kwargs) -> list[torch.Tensor]:
    found = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            found += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return found


class _DryTrace(TorchDispatchMode):
    """The region's eager twin: tensors from outside it that it reads and writes; saves what it writes."""

    def __init__(self, undo: bool):
        super().__init__()
        self.reads: list[torch.Tensor] = []
        self.writes: list[torch.Tensor] = []
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._undo = undo
        self._produced: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.numel()]
        self.reads += [t for t in flat if _storage(t) not in self._produced]
        for t in _written(func, args, kwargs):
            if t.numel() and _storage(t) not in self._produced:
                self.writes.append(t)
                if self._undo and _storage(t) not in self.saved:
                    whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
                    self.saved[_storage(t)] = (whole, whole.clone())
        out = func(*args, **kwargs)
        inputs = {_storage(t) for t in flat}
        self._produced.update(_storage(t) for t in tree_flatten(out)[0]
                              if isinstance(t, torch.Tensor) and t.numel() and _storage(t) not in inputs)
        return out


class Region:
    """One outermost call of a compiled callable: its original Python, inputs, and what it reads and writes."""

    opaque = False      # a kernel launch (launches.py): no dry twin, nothing known of its writes

    def __init__(self, fn, context, args: tuple, kwargs: dict):
        self.fn, self.context, self.args, self.kwargs = fn, context, args, kwargs
        self.reads: list[torch.Tensor] = []
        self.writes: list[torch.Tensor] = []

    @property
    def may_write(self) -> list[torch.Tensor]:
        """Everything the region may write (a compiled region: what its twin wrote)."""
        return self.writes

    def compiled(self):
        """The compiled callable again (dynamo's cache is keyed by code, so this runs the same artifact)."""
        return self.context(self.fn)

    def dry_run(self) -> None:
        """Learn `reads` and `writes` from the eager twin, leaving no trace (see the module docstring)."""
        # Only a process that initialised CUDA can be capturing or have used its RNG; asking initialises it.
        capturing = torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
        trace = _DryTrace(undo=not capturing)
        STATE["dry"] = True
        with _disable_current_modes():          # neither the program's modes nor the audit's see the twin
            rng = torch.get_rng_state()
            cuda_rng = torch.cuda.get_rng_state() if torch.cuda.is_initialized() and not capturing else None
            try:
                if capturing:
                    _captured_away(trace, self.fn, self.args, self.kwargs)
                else:
                    with trace:
                        self.fn(*self.args, **self.kwargs)
            finally:
                STATE["dry"] = False
                for whole, saved in trace.saved.values():
                    whole.copy_(saved)
                torch.set_rng_state(rng)
                if cuda_rng is not None:
                    torch.cuda.set_rng_state(cuda_rng)
        self.reads, self.writes = trace.reads, trace.writes


def _captured_away(trace: _DryTrace, fn, args, kwargs) -> None:
    """Inside a CUDA capture: the twin is captured into a graph of its own on a side stream, never instantiated
    (instantiating a graph while the program's capture runs is an illegal call in its global and thread-local
    modes: measured on an H100, torch 2.11) and never replayed."""
    graph = _CUDA_GRAPH(keep_graph=True)
    with torch.cuda.stream(_idle_stream()):
        graph.capture_begin(capture_error_mode="relaxed")
        try:
            with trace:
                fn(*args, **kwargs)
        finally:
            graph.capture_end()
    graph.reset()


def _idle_stream():
    """A side stream that is not capturing. `torch.cuda.Stream()` hands out a pool's streams round-robin, so a
    program with many compiled calls in one capture is soon handed the very stream its capture runs on."""
    for _ in range(64):
        stream = torch.cuda.Stream()
        if not _capturing(stream):
            return stream
    raise RuntimeError("every pooled CUDA stream is capturing: no stream left for a compiled call's dry twin")


def _capturing(stream) -> bool:
    with torch.cuda.stream(stream):
        return torch.cuda.is_current_stream_capturing()


class RegionAware(TorchDispatchMode):
    """A dispatch mode under which compiled code runs compiled; it hears of each compiled region instead."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return available()

    def region_enter(self, region: Region) -> None:
        """Before the compiled call (or kernel launch, `region.opaque`) runs (its reads and writes known)."""

    def region_exit(self, region: Region, result) -> None:
        """After it returned `result` (None when it raised)."""

    def __enter__(self):
        _install()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _uninstall()


def in_region() -> bool:
    """True while a compiled region the modes were told of runs (its dispatched ops are its internals)."""
    return bool(STATE["open"])


def _install() -> None:
    STATE["modes"] += 1
    if STATE["modes"] == 1:
        for enter, _ in HOOKS:
            enter()
        STATE["traced"] = available()
        if STATE["traced"]:
            STATE["previous"] = sys.gettrace()
            sys.settrace(_global)


def _uninstall() -> None:
    STATE["modes"] -= 1
    if STATE["modes"] == 0:
        for _, leave in HOOKS:
            leave()
        if STATE["traced"]:
            sys.settrace(STATE["previous"])
        STATE["previous"], STATE["traced"] = None, False


def _global(frame, event, arg):
    previous = STATE["previous"]
    local = previous(frame, event, arg) if previous is not None else None
    if frame.f_code is not _WRAPPER or STATE["open"] or STATE["dry"]:
        return local
    stack = _get_current_dispatch_mode_stack()
    if any(not m.is_infra_mode() and not m.ignore_compile_internals() for m in stack):
        return local                        # dynamo runs it eagerly: the modes see its ops themselves
    modes = [m for m in stack if isinstance(m, RegionAware)]
    if not modes:
        return local
    names = frame.f_locals
    if not all(k in names for k in ("fn", "self", "args", "kwargs")):
        return local
    region = Region(names["fn"], names["self"], names["args"], names["kwargs"])
    region.dry_run()
    with _disable_current_modes():          # the modes' own bookkeeping is not the program's
        for mode in modes:
            mode.region_enter(region)
    STATE["open"].append(frame)
    frame.f_trace_lines = False
    return _returned(local, frame, region, modes)


def _returned(local, frame, region: Region, modes: list):
    def trace(f, event, arg):
        if local is not None:
            local(f, event, arg)
        if event == "return" and f is frame:
            STATE["open"].remove(frame)
            with _disable_current_modes():
                for mode in reversed(modes):
                    mode.region_exit(region, arg)
        return trace
    return trace
