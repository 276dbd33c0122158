"""What a callable touches: the storages a captured graph reads and writes, and undo logs.

`ReadSetTracer` runs over a capture (or a shadow run) as a TorchDispatchMode and
records, per op, every tensor it reads that was not produced inside the traced
region (the graph's *external inputs*: buffers, weights, caches) and every
external storage it writes (a KV cache, a static output buffer). Produced
memory is tracked as address ranges, not storages, because the emulated pool
carves many tensors out of one segment storage.

`WriteLog` is a copy-on-write undo log: before the first write to a storage
that existed when the log started it saves the storage's bytes, and `undo()`
puts them back. Shadow runs, warm-ups and emulated captures run under it so
they leave no trace.

Both are `RegionAware` (parity.graphs.compiled): torch.compile'd code runs
compiled under them, and a compiled region's reads and writes, which its own
kernels hide from dispatch modes, come from the region's dry eager twin.
"""

from __future__ import annotations

import bisect

import torch
from torch.utils._pytree import tree_flatten

from parity.audit.defined import EMPTY_FACTORIES, Undefined
from parity.graphs.compiled import Region, RegionAware, in_region
from parity.graphs import launches  # noqa: F401 (Triton's launches seen as regions)


def version_of(t: torch.Tensor) -> int | None:
    """The tensor's version counter (bumped by every in-place write); None for an inference tensor, which has none."""
    return None if t.is_inference() else t._version


def storage_ptr(t: torch.Tensor) -> int:
    """The address of the storage a tensor views (its identity as memory)."""
    return t.untyped_storage().data_ptr()


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the bytes a (possibly strided) view can reach."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
    return (t.data_ptr(), t.data_ptr() + extent * t.element_size())


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of `t` (shares memory)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def written_tensors(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an op writes in place, by its schema (`Tensor(a!)` arguments, `out=`)."""
    found = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        found += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return found


def merged(spans) -> list[tuple[int, int]]:
    """The union of [start, end) ranges, as sorted disjoint ranges."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def minus(spans, cut) -> list[tuple[int, int]]:
    """The parts of disjoint ranges `spans` outside every range of `cut`."""
    for c0, c1 in cut:
        spans = [p for s, e in spans for p in ((s, min(e, c0)), (max(s, c1), e)) if p[1] > p[0]] \
            if any(s < c1 and c0 < e for s, e in spans) else spans
    return spans


def within(spans, start: int, end: int) -> list[tuple[int, int]]:
    """The parts of disjoint ranges `spans` inside [start, end)."""
    return [(max(s, start), min(e, end)) for s, e in spans if s < end and start < e]


class _Ranges:
    """Disjoint [start, end) ranges of produced memory with a containment query.

    A new range evicts those it overlaps: memory handed out again was freed,
    so what was produced there before is gone.
    """

    def __init__(self):
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        lo = bisect.bisect_left(self._starts, start)
        if lo and self._ends[lo - 1] > start:
            lo -= 1
        hi = bisect.bisect_left(self._starts, end)
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]

    def contains(self, start: int, end: int) -> bool:
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and end <= self._ends[i]


