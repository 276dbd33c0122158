"""Capture one forward as a FULL graph (one segment) or a PIECEWISE graph.

PIECEWISE splits the forward at every attention call: the segment so far is
ended, attention runs eagerly, and the next segment begins. At replay each
attention runs eagerly between segments on the captured q/k/v and reads the
*live* metadata of the forward context, writing into the static output the
next segment reads. Works the same on the cuda and emulated backends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.graphs.context import ATTENTION_SPLIT, current_metadata
from parity.models.paged_attention import attention_core


@dataclass
class AttentionCall:
    module: torch.nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scaling: float
    out: torch.Tensor     # static: the next segment reads it


class CapturedGraph:
    def __init__(self, runtime_mode: str, segments: list, calls: list[AttentionCall], outputs: tuple):
        self.runtime_mode = runtime_mode
        self.segments = segments
        self.calls = calls
        self.outputs = outputs

    @property
    def read_storages(self) -> set[int]:
        return set().union(*(s.read_storages for s in self.segments))

    def replay(self) -> tuple:
        for i, segment in enumerate(self.segments):
            segment.replay()
            if i < len(self.calls):
                call = self.calls[i]
                live = current_metadata()
                call.out.copy_(attention_core(call.module, call.query, call.key, call.value, call.scaling, live))
        return self.outputs


@torch.no_grad()
def capture(backend, pool, fn, piecewise: bool, weak_outputs: bool = True) -> CapturedGraph:
    """Capture `fn()` (which returns a tuple of tensors) on `backend` into `pool`."""
    segments: list = []
    calls: list[AttentionCall] = []
    state = {"handle": backend.begin(pool)}

    def split(module, query, key, value, scaling, meta):
        segments.append(backend.end(state["handle"]))
        state["handle"] = None
        out = attention_core(module, query, key, value, scaling, meta)
        calls.append(AttentionCall(module, query, key, value, scaling, out))
        state["handle"] = backend.begin(pool)
        return out

    token = ATTENTION_SPLIT.set(split) if piecewise else None
    try:
        outputs = tuple(fn())
    except BaseException:
        if state["handle"] is not None:
            backend.abort(state["handle"])
        raise
    finally:
        if token is not None:
            ATTENTION_SPLIT.reset(token)
    segments.append(backend.end(state["handle"]))
    outputs = backend.finish(pool, outputs, segments, weak_outputs)
    return CapturedGraph("piecewise" if piecewise else "full", segments, calls, outputs)
