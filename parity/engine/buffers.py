"""Persistent input buffers: one owner for every tensor a forward reads.

Each tensor is allocated once at its maximum size and registered under a name.
Per-step code only copy_()s into slices, so a graph captured once keeps reading
the right address. The registry is also what the capture-manifest audit
compares against: `rebind` is what a buggy builder does instead of copying.
"""

from __future__ import annotations

import torch


# How each buffer is indexed, so analysis can tell real entries from padding.
TOKEN_BUFFERS = frozenset({"input_ids", "positions", "slot_mapping", "window_start", "hidden_states"})
ROW_BUFFERS = frozenset({"seq_lens", "block_table", "req_ids", "sample_indices", "draft_tokens",
                         "draft_logprobs", "draft_probs"})
ROW_PLUS_ONE_BUFFERS = frozenset({"query_start_loc"})


class InputBuffers:
    def __init__(self, owner: str, device: torch.device):
        self.owner = owner
        self.device = device
        self._tensors: dict[str, torch.Tensor] = {}

    def register(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if name in self._tensors:
            raise KeyError(f"{self.owner}: buffer {name!r} registered twice")
        tensor = torch.zeros(shape, dtype=dtype, device=self.device)
        self._tensors[name] = tensor
        return tensor

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def rebind(self, name: str, tensor: torch.Tensor) -> None:
        """Replace a buffer by another tensor (a new address). Only faults do this."""
        self._tensors[name] = tensor

    def items(self):
        return self._tensors.items()

    def names(self) -> list[str]:
        return list(self._tensors)


def register_attention_buffers(buffers: InputBuffers, max_tokens: int, max_reqs: int,
                               blocks_per_seq: int) -> None:
    """The buffers every paged-attention forward reads (vLLM's CommonAttentionMetadata)."""
    i64 = torch.int64
    buffers.register("input_ids", (max_tokens,), i64)
    buffers.register("positions", (max_tokens,), i64)
    buffers.register("query_start_loc", (max_reqs + 1,), i64)
    buffers.register("seq_lens", (max_reqs,), i64)
    buffers.register("slot_mapping", (max_tokens,), i64)
    buffers.register("block_table", (max_reqs, blocks_per_seq), i64)
    buffers.register("window_start", (max_tokens,), i64)
    buffers.register("req_ids", (max_reqs,), i64)
