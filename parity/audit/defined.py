"""Which bytes of a graph's outputs the captured kernels define: storage allocated by `torch.empty` is not.

vLLM's attention layer allocates its output with `torch.empty` and a kernel
fills it in place; split at attention (PIECEWISE), that buffer is an output of
the piece before, which never writes it: eager attention fills it after the
replay. Its bytes are whatever the memory held, in the graph and in the
eager run alike, so comparing them would report a difference that is no bug.
The tracer marks memory an empty-factory hands out as undefined and every
byte an op then writes as defined; an output is compared only where defined.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

# Ops that hand out memory without writing it.
EMPTY_FACTORIES = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                   aten.new_empty.default, aten.new_empty_strided.default, aten.empty.out}


class Undefined:
    """Disjoint byte ranges [start, end) nothing has written since they were handed out."""

    def __init__(self):
        self.ranges: list[tuple[int, int]] = []

    def add(self, start: int, end: int) -> None:
        self.written(start, end)
        if end > start:
            self.ranges.append((start, end))

    def written(self, start: int, end: int) -> None:
        """Bytes [start, end) now hold values."""
        kept = []
        for s, e in self.ranges:
            if e <= start or end <= s:
                kept.append((s, e))
                continue
            if s < start:
                kept.append((s, start))
            if end < e:
                kept.append((end, e))
        self.ranges = kept

    def mask(self, t: torch.Tensor) -> torch.Tensor | None:
        """Elements of `t` whose bytes were all written (True); None when every element was."""
        if not self.ranges or not t.numel():
            return None
        offsets = torch.zeros((), dtype=torch.long)
        for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
            shape = [1] * t.dim()
            shape[d] = size
            offsets = offsets + (torch.arange(size) * stride).view(shape)
        first = t.data_ptr() + offsets.expand(t.shape) * t.element_size()
        last = first + t.element_size()
        undefined = torch.zeros(t.shape, dtype=torch.bool)
        for s, e in self.ranges:
            undefined |= (first < e) & (last > s)
        return None if not undefined.any() else (~undefined).to(t.device)
