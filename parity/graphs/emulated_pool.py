"""The emulated backend's graph pools: blocks placed where the CUDA caching allocator would place them.

Captures into one pool overlay the same addresses, as on CUDA: harmless while
graphs replay one after another and each reads only what it wrote, a bug as
soon as one graph's output must outlive another graph's replay (POOL_ALIAS).
"""

from __future__ import annotations

import weakref

import torch


class EmulatedPool:
    """A graph memory pool that places blocks by the CUDA caching allocator's policy.

    The policy (c10/cuda/CUDACachingAllocator.cpp) is followed where it decides
    which address a fresh tensor gets:
    - sizes round up to 512 bytes;
    - requests up to 1 MiB come from "small" 2 MiB segments, larger ones from
      "large" segments (20 MiB under 10 MiB, else rounded up to 2 MiB), and the
      two kinds never lend to each other;
    - the free block chosen is the best fit: the smallest that is large enough,
      the lowest address among equals;
    - the allocated part is the block's start; the rest stays free when at least
      512 bytes remain (small) or more than 1 MiB remains (large);
    - a block returns to the pool as soon as the last tensor using it dies
      (weakref finalizers), during the capture or after it, and merges with free
      neighbours; outputs that their owner holds weakly return at once.
    Every fresh output of a captured op is placed, strided ones and each of a
    multi-output op too, because CUDA allocates them all in the pool; captures
    run without autograd, so temporaries die when Python lets go of them. On
    the tiny pair the allocation trace of a capture (sizes, order, offsets in
    their segments) then matches the caching allocator's block for block.
    So, as with CUDA, captures into one pool overlay the same addresses:
    harmless while graphs replay one after another and each reads only what it
    wrote, a bug as soon as one graph's output must outlive another graph's
    replay. Where a kernel allocates differently on the CPU than on the GPU, the
    addresses part ways; the policy is the same.
    """

    ROUND = 512
    SMALL = 1 << 20
    SMALL_SEGMENT = 2 << 20
    LARGE_SEGMENT = 20 << 20
    MIN_LARGE_ALLOC = 10 << 20

    def __init__(self, name: str):
        self.name = name
        self._segments: list[torch.Tensor] = []
        self._small: list[bool] = []                 # per segment: serves small requests
        self._bases: dict[int, int] = {}             # segment storage address -> segment index
        self._free: list[list[list[int]]] = []       # per segment: sorted [offset, size] free blocks
        self._live: dict[tuple[int, int], list[int]] = {}   # (segment, offset) -> [size, users]

    def allocate_like(self, out: torch.Tensor) -> torch.Tensor:
        """A tensor laid out like `out` (size, stride, offset) in pool memory; the caller copies the values in."""
        nbytes = max(self.ROUND, -(-out.untyped_storage().nbytes() // self.ROUND) * self.ROUND)
        small = nbytes <= self.SMALL
        place = self._best_fit(nbytes, small, out.device)
        if place is None:
            self._new_segment(nbytes, small, out.device)
            place = self._best_fit(nbytes, small, out.device)
        seg, block = place
        size = nbytes if self._splits(block[1] - nbytes, small) else block[1]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            self._free[seg].remove(block)
        self._live[(seg, offset)] = [size, 0]
        placed = torch.empty(0, dtype=out.dtype, device=out.device)
        placed.set_(self._segments[seg].untyped_storage(), offset // out.element_size() + out.storage_offset(),
                    out.size(), out.stride())
        self.track(placed)
        return placed

    def _splits(self, remaining: int, small: bool) -> bool:
        return remaining >= self.ROUND if small else remaining > self.SMALL

    def _new_segment(self, nbytes: int, small: bool, device) -> None:
        if small:
            size = self.SMALL_SEGMENT
        elif nbytes < self.MIN_LARGE_ALLOC:
            size = self.LARGE_SEGMENT
        else:
            size = -(-nbytes // self.SMALL_SEGMENT) * self.SMALL_SEGMENT
        segment = torch.empty(size, dtype=torch.uint8, device=device)
        self._bases[segment.untyped_storage().data_ptr()] = len(self._segments)
        self._segments.append(segment)
        self._small.append(small)
        self._free.append([[0, size]])

    def _best_fit(self, nbytes: int, small: bool, device):
        best, best_key = None, None
        for seg, blocks in enumerate(self._free):
            if self._small[seg] != small or self._segments[seg].device != device:
                continue
            base = self._segments[seg].untyped_storage().data_ptr()
            for block in blocks:
                key = (block[1], base + block[0])
                if block[1] >= nbytes and (best_key is None or key < best_key):
                    best, best_key = (seg, block), key
        return best

    def _key_of(self, t: torch.Tensor):
        seg = self._bases.get(t.untyped_storage().data_ptr())
        if seg is None:
            return None
        byte = t.storage_offset() * t.element_size()
        for (s, offset), (size, _) in self._live.items():
            if s == seg and offset <= byte < offset + size:
                return (s, offset)
        return None

    def track(self, t: torch.Tensor) -> None:
        """Count `t` as a user of the block it lives in (views keep blocks busy too)."""
        key = self._key_of(t)
        if key is not None:
            self._live[key][1] += 1
            weakref.finalize(t, self._drop, key, self._live[key])

    def _drop(self, key, record) -> None:
        if self._live.get(key) is record:
            record[1] -= 1
            if record[1] <= 0:
                self._free_block(key)

    def _free_block(self, key) -> None:
        size = self._live.pop(key)[0]
        seg, offset = key
        blocks = sorted(self._free[seg] + [[offset, size]])
        merged = [blocks[0]]
        for b in blocks[1:]:
            if merged[-1][0] + merged[-1][1] == b[0]:
                merged[-1][1] += b[1]
            else:
                merged.append(b)
        self._free[seg] = merged

    def release(self, tensors) -> None:
        """Return blocks to the pool now, whoever still points at them (weakly held outputs)."""
        for t in tensors:
            key = self._key_of(t)
            if key is not None:
                self._free_block(key)

    @property
    def num_segments(self) -> int:
        return len(self._segments)
