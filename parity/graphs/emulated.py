"""CUDA-graph semantics on the CPU, so CI exercises every graph path.

Capture records every aten op through a TorchDispatchMode, with each tensor it
touches held by reference (a static address). Replay re-executes the ops on
those same tensors and writes results into the tensors captured, so:
- a graph keeps reading the tensor it captured even after the engine rebinds a
  buffer name to a new tensor (BUFFER_REASSIGNED);
- Python control flow and Python scalars are frozen at capture (FROZEN_AT_CAPTURE);
- a host sync during capture raises, as it does under CUDA capture;
- a later capture into the same pool can place its temporaries in outputs that
  an earlier graph released, so pool aliasing happens (POOL_ALIAS).

Pitfalls handled (found while prototyping): `_unsafe_view` and friends alias
their input although the schema says fresh (storages are compared); in-place
view ops change metadata and must not be re-run, so every recorded reference
is an alias frozen with its capture-time size/stride/offset; ops return
tuples and lists; boolean-mask indexing does not dispatch `nonzero` on CPU, so
index dtypes are checked.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from parity.errors import CaptureSyncError

aten = torch.ops.aten

_SYNC_OPS = {
    aten._local_scalar_dense.default, aten.nonzero.default, aten.nonzero_static.default,
    aten.masked_select.default, aten.is_nonzero.default, aten.equal.default,
    aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
}
# In-place ops that only change a tensor's metadata: frozen aliases already carry it.
_METADATA_INPLACE = {
    aten.t_.default, aten.transpose_.default, aten.unsqueeze_.default, aten.squeeze_.default,
    aten.squeeze_.dim, aten.as_strided_.default, aten.detach_.default, aten.swapdims_.default,
}
_NO_VALUE_FACTORIES = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default}

VIEW, MUTATING, FUNCTIONAL = 0, 1, 2


def _freeze(value):
    """An alias of a tensor with its capture-time size, stride and offset.

    Made with set_() rather than as_strided() so it is not an autograd view: it
    keeps the memory alive without keeping the original tensor object alive,
    and a weakref to that object tells when user code let go of it.
    """
    if isinstance(value, torch.Tensor):
        alias = torch.empty(0, dtype=value.dtype, device=value.device)
        return alias.set_(value.untyped_storage(), value.storage_offset(), value.size(), value.stride())
    return value


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _classify(func, args, kwargs, out) -> int:
    schema = func._schema
    if func in _METADATA_INPLACE:
        return VIEW
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return MUTATING
    if any(r.alias_info is not None for r in schema.returns):
        return VIEW
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    if not outs:
        return VIEW
    inputs = {_storage_ptr(t) for t in tree_flatten((args, kwargs))[0]
              if isinstance(t, torch.Tensor) and t.numel()}
    if any(t.numel() and _storage_ptr(t) in inputs for t in outs):
        return VIEW   # e.g. aten._unsafe_view: an alias despite its schema
    return FUNCTIONAL


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


class _Recorder(TorchDispatchMode):
    def __init__(self, pool: EmulatedPool | None):
        super().__init__()
        self.ops: list[tuple] = []
        self.pool = pool
        self.read_storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SYNC_OPS:
            raise CaptureSyncError(f"{func} needs a host sync and cannot be captured in a graph")
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                raise CaptureSyncError("boolean-mask indexing needs a host sync and cannot be captured")
        out = func(*args, **kwargs)
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.numel():
                self.read_storages.add(_storage_ptr(t))
        kind = _classify(func, args, kwargs, out)
        if kind == VIEW:
            if self.pool is not None:
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        self.pool.track(t)
            return out
        if kind == FUNCTIONAL and self.pool is not None:
            # Every fresh output goes to the pool, as on CUDA: strided ones
            # (elementwise ops keep a transposed input's layout) and each
            # tensor of a multi-output op alike.
            out = tree_map(self._place, out)
        frozen_args, frozen_kwargs = tree_map(_freeze, args), tree_map(_freeze, kwargs)
        if kind == MUTATING:
            self.ops.append((func, frozen_args, frozen_kwargs, None))
            return out
        fresh = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        frozen_outs = [_freeze(t) for t in fresh]
        if func not in _NO_VALUE_FACTORIES:
            self.ops.append((func, frozen_args, frozen_kwargs, frozen_outs))
        return out

    def _place(self, t):
        if not isinstance(t, torch.Tensor) or not t.numel():
            return t
        placed = self.pool.allocate_like(t)
        placed.copy_(t)
        return placed


class EmulatedSegment:
    """One captured piece: replay re-runs its ops on the captured tensors."""

    def __init__(self, ops: list[tuple], read_storages: set[int]):
        self.ops = ops
        self.read_storages = read_storages

    def replay(self) -> None:
        for func, args, kwargs, outs in self.ops:
            result = func(*args, **kwargs)
            if outs is None:
                continue
            for dst, src in zip(outs, (t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor))):
                dst.copy_(src)

    @property
    def num_ops(self) -> int:
        return len(self.ops)


class EmulatedBackend:
    """The `emulated` backend: begin/end a capture segment, replay it, pools."""

    name = "emulated"

    def __init__(self, device: torch.device):
        self.device = device
        self._count = 0

    def new_pool(self, name: str) -> EmulatedPool:
        return EmulatedPool(name)

    def warmup(self, fn) -> None:
        """CPU capture executes for real, so there is nothing to warm up."""

    def begin(self, pool: EmulatedPool) -> _Recorder:
        recorder = _Recorder(pool)
        recorder.__enter__()
        return recorder

    def end(self, recorder: _Recorder) -> EmulatedSegment:
        recorder.__exit__(None, None, None)
        return EmulatedSegment(recorder.ops, recorder.read_storages)

    def abort(self, recorder: _Recorder) -> None:
        recorder.__exit__(None, None, None)

    def finish(self, pool: EmulatedPool, outputs: tuple, segments, weak_outputs: bool) -> tuple:
        """End of a capture: what nothing holds any more returns to the pool.

        With weak outputs (as vLLM holds them) the outputs' memory returns too,
        while the graph still writes it at every replay.
        """
        if weak_outputs:
            pool.release([t for t in outputs if isinstance(t, torch.Tensor)])
        return outputs
