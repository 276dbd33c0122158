"""Which callable a bare `with torch.cuda.graph(g): out = f(x)` block captures, found while it runs.

The auto-audit (pytest --parity-audit) sees captures, not callables. While a
block is open, a trace hook records the Python calls made directly from the
block's own frame, with their arguments as bound at the call. When the block
made exactly one such call, that call is the callable to audit: a module
(`model(x)`), a bound method (`self.decode(bs)`) or a function. Calls into
torch itself (a `torch.set_default_device` hook) are not the user's. When the
block made several calls, the one that launched kernels on memory from before
the capture is the callable: a helper that only wraps the outputs (vLLM's
`weak_ref_tensors`) or makes views launches none. Otherwise `callable()`
returns None and `why()` says what the block did, for a loud error.
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

from torch.utils._pytree import tree_flatten

from parity.graphs.compiled import RegionAware, in_region
from parity.graphs.host_state import values_of

# Frames of these files belong to capture machinery (the audit's, the emulated graphs' op checks, torch's),
# not to the user's block.
_MACHINERY = (os.path.dirname(__file__) + os.sep, os.path.join(os.path.dirname(os.path.dirname(__file__)), "graphs")
              + os.sep, os.path.dirname(torch.__file__) + os.sep)
# Ops that launch no kernel: allocation and aliasing (views are told by their schema).
NO_KERNEL = {"aten::empty", "aten::empty_strided", "aten::set_", "aten::detach", "aten::alias", "aten::lift_fresh",
              "aten::_local_scalar_dense"}
_STDLIB = sysconfig.get_paths()["stdlib"]


def not_callable(filename: str) -> bool:
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


def _launches(func, args, kwargs, tracer) -> bool:
    """The op runs a kernel on memory from before the capture (not a view, not an allocation)."""
    if func.is_view or func._schema.name in NO_KERNEL:
        return False
    return any(isinstance(t, torch.Tensor) and tracer.is_external(t) for t in tree_flatten((args, kwargs))[0])


class _CallOps(RegionAware):
    """Marks the block's current direct call as launching when one of its ops does (see `_launches`)."""

    def __init__(self, spy: "BlockSpy", tracer):
        super().__init__()
        self.spy, self.tracer = spy, tracer

    def region_enter(self, region) -> None:
        """A compiled region launches kernels (its own, unseen) when it reads memory from before the capture."""
        if self.spy.current is not None and any(self.tracer.is_external(t) for t in region.reads):
            self.spy.launching.add(self.spy.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if in_region():
            return func(*args, **kwargs)
        current = self.spy.current
        if current is not None and current not in self.spy.launching and _launches(func, args, kwargs, self.tracer):
            self.spy.launching.add(current)
        return func(*args, **kwargs)


class BlockSpy:
    """The Python calls made directly from one frame, what each returned, which launched kernels."""

    def __init__(self, frame, tracer):
        self.frame = frame
        self.calls: list[tuple[types.CodeType, dict]] = []
        self.results: dict[int, object] = {}    # call index -> what it returned
        self.launching: set[int] = set()         # calls that launched kernels on memory from before the capture
        self.entry_host: list[dict] = []         # per call: the host values its roots held as it began
        self.current: int | None = None
        self._previous = None
        self._ops = _CallOps(self, tracer)

    def start(self) -> None:
        # NOTE: sys.settrace, not setprofile: the global function runs once per new Python
        # frame (not for every C call), and only the block's direct calls get a local tracer.
        self._previous = sys.gettrace()
        sys.settrace(self._global)
        self._ops.__enter__()

    def stop(self) -> None:
        self._ops.__exit__(None, None, None)
        sys.settrace(self._previous)

    def _global(self, frame, event, arg):
        local = self._previous(frame, event, arg) if self._previous is not None else None
        if frame.f_back is not self.frame or (frame.f_code not in _MODULE_CALLS
                                                and not_callable(frame.f_code.co_filename)):
            return local
        self.current = len(self.calls)
        self.calls.append((frame.f_code, dict(frame.f_locals)))
        self.entry_host.append(_host_at_entry(*self.calls[-1]))
        if local is None:
            frame.f_trace_lines = False
        return self._returned(local, self.current)

    def _returned(self, local, index: int):
        def trace(frame, event, arg):
            nonlocal local
            if event == "return":
                self.results[index] = arg
                self.current = None
            if local is not None:
                local = local(frame, event, arg)
            return trace
        return trace

    def chosen(self) -> int | None:
        """Index of the call to audit: the only one, or the only one that launched kernels."""
        if len(self.calls) == 1:
            return 0
        return next(iter(self.launching)) if len(self.launching) == 1 else None

    def callable(self) -> BlockCall | None:
        """The block's callable, rebuilt as (callable, args, kwargs); None when there is no single one."""
        index = self.chosen()
        return None if index is None else rebuild(*self.calls[index], self.frame)

    @property
    def host_before(self) -> dict:
        """The host values the chosen call's roots held as it began (what its graph baked)."""
        index = self.chosen()
        return {} if index is None else self.entry_host[index]

    @property
    def result(self):
        """What the chosen call returned."""
        index = self.chosen()
        return None if index is None else self.results.get(index)

    def release(self) -> None:
        """Drop the block's frame, the calls' arguments and what they returned (strong references all)."""
        self.frame = None
        self.calls = [(code, {}) for code, _ in self.calls]
        self.results.clear()

    def why(self) -> str:
        """What the block did, when it has no single callable."""
        names = [code.co_qualname for code, _ in self.calls]
        if not names:
            return "calls no Python function (the captured code is written inline)"
        if not self.launching:
            return f"makes {len(names)} calls ({', '.join(names)}) and none launches a kernel on memory from " \
                   "before the capture"
        launching = [names[i] for i in sorted(self.launching)]
        return f"makes {len(names)} calls ({', '.join(names)}), of which {', '.join(launching)} launch kernels"


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


def _host_at_entry(code: types.CodeType, local: dict) -> dict:
    """The host values a method's object holds as the call begins (keyed as the record's, from root `self`)."""
    names = code.co_varnames[:code.co_argcount]
    return values_of({"self": local[names[0]]}) if names and names[0] == "self" and "self" in local else {}


def rebuild(code: types.CodeType, local: dict, caller=None) -> BlockCall | None:
    """A callable and its arguments from a call's code object and its locals at the call (`caller`: the frame that
    made the call, whose names may hold the function)."""
    if code in _MODULE_CALLS:
        return BlockCall(local["self"], tuple(local.get("args", ())), dict(local.get("kwargs", {})))
    names = code.co_varnames[:code.co_argcount]
    if names and names[0] in ("self", "cls"):
        method = getattr(local[names[0]], code.co_name, None)
        if getattr(getattr(method, "__func__", None), "__code__", None) is code:
            args, kwargs = _arguments(code, local, 1)
            return BlockCall(method, args, kwargs)
    functions = _named_by(caller, code) or [f for f in gc.get_referrers(code)
                                            if isinstance(f, types.FunctionType) and f.__code__ is code]
    if len(functions) != 1:
        return None
    args, kwargs = _arguments(code, local, 0)
    return BlockCall(functions[0], args, kwargs)


def _named_by(frame, code: types.CodeType) -> list:
    """The functions of `code` that `frame`'s module holds by name: found without the collector, whose
    `get_referrers` misses every object `gc.freeze()` set aside (vLLM freezes the collector while it captures its
    graphs). NOTE: the frame's locals are not read: `f_locals` of a traced frame is written back into it when the
    trace function returns (before Python 3.13), which would revive a local the block has deleted."""
    if frame is None:
        return []
    return [f for f in frame.f_globals.values() if isinstance(f, types.FunctionType) and f.__code__ is code]


def describe(call: BlockCall) -> str:
    """'Engine.decode(bs=4)': a readable name for an auto-audited graph."""
    fn = call.fn
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    shown = [repr(a) for a in call.args if isinstance(a, (bool, int, float, str))]
    shown += [f"{k}={v!r}" for k, v in call.kwargs.items() if isinstance(v, (bool, int, float, str))]
    return f"{name}({', '.join(shown)})"
