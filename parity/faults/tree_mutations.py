"""Faults of tree drafts (docs/tree.md): mixins over one step of the engine, as in `mutations.py`."""

from __future__ import annotations

from parity.faults.mutations import rebind


class TreeMaskRebuilt:
    """The builder writes each batch's tree mask (`tree_bits`) into a fresh tensor instead of copying into the
    buffer: eager and piecewise attention read the fresh one through the view, a FULL graph keeps the mask it
    was captured with (all padding: every node sees no other node)."""

    def write(self, name, values, pad, num_tokens):
        if name != "tree_bits":
            return super().write(name, values, pad, num_tokens)
        rebind(self.buffers, name, values + [self.buffers.spec(name).inert_value(num_tokens)] * pad)
