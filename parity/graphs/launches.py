"""Kernels launched past the dispatcher (Triton's JIT kernels): seen by the RegionAware modes as opaque regions.

A `@triton.jit` kernel called from Python (`kernel[grid](...)`, as nano-vllm's
KV store and many of vLLM's helpers are) never reaches a dispatch mode: what it
reads and writes is invisible to the audit's tracers, the emulated backend
would not record it, and an eager run's undo log would not undo it. While a
`RegionAware` mode is on the stack and Triton is loaded, `JITFunction.run` is
wrapped: each launch is told to the modes as a `Launch`, a region whose every
tensor argument is read and may be written (a pointer says nothing of which),
and the emulated backend records it as one op that launches again on replay
(a CUDA graph replays a kernel on the addresses it was given, as this does).
Launches inside a compiled region are the region's own (its dry twin's).
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from parity.graphs.compiled import HOOKS, STATE, Region, RegionAware

_PATCHED: dict = {}      # the JITFunction class -> its own run, while wrapped


class Launch(Region):
    """One launch of a kernel the dispatcher never sees."""

    opaque = True

    def __init__(self, kernel, run, args: tuple, kwargs: dict):
        super().__init__(getattr(kernel, "fn", kernel), None, args, kwargs)
        self.kernel, self._run = kernel, run
        self.reads = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.numel()]

    @property
    def may_write(self) -> list[torch.Tensor]:
        return self.reads

    def replay(self, *args, **kwargs):
        """Launch the kernel again (the emulated backend's replay of this op)."""
        return self._run(self.kernel, *args, **kwargs)


def patch() -> None:
    """Wrap Triton's launches, where Triton is loaded (nothing else can launch one)."""
    jit = sys.modules.get("triton.runtime.jit")
    cls = getattr(jit, "JITFunction", None)
    if cls is None or cls in _PATCHED:
        return
    run = cls.run
    _PATCHED[cls] = run

    def launched(kernel, *args, **kwargs):
        modes = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, RegionAware)]
        if not modes or STATE["open"] or STATE["dry"] or kwargs.get("warmup"):
            return run(kernel, *args, **kwargs)
        launch = Launch(kernel, run, args, kwargs)
        with _disable_current_modes():
            for mode in modes:
                mode.region_enter(launch)
        result = run(kernel, *args, **kwargs)
        with _disable_current_modes():
            for mode in reversed(modes):
                mode.region_exit(launch, result)
        return result
    cls.run = launched


def unpatch() -> None:
    for cls, run in _PATCHED.items():
        cls.run = run
    _PATCHED.clear()


HOOKS.append((patch, unpatch))
