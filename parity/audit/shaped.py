"""The shadow run at the graph's shape: what a replay reads, seen by the eager run that checks it.

A replay runs at the batch size the graph was captured at. The engine's
per-step objects may hold only the real rows: nano-vllm's global context holds
a `slot_mapping` of 3 rows, which the engine copies into the first 3 rows of
the 4-row buffer the graph of 4 reads. Run eagerly on the captured (padded)
arguments and that live context, the callable pairs 4 rows with 3.

So for the shadow run and the experiments of a replay, every role whose live
tensor is smaller than the one the capture read (same dtype and number of
dimensions, no dimension larger) is given, on the live objects, a tensor of the
captured shape: the live values in its leading corner (real rows first, as
every padded batch is laid out), everything else as the replay reads it (the
captured tensor's bytes before the replay: the padding the engine left in the
graph's buffer). Declared and inferred roles alike, on storage the graph only
reads; the live objects get their own tensors back afterwards. A role whose
live tensor does not fit, whose storage the graph writes, or whose path cannot
be assigned (a tuple, a frozen dataclass), is left as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from parity.audit.cheap import Rebind
from parity.graphs.roles import assign


def graph_shaped(captured: torch.Tensor, live: torch.Tensor) -> torch.Tensor | None:
    """A tensor of `captured`'s shape: `live` in its leading corner, `captured`'s values elsewhere; None when
    `live` is not a smaller tensor of the same dtype and rank."""
    if live.dtype != captured.dtype or live.dim() != captured.dim() or live.device != captured.device:
        return None
    if tuple(live.shape) == tuple(captured.shape) or any(a > b for a, b in zip(live.shape, captured.shape)):
        return None
    shaped = captured.detach().clone()
    shaped[tuple(slice(0, n) for n in live.shape)] = live
    return shaped


@contextlib.contextmanager
def at_graph_shape(found: list[Rebind], roots: dict):
    """For the block, the live objects hold graph-shaped stand-ins of the smaller tensors that `found`'s roles
    reach; yields `found` with those rebinds' `live` replaced by the stand-in (`real`: the engine's tensor)."""
    made: dict[tuple, torch.Tensor] = {}
    undo, shaped = [], []
    try:
        for rebind in found:
            live = rebind.live_tensor
            stand_in = None
            # NOTE: only what the graph reads: a stand-in the eager run wrote would be compared with nothing.
            if live is not None and rebind.real is None and not rebind.role.written:
                key = (id(live), rebind.role.address, rebind.role.shape, rebind.role.tensor.stride())
                if key not in made:
                    made[key] = graph_shaped(rebind.role.tensor, live)
                stand_in = made[key]
            if stand_in is None or not assign(rebind.role.path, roots, stand_in):
                shaped.append(rebind)
                continue
            undo.append((rebind.role.path, live))
            shaped.append(dataclasses.replace(rebind, live=stand_in, real=live))
        yield shaped
    finally:
        for path, live in reversed(undo):
            assign(path, roots, live)
