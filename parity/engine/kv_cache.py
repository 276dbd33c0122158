"""Paged KV cache and the block allocator behind it."""

from __future__ import annotations

import torch

PAD_SLOT = -1


class PagedKVCache:
    """Keys and values per layer: [num_blocks * block_size + 1, kv_heads, head_dim].

    The extra last row is the trash slot that PAD_SLOT writes land in.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        shape = (num_blocks * block_size + 1, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def tensors(self) -> list[torch.Tensor]:
        return self.keys + self.values

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.tensors()]

    def restore(self, saved: list[torch.Tensor]) -> None:
        for live, old in zip(self.tensors(), saved):
            live.copy_(old)


class BlockAllocator:
    """Hands out block ids; a request's blocks cover its positions in order."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))
        self.num_blocks = num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_ids(self) -> list[int]:
        """The blocks no request holds now."""
        return list(self._free)

    def ensure(self, blocks: list[int], num_positions: int) -> None:
        """Grow `blocks` in place until it covers `num_positions` positions."""
        needed = -(-num_positions // self.block_size)
        while len(blocks) < needed:
            if not self._free:
                raise RuntimeError("out of KV blocks")
            blocks.append(self._free.pop())

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
        blocks.clear()
