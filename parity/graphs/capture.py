"""Capture one forward as a FULL graph (one segment) or a PIECEWISE graph.

PIECEWISE splits the forward at every attention call: the segment so far is
ended, attention runs eagerly, and the next segment begins. At replay each
attention runs eagerly between segments on the captured q/k/v and reads the
*live* metadata of the forward context, writing into the static output the
next segment reads. Works the same on the cuda and emulated backends.

The metadata travels explicitly: `fn(meta)` at capture, `replay(meta)` after;
a FULL graph ignores the replay's metadata (it reads what it captured), a
PIECEWISE graph hands it to every eager attention call.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from parity.graphs.collector import paused_gc
from parity.models.paged_attention import attention_core, one_forward, split_at_attention


@dataclass
class AttentionCall:
    module: torch.nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scaling: float
    out: torch.Tensor     # static: the next segment reads it
    static: torch.Tensor | None = None   # the tensor `out` was at capture: the address the next segment reads

    def attend(self, meta) -> torch.Tensor:
        """This call's attention on `meta`, as a new tensor (the replay copies it into `out`)."""
        return attention_core(self.module, self.query, self.key, self.value, self.scaling, meta)


class CapturedGraph:
    def __init__(self, runtime_mode: str, segments: list, calls: list[AttentionCall], outputs: tuple):
        self.runtime_mode = runtime_mode
        self.segments = segments
        self.calls = calls
        self.outputs = outputs

    @property
    def read_storages(self) -> set[int]:
        return set().union(*(s.read_storages for s in self.segments))

    @property
    def write_storages(self) -> set[int]:
        """The storages the captured pieces write in place (a PIECEWISE graph's eager attention is not among
        them: it runs live at every replay)."""
        return set().union(*(s.write_storages for s in self.segments))

    def replay(self, meta=None) -> tuple:
        """Replay every piece; PIECEWISE attention runs eagerly on `meta`, the live metadata."""
        # Only a piecewise replay runs attention between its pieces and needs the forward's layout scope.
        with one_forward() if self.calls else contextlib.nullcontext():
            for i, segment in enumerate(self.segments):
                segment.replay()
                if i < len(self.calls):
                    call = self.calls[i]
                    call.out.copy_(attention_core(call.module, call.query, call.key, call.value, call.scaling,
                                                  meta))
        return self.outputs


@torch.no_grad()
@paused_gc()
def capture(backend, pool, fn, piecewise: bool, weak_outputs: bool = True) -> CapturedGraph:
    """Capture `fn()` (which returns a tuple of tensors) on `backend` into `pool`, the cyclic collector paused."""
    segments: list = []
    calls: list[AttentionCall] = []
    state = {"handle": backend.begin(pool)}

    def split(module, query, key, value, scaling, meta):
        segments.append(backend.end(state["handle"]))
        state["handle"] = None
        out = attention_core(module, query, key, value, scaling, meta)
        calls.append(AttentionCall(module, query, key, value, scaling, out, out))
        state["handle"] = backend.begin(pool)
        return out

    try:
        with split_at_attention(split) if piecewise else contextlib.nullcontext():
            outputs = tuple(fn())
    except BaseException:
        if state["handle"] is not None:
            backend.abort(state["handle"])
        raise
    segments.append(backend.end(state["handle"]))
    outputs = backend.finish(pool, outputs, segments, weak_outputs)
    return CapturedGraph("piecewise" if piecewise else "full", segments, calls, outputs)
