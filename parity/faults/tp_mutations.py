"""Tensor-parallel mutations: bugs that need more than one rank (`parity run --tp N --inject ...`).

Each is the one-line mistake of a multi-GPU engine, written where it lives;
`seam.py` names them. They read this process's rank from the graph layer
(`graphs.rank_guard.tp_rank`); at TP=1 they are rank 0 and change nothing.
"""

from __future__ import annotations

import dataclasses
import threading

from parity.faults.mutations import rebind
from parity.graphs.modes import EAGER
from parity.graphs.rank_guard import tp_rank


class SeqLensRefreshedOnRankZero:
    """seq_lens reaches the persistent buffer on rank 0 only: the other ranks build each batch's seq_lens into a
    fresh tensor (right for eager code, which reads the registry's), so their captured buffer goes stale."""

    def write(self, name, values, pad, num_tokens):
        if name != "seq_lens" or tp_rank() == 0:
            return super().write(name, values, pad, num_tokens)
        rebind(self.buffers, name, values + [self.buffers.spec(name).inert_value(num_tokens)] * pad)


class OneRankPadsUp:
    """Rank 1 and above pad every graphed target batch to the next capture size up (their own capture-size
    list is one entry short): their graphs, and their all-reduces, have another shape than rank 0's."""

    def dispatch(self, phase, num_tokens, num_reqs, uniform):
        chosen = super().dispatch(phase, num_tokens, num_reqs, uniform)
        if tp_rank() == 0 or self.owner != "target" or chosen.runtime_mode == EAGER:
            return chosen
        larger = [s for s in self.dispatcher.token_sizes if s > chosen.num_tokens_padded]
        if not larger:
            return chosen
        wider = self.dispatcher.dispatch(phase, larger[0], num_reqs, False)
        return dataclasses.replace(wider, num_tokens=num_tokens, num_reqs=num_reqs)


class OneRankStalls:
    """Rank 1 and above block on the host before their third graphed forward (a lock, a queue, a data loader
    that never answers): their peers wait at the next collective for ever."""

    def execute(self, dispatch, fn, meta):
        if tp_rank() != 0 and dispatch.runtime_mode != EAGER:
            self._graphed = getattr(self, "_graphed", 0) + 1
            if self._graphed == 3:
                threading.Event().wait()
        return super().execute(dispatch, fn, meta)


def _row_parallel_layers(holder) -> list:
    """The row-parallel layers of the owner's model that hold a registered all-reduce buffer, in order."""
    model = getattr(holder, "model", None)
    return [m for m in (model.modules() if model is not None else ()) if getattr(m, "out", None) is not None
            and getattr(m, "comm", None) is not None]


class RegisteredBufferRebound:
    """After the target's graphs are captured, a re-register path registers the first row-parallel layer's
    all-reduce buffer anew and rebinds `out` to the fresh one instead of keeping the buffer it had: eager calls
    stage into the new buffer; a graph captured before stages into the old one, while every rank reads the one
    the table now registers."""

    def capture_phase(self, phase, fn, capture_metadata, max_tokens, restore):
        count = super().capture_phase(phase, fn, capture_metadata, max_tokens, restore)
        layers = _row_parallel_layers(getattr(fn, "__self__", None)) if self.owner == "target" else []
        if count and layers:
            layers[0].out = layers[0].comm.register(layers[0].key)
        return count


class WorkspaceReallocatedBetweenCaptures:
    """The collective's workspace is reallocated after the first target graph is captured (a capture of another
    size asks for it anew): every layer's registered buffer moves to a fresh slot, so the graph captured first
    replays staging into the old workspace while the ranks read the new one."""

    def capture_phase(self, phase, fn, capture_metadata, max_tokens, restore):
        self._layers = _row_parallel_layers(getattr(fn, "__self__", None)) if self.owner == "target" else []
        return super().capture_phase(phase, fn, capture_metadata, max_tokens, restore)

    def _capture(self, captured_for, num_reqs, body):
        graph = super()._capture(captured_for, num_reqs, body)
        if getattr(self, "_layers", None) and not getattr(self, "_reallocated", False):
            self._reallocated = True
            for layer in self._layers:
                layer.out = layer.comm.register(layer.key)
        return graph