def fresh_outputs(out, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Outputs of an op that are new memory: they overlap none of its inputs.

    (Not "another storage": the emulated pool carves outputs out of a segment
    storage that the op's inputs may live in too.)
    """
    spans = [byte_range(t) for t in inputs if t.numel()]
    fresh = []
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and t.numel():
            start, end = byte_range(t)
            if not any(s < end and start < e for s, e in spans):
                fresh.append(t)
    return fresh


def region_outputs(region: Region, result) -> list[torch.Tensor]:
    """What a compiled region returned that is new memory (not a view of anything it was given or read)."""
    given = [t for t in tree_flatten((region.args, region.kwargs))[0] if isinstance(t, torch.Tensor)]
    return fresh_outputs(result, [*given, *region.reads, *region.writes])


class ReadSetTracer(RegionAware):
    """Records a traced region's external reads and writes (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.reads: dict[tuple[int, int, int], torch.Tensor] = {}   # (storage, start, end) -> first view read
        self.writes: dict[int, torch.Tensor] = {}                    # storage -> a view written
        self.undefined = Undefined()                                 # produced bytes no op has written
        self.allocated: list[tuple[int, int]] = []                   # every range an op handed out, in order
        self._produced = _Ranges()

    def is_external(self, t: torch.Tensor) -> bool:
        return t.numel() > 0 and not self._produced.contains(*byte_range(t))

    def region_enter(self, region: Region) -> None:
        what = "kernel" if region.opaque else "compiled"
        self.ops.append(f"{what} {getattr(region.fn, '__qualname__', region.fn)}")
        for t in region.reads:
            if self.is_external(t):
                self.reads.setdefault((storage_ptr(t), *byte_range(t)), t)
        for t in region.writes:
            if self.is_external(t):
                self.writes.setdefault(storage_ptr(t), t)
        # NOTE: a kernel launch may fill what it is given (an output from torch.empty): defined from here on.
        for t in region.may_write:
            self.undefined.written(*byte_range(t))

    def region_exit(self, region: Region, result) -> None:
        for t in region_outputs(region, result):
            self._produced.add(*byte_range(t))
            self.allocated.append(byte_range(t))
            self.undefined.written(*byte_range(t))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if in_region():
            return func(*args, **kwargs)        # a compiled artifact's internals: region_enter had its set
        self.ops.append(str(func))
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        for t in flat:
            if self.is_external(t):
                self.reads.setdefault((storage_ptr(t), *byte_range(t)), t)
        for t in written_tensors(func, args, kwargs):
            if self.is_external(t):
                self.writes.setdefault(storage_ptr(t), t)
            self.undefined.written(*byte_range(t))
        out = func(*args, **kwargs)
        for t in fresh_outputs(out, flat):
            self._produced.add(*byte_range(t))
            self.allocated.append(byte_range(t))
            (self.undefined.add if func in EMPTY_FACTORIES else self.undefined.written)(*byte_range(t))
        return out


def touched(run) -> tuple[set[int], set[int]]:
    """The storages `run()` reads and writes of the memory that existed before it (without autograd): a
    forward's read and write sets from what actually ran, for a caller to name by role."""
    tracer = ReadSetTracer()
    with tracer, torch.no_grad():
        run()
    return {storage for storage, _, _ in tracer.reads}, set(tracer.writes)


class WriteLog(RegionAware):
    """Copy-on-write undo log over every storage that existed when it started."""

    def __init__(self):
        super().__init__()
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # storage -> (live bytes, saved bytes)
        self._produced = _Ranges()

    def _save(self, t: torch.Tensor) -> None:
        ptr = storage_ptr(t)
        if t.numel() and ptr not in self.saved and not self._produced.contains(*byte_range(t)):
            live = storage_bytes(t)
            self.saved[ptr] = (live, live.clone())

    def region_enter(self, region: Region) -> None:
        for t in region.may_write:
            self._save(t)

    def region_exit(self, region: Region, result) -> None:
        for t in region_outputs(region, result):
            self._produced.add(*byte_range(t))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if in_region():
            return func(*args, **kwargs)        # a compiled artifact's internals: region_enter saved its writes
        flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        for t in written_tensors(func, args, kwargs):
            self._save(t)
        out = func(*args, **kwargs)
        for t in fresh_outputs(out, flat):
            self._produced.add(*byte_range(t))
        return out

    def written(self) -> dict[int, torch.Tensor]:
        """Storage address -> live bytes of every pre-existing storage written so far."""
        return {ptr: live for ptr, (live, _) in self.saved.items()}

    def before(self) -> dict[int, torch.Tensor]:
        """Storage address -> the bytes it held before the first write."""
        return {ptr: saved for ptr, (_, saved) in self.saved.items()}

    def undo(self) -> None:
        for live, saved in self.saved.values():
            live.copy_(saved)
