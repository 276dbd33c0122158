"""Which callable a bare `with torch.cuda.graph(g): out = f(x)` block captures, found while it runs.

The auto-audit (pytest --parity-audit) sees captures, not callables. While a
block is open, a trace hook records the Python calls made directly from the
block's own frame, with their arguments as bound at the call. When the block
made exactly one such call, that call is the callable to audit: a module
(`model(x)`), a bound method (`self.decode(bs)`) or a function. Blocks that
made several calls (or none) are audited by their cheap checks only and
reported as such; wrap their body in one function to get shadow checks.
"""

from __future__ import annotations

import gc
import inspect
import os
import sys
import sysconfig
import types
from dataclasses import dataclass

import torch

# Frames of these files belong to capture machinery, not to the user's block.
_MACHINERY = (os.path.dirname(__file__), os.path.dirname(torch.cuda.__file__))
_STDLIB = sysconfig.get_paths()["stdlib"]


def _not_callable(filename: str) -> bool:
    """Machinery, or the standard library (weakref finalizers of freed temporaries run from whatever
    frame is current), but not packages installed beside it (an engine in site-packages)."""
    if filename.startswith(_MACHINERY):
        return True
    return filename.startswith(_STDLIB) and "-packages" not in filename


@dataclass
class BlockCall:
    fn: object
    args: tuple
    kwargs: dict


def block_frame(start):
    """The first frame outside the capture machinery, walking out from `start`."""
    frame = start
    while frame is not None and frame.f_code.co_filename.startswith(_MACHINERY):
        frame = frame.f_back
    return frame


class BlockSpy:
    """The Python calls made directly from one frame, and what the last returned (sys.settrace, chained)."""

    def __init__(self, frame):
        self.frame = frame
        self.calls: list[tuple[types.CodeType, dict]] = []
        self.result = None            # what the last direct call returned
        self._previous = None

    def start(self) -> None:
        # NOTE: sys.settrace, not setprofile: the global function runs once per new Python
        # frame (not for every C call), and only the block's direct calls get a local tracer.
        self._previous = sys.gettrace()
        sys.settrace(self._global)

    def stop(self) -> None:
        sys.settrace(self._previous)

    def _global(self, frame, event, arg):
        local = self._previous(frame, event, arg) if self._previous is not None else None
        if frame.f_back is not self.frame or _not_callable(frame.f_code.co_filename):
            return local
        self.calls.append((frame.f_code, dict(frame.f_locals)))
        if local is None:
            frame.f_trace_lines = False
        return self._returned(local)

    def _returned(self, local):
        def trace(frame, event, arg):
            nonlocal local
            if event == "return":
                self.result = arg
            if local is not None:
                local = local(frame, event, arg)
            return trace
        return trace

    def callable(self) -> BlockCall | None:
        """The block's one call, rebuilt as (callable, args, kwargs); None when there is not exactly one."""
        if len(self.calls) != 1:
            return None
        return rebuild(*self.calls[0])


_MODULE_CALLS = {torch.nn.Module._wrapped_call_impl.__code__, torch.nn.Module._call_impl.__code__}


def _arguments(code: types.CodeType, local: dict, skip: int) -> tuple[tuple, dict]:
    names = code.co_varnames
    npos, nkw = code.co_argcount, code.co_kwonlyargcount
    args = [local[n] for n in names[skip:npos]]
    kwargs = {n: local[n] for n in names[npos:npos + nkw]}
    at = npos + nkw
    if code.co_flags & inspect.CO_VARARGS:
        args += list(local[names[at]])
        at += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kwargs.update(local[names[at]])
    return tuple(args), kwargs


def rebuild(code: types.CodeType, local: dict) -> BlockCall | None:
    """A callable and its arguments from a call's code object and its locals at the call."""
    if code in _MODULE_CALLS:
        return BlockCall(local["self"], tuple(local.get("args", ())), dict(local.get("kwargs", {})))
    names = code.co_varnames[:code.co_argcount]
    if names and names[0] in ("self", "cls"):
        method = getattr(local[names[0]], code.co_name, None)
        if getattr(getattr(method, "__func__", None), "__code__", None) is code:
            args, kwargs = _arguments(code, local, 1)
            return BlockCall(method, args, kwargs)
    functions = [f for f in gc.get_referrers(code) if isinstance(f, types.FunctionType) and f.__code__ is code]
    if len(functions) != 1:
        return None
    args, kwargs = _arguments(code, local, 0)
    return BlockCall(functions[0], args, kwargs)


def describe(call: BlockCall) -> str:
    """'Engine.decode(bs=4)': a readable name for an auto-audited graph."""
    fn = call.fn
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    shown = [repr(a) for a in call.args if isinstance(a, (bool, int, float, str))]
    shown += [f"{k}={v!r}" for k, v in call.kwargs.items() if isinstance(v, (bool, int, float, str))]
    return f"{name}({', '.join(shown)})"
