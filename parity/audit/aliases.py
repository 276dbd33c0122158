"""Aliases that do not own memory: how graph runners hold their outputs weakly."""

from __future__ import annotations

import torch

from parity.graphs.cuda import non_owning as cuda_non_owning


def non_owning(t: torch.Tensor) -> torch.Tensor:
    """An alias of `t` that does not keep its memory allocated (what vLLM's weak_ref_tensors gives)."""
    if t.is_cuda and t.is_contiguous():
        return cuda_non_owning(t)
    # NOTE: emulated pools free a block when the last tensor *object* they track dies; a
    # set_() alias is a new object they do not track, so it keeps no block busy.
    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    return alias.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
