"""The CUDA kernels one call launches, by name (for the GPU tests that hold an op to its kernel count)."""

from __future__ import annotations

import torch


def kernels(call) -> list[str]:
    """The names of the device-side events of `call()`, run once before to leave first-call work out."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
