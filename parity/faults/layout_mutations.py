"""Faults of layout: the same buffer, at the same address, handed to a forward at another stride than the graph
captured (stride drift, vLLM #50046 / #51318: a capture-time input laid out contiguously, the live one strided by
its buffer's capacity)."""

from __future__ import annotations

from parity.faults.peek import kept


class BlockTableColumnMajor:
    """The live batches lay the block table out column-major over its buffer (pitch: the buffer's row capacity,
    the layout a paged-attention kernel prefers), while the capture-time dummy batch keeps the row-major view.
    Eager code writes and reads through the live view and stays right; a FULL graph reads the captured view:
    the same storage at the same address and shape, another stride."""

    def build(self, rows, *args, **kwargs):
        with kept(self, "_live_layout", True):
            return super().build(rows, *args, **kwargs)

    def make_view(self, num_tokens_padded, num_reqs_padded, *args):
        meta = super().make_view(num_tokens_padded, num_reqs_padded, *args)
        if self.__dict__.get("_live_layout"):
            buffer = self.buffers["block_table"]
            capacity, width = buffer.shape
            meta.block_table = buffer.view(-1).view(width, capacity).t()[:num_reqs_padded]
            self._live_table = meta.block_table
        return meta

    def store_block_table(self, table):
        if not self.__dict__.get("_live_layout"):
            return super().store_block_table(table)
        self._live_table[: table.shape[0]].copy_(table)
