"""Persistent input buffers: one owner for every tensor a forward reads.

Each tensor is allocated once at its maximum size and registered under a name,
with how it is indexed (per token, per request row, per row + 1) and the value
that makes a padded entry inert. Per-step code only copy_()s into slices, so a
graph captured once keeps reading the right address. The registry is also what
the capture-manifest audit and the diagnosis read: the index kind tells real
entries from padding, the pad value tells what padding must hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine.kv_cache import PAD_SLOT

TOKEN, ROW, ROW_PLUS_ONE = "token", "row", "row+1"
# The pad value of query_start_loc: padded rows start (and end) at the number of real tokens.
NUM_TOKENS = "num_tokens"
# What padded entries of a buffer may hold when a forward runs:
INERT = "inert"   # exactly the pad value: the padding contract (PAD slots, zero seq_lens, clamped starts)
FREE = "free"     # anything at all: inputs of padded tokens and rows that no real output may depend on


@dataclass(frozen=True)
class BufferSpec:
    """How a buffer's entries map to a batch, and what a padded entry must hold."""

    index: str | None = None          # TOKEN, ROW, ROW_PLUS_ONE, or None (not batch-indexed)
    pad: int | str | None = None      # what the builder writes into padded entries (NUM_TOKENS: the real count)
    padding: str | None = None        # INERT, FREE, or None (outputs, and buffers not indexed by the batch)

    @property
    def inert(self) -> bool:
        return self.padding == INERT

    def inert_value(self, num_tokens: int) -> int | None:
        return num_tokens if self.pad == NUM_TOKENS else self.pad

    def used(self, num_tokens: int, num_reqs: int) -> slice:
        """The entries a batch of `num_tokens` real tokens in `num_reqs` rows uses."""
        if self.index == TOKEN:
            return slice(0, num_tokens)
        if self.index == ROW_PLUS_ONE:
            return slice(0, num_reqs + 1)
        if self.index == ROW:
            return slice(0, num_reqs)
        return slice(None)

    def padded(self, dispatch) -> slice:
        """The entries that are padding in a forward of `dispatch` (empty when not batch-indexed)."""
        if self.index == TOKEN:
            return slice(dispatch.num_tokens, dispatch.num_tokens_padded)
        if self.index == ROW_PLUS_ONE:
            return slice(dispatch.num_reqs + 1, dispatch.num_reqs_padded + 1)
        if self.index == ROW:
            return slice(dispatch.num_reqs, dispatch.num_reqs_padded)
        return slice(0, 0)

    def tail(self, dispatch, length: int) -> slice:
        """The entries past `dispatch`'s padded shape, up to the buffer's `length` (empty when not batch-indexed)."""
        start = {TOKEN: dispatch.num_tokens_padded, ROW: dispatch.num_reqs_padded,
                 ROW_PLUS_ONE: dispatch.num_reqs_padded + 1}.get(self.index)
        return slice(length, length) if start is None else slice(min(start, length), length)


class InputBuffers:
    def __init__(self, owner: str, device: torch.device):
        self.owner = owner
        self.device = device
        self._tensors: dict[str, torch.Tensor] = {}
        self._specs: dict[str, BufferSpec] = {}

    def register(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, index: str | None = None,
                 pad: int | str | None = None, padding: str | None = None) -> torch.Tensor:
        if name in self._tensors:
            raise KeyError(f"{self.owner}: buffer {name!r} registered twice")
        tensor = torch.zeros(shape, dtype=dtype, device=self.device)
        self._tensors[name] = tensor
        self._specs[name] = BufferSpec(index, pad, padding)
        return tensor

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def spec(self, name: str) -> BufferSpec:
        return self._specs[name]

    def rebind(self, name: str, tensor: torch.Tensor) -> None:
        """Point `name` at another tensor (a new address): what a buggy builder does instead of copying."""
        self._tensors[name] = tensor

    def items(self):
        return self._tensors.items()

    def names(self) -> list[str]:
        return list(self._tensors)


def register_attention_buffers(buffers: InputBuffers, max_tokens: int, max_reqs: int,
                               blocks_per_seq: int) -> None:
    """The buffers every paged-attention forward reads (vLLM's CommonAttentionMetadata)."""
    i64 = torch.int64
    buffers.register("input_ids", (max_tokens,), i64, TOKEN, 0, FREE)
    buffers.register("positions", (max_tokens,), i64, TOKEN, 0, FREE)
    buffers.register("query_start_loc", (max_reqs + 1,), i64, ROW_PLUS_ONE, NUM_TOKENS, INERT)
    buffers.register("seq_lens", (max_reqs,), i64, ROW, 0, INERT)
    buffers.register("slot_mapping", (max_tokens,), i64, TOKEN, PAD_SLOT, INERT)
    buffers.register("block_table", (max_reqs, blocks_per_seq), i64, ROW, 0, FREE)
    buffers.register("window_start", (max_tokens,), i64, TOKEN, 0, FREE)
    buffers.register("req_ids", (max_reqs,), i64, ROW, 0, FREE)


def poison_padding(buffers: InputBuffers, dispatch, salt: int) -> None:
    """Fill every FREE padded entry with values taken from real entries of the same buffer (poison A).

    Values copied from real entries are always valid (token ids, positions, block
    ids, row indices in range), yet differ from what a clean batch holds there; a
    correct forward's real outputs cannot change. `salt` varies the pattern.
    """
    for name, tensor in buffers.items():
        spec = buffers.spec(name)
        if spec.padding == FREE:
            fill_like_live(tensor, spec.used(dispatch.num_tokens, dispatch.num_reqs), spec.padded(dispatch), "A", salt)


def fill_like_live(tensor: torch.Tensor, live: slice, holes: slice, pattern: str, salt: int) -> None:
    """Fill `tensor[holes]` with valid values derived from its live entries `tensor[live]`.

    Pattern A copies live entries (floats times -3). Pattern B differs from A in
    every integer entry, with values every index buffer accepts (0, or 1 where A
    holds 0), and in every float entry (the live values times 2.5, plus 0.5)."""
    count, n = live.stop - live.start, holes.stop - holes.start
    if n <= 0:
        return
    if count <= 0:
        tensor[holes] = 0 if pattern == "A" else 1
        return
    picks = (torch.arange(n, device=tensor.device) * 7 + salt) % count + live.start
    values = tensor[picks]
    if tensor.is_floating_point():
        tensor[holes] = values * -3.0 if pattern == "A" else values * 2.5 + 0.5
    else:
        tensor[holes] = values if pattern == "A" else (values == 0).to(tensor.dtype)
