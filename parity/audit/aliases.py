"""Aliases that do not own memory: how graph runners hold their outputs weakly."""

from __future__ import annotations

import torch


class _Raw:
    """A __cuda_array_interface__ over raw device memory: torch.as_tensor then owns nothing."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 2, "strides": None}


def non_owning(t: torch.Tensor) -> torch.Tensor:
    """An alias of `t` that does not keep its memory allocated (what vLLM's weak_ref_tensors gives)."""
    if t.is_cuda and not t.numel():
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)      # zero bytes: nothing to keep
    if t.is_cuda:
        # NOTE: over the bytes the view can reach, strided views included (vLLM's weak_ref_tensor keeps strides).
        extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1
        raw = torch.as_tensor(_Raw(t.data_ptr(), extent * t.element_size()), device=t.device)
        return raw.view(t.dtype).as_strided(t.shape, t.stride())
    # NOTE: emulated pools free a block when the last tensor *object* they track dies; a
    # set_() alias is a new object they do not track, so it keeps no block busy.
    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    return alias.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
