"""The torch state a capture ran under, put back for the eager code that must compute what the graph computes.

A replay runs the kernels its capture chose, whatever state the program is in
when it replays. Eager code does not: the default dtype and device reach every
factory call, and they and inference mode are part of every torch.compile'd
region's guards. nano-vllm, for one, captures under
`set_default_dtype(float16)` and `set_default_device("cuda")` and serves under
float32 and the CPU: an eager run at serving time calls its compiled layers
under other guards, so dynamo compiles them again (other kernels), or, at its
recompile limit, runs them eagerly (other kernels, other bits) - and the check
of a correct graph finds a difference that is not there.

So the eager runs that check a replay, their experiments, and the emulated
backend's replay of a compiled region run under the capture's `Ambient`: its
default dtype, its default device (as `torch.set_default_device` set it), and
inference mode where the capture had it (never turned off: serving code may
update inference tensors in place, which only inference mode allows).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


def _default_device() -> torch.device | None:
    """The device `torch.set_default_device` set, or None where none is set."""
    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return None if context is None else torch.device(context.device)


@dataclass(frozen=True)
class Ambient:
    dtype: torch.dtype
    device: torch.device | None
    inference: bool

    @classmethod
    def now(cls) -> "Ambient":
        return cls(torch.get_default_dtype(), _default_device(), torch.is_inference_mode_enabled())

    @contextlib.contextmanager
    def defaults(self):
        """The block runs with this default dtype and device; the program's come back after it."""
        dtype, device = torch.get_default_dtype(), _default_device()
        try:
            if dtype != self.dtype:
                torch.set_default_dtype(self.dtype)
            if device != self.device:
                torch.set_default_device(self.device)
            yield
        finally:
            if torch.get_default_dtype() != dtype:
                torch.set_default_dtype(dtype)
            if _default_device() != device:
                torch.set_default_device(device)

    @contextlib.contextmanager
    def entered(self):
        """`defaults()`, and inference mode where the capture ran under it."""
        with self.defaults(), (torch.inference_mode() if self.inference else contextlib.nullcontext()):
            yield
