"""CUDA-graph semantics on the CPU, so CI exercises every graph path.

Capture records every aten op through a TorchDispatchMode, with each tensor it
touches held by reference (a static address). Replay re-executes the ops on
those same tensors and writes results into the tensors captured, so:
- a graph keeps reading the tensor it captured even after the engine rebinds a
  buffer name to a new tensor (BUFFER_REASSIGNED);
- Python control flow and Python scalars are frozen at capture (FROZEN_AT_CAPTURE);
- a host sync during capture raises, as it does under CUDA capture: the ops
  that read a value on the host (`.item()`, `nonzero`, boolean masks, ...) at
  the aten level, and the tensor methods that copy to the host without an aten
  op on the CPU (`.tolist()`, `.cpu()`, `.numpy()`, printing) at the torch
  function level;
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

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from parity.errors import CaptureSyncError
from parity.graphs.ambient import Ambient
from parity.graphs.compiled import Region, RegionAware, in_region
from parity.graphs.touched import Touched, is_node, read_of, schema_facts, tensors_in
from parity.graphs.emulated_pool import EmulatedPool
from parity.graphs import launches  # noqa: F401 (Triton's launches seen as regions)

aten = torch.ops.aten

# The aten ops that read a value on the host (a sync) or give an output whose shape depends on values, each with
# the Python call that reaches it.
_SYNC_OPS = {
    aten._local_scalar_dense.default: ".item() (or int(), float(), bool(), an `if` on a tensor)",
    aten.nonzero.default: "nonzero (a data-dependent shape)",
    aten.nonzero_static.default: "nonzero_static",
    aten.masked_select.default: "masked_select (a data-dependent shape)",
    aten.is_nonzero.default: "bool() of a tensor (an `if` on a tensor)",
    aten.equal.default: "torch.equal",
    aten._unique2.default: "unique (a data-dependent shape)",
    aten.unique_consecutive.default: "unique_consecutive (a data-dependent shape)",
    aten.unique_dim.default: "unique (a data-dependent shape)",
}
# Tensor methods that read device memory on the host: on the CPU they run without an aten op (or return the
# tensor itself), under CUDA capture they are a device-to-host copy the capture refuses.
_HOST_READS = {
    torch.Tensor.tolist: ".tolist()", torch.Tensor.cpu: ".cpu()", torch.Tensor.numpy: ".numpy()",
    torch.Tensor.__array__: "numpy.asarray()",
    torch.Tensor.__repr__: "printing a tensor", torch.Tensor.__str__: "printing a tensor",
    torch.Tensor.__format__: "formatting a tensor",
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


def _classify(func, inputs: set[int], out) -> int:
    """VIEW, MUTATING or FUNCTIONAL; `inputs`: the storages of the op's non-empty argument tensors."""
    if func in _METADATA_INPLACE:
        return VIEW
    facts = schema_facts(func)
    if facts.writes:
        return MUTATING
    outs = tensors_in(out)
    if not outs:
        return VIEW
    if any(t.numel() and _storage_ptr(t) in inputs for t in outs):
        return VIEW   # e.g. aten._unsafe_view: an alias despite its schema
    if facts.returns_alias and not any(t.numel() for t in outs):
        return VIEW
    # NOTE: an aliasing schema with fresh memory is a composite that copied: under inference_mode
    # aten.to.dtype, contiguous and reshape reach the recorder undecomposed; they are computations.
    return FUNCTIONAL


def _freeze_all(tree):
    """`tree` with every tensor frozen (`_freeze`), plain lists, tuples and dicts rebuilt, as tree_map does."""
    if isinstance(tree, torch.Tensor):
        return _freeze(tree)
    if type(tree) is list or type(tree) is tuple:
        return type(tree)(_freeze_all(item) for item in tree)
    if type(tree) is dict:
        return {key: _freeze_all(item) for key, item in tree.items()}
    return tree_map(_freeze, tree) if is_node(tree) else tree


class _HostReads(TorchFunctionMode):
    """Refuses the host reads of a tensor that the CPU does without an aten op (`_HOST_READS`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _HOST_READS:
            raise CaptureSyncError(f"{_HOST_READS[func]} reads a tensor on the host (a device-to-host copy and a "
                                   "sync) and cannot be captured in a graph")
        return func(*args, **(kwargs or {}))


class _RegionCall:
    """A torch.compile'd region recorded as one op: replay calls the compiled callable again (its artifact
    runs, as a CUDA graph replays inductor's kernels) and hands back its new outputs, in capture order."""

    def __init__(self, region: Region, picks: list[int]):
        self.compiled, self.picks = region.compiled(), picks
        self.inference = torch.is_inference_mode_enabled()
        self.ambient = Ambient.now()
        self.__name__ = f"compiled {getattr(region.fn, '__qualname__', region.fn)}"

    def __call__(self, *args, **kwargs):
        # NOTE: the capture's guards, or dynamo compiles the region again (see ambient.py).
        with self.ambient.defaults(), torch.inference_mode(self.inference), torch.no_grad():
            flat = [t for t in tree_flatten(self.compiled(*args, **kwargs))[0] if isinstance(t, torch.Tensor)]
        return [flat[i] for i in self.picks]


def _span(t: torch.Tensor) -> tuple[int, int]:
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _overlaps(t: torch.Tensor, others) -> bool:
    start, end = _span(t)
    return any(o.numel() and _span(o)[0] < end and start < _span(o)[1] for o in others)


class _Recorder(RegionAware):
    def __init__(self, pool: EmulatedPool | None):
        super().__init__()
        self.ops: list[tuple] = []
        self.pool = pool
        self.touched = Touched()

    def region_exit(self, region: Region, result) -> None:
        """The compiled region is one op: its reads and writes from its dry twin, its new outputs copied (a kernel
        launch: one op too)."""
        if result is None:
            return
        if region.opaque:         # a kernel launch: launched again on replay, on the same arguments
            self.touched.add_tensors(region.reads, [])
            self.ops.append((region.replay, tree_map(_freeze, region.args), tree_map(_freeze, region.kwargs), None))
            return
        self.touched.add_tensors(region.reads, region.writes)
        given = [t for t in tree_flatten((region.args, region.kwargs))[0] if isinstance(t, torch.Tensor)]
        flat = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        picks = [i for i, t in enumerate(flat) if t.numel() and not _overlaps(t, [*given, *region.reads])]
        self.ops.append((_RegionCall(region, picks), tree_map(_freeze, region.args),
                         tree_map(_freeze, region.kwargs), [_freeze(flat[i]) for i in picks]))

    def _inside_region(self, func, args, kwargs):
        """A compiled artifact's own dispatched ops (allocations, extern kernels): run, placed, not recorded."""
        out = func(*args, **kwargs)
        if self.pool is not None and _classify(func, read_of(args, kwargs), out) == FUNCTIONAL:
            out = tree_map(self._place, out)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if in_region():
            return self._inside_region(func, args, kwargs)
        if func in _SYNC_OPS:
            raise CaptureSyncError(f"{_SYNC_OPS[func]} needs a host sync ({func}) and cannot be captured in a "
                                   "graph")
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                raise CaptureSyncError("boolean-mask indexing (a data-dependent shape) needs a host sync and "
                                       "cannot be captured in a graph")
        out = func(*args, **kwargs)
        read = read_of(args, kwargs)
        self.touched.add(func, args, kwargs, read)
        kind = _classify(func, read, out)
        if kind == VIEW:
            if self.pool is not None:
                for t in tensors_in(out):
                    self.pool.track(t)
            return out
        # A mutating op's outputs that are none of its arguments (a custom op that writes some and returns others)
        # are fresh, as a functional op's are; an in-place op returns what it wrote.
        fresh = [kind == FUNCTIONAL or bool(t.numel() and _storage_ptr(t) not in read) for t in tensors_in(out)]
        if self.pool is not None and any(fresh):
            # Every fresh output goes to the pool, as on CUDA: strided ones
            # (elementwise ops keep a transposed input's layout) and each
            # tensor of a multi-output op alike.
            placing = iter(fresh)
            out = tree_map(lambda t: self._place(t) if isinstance(t, torch.Tensor) and next(placing) else t, out)
        frozen_args, frozen_kwargs = _freeze_all(args), _freeze_all(kwargs)
        if not any(fresh):
            self.ops.append((func, frozen_args, frozen_kwargs, None))
            return out
        # replay copies each fresh output's new value into the tensor captured (None: an output it wrote in place)
        frozen_outs = [_freeze(t) if new else None for t, new in zip(tensors_in(out), fresh)]
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

    def __init__(self, ops: list[tuple], touched: Touched):
        self.ops = ops
        self.read_storages = touched.read_storages
        self.write_storages = touched.write_storages

    def replay(self) -> None:
        for func, args, kwargs, outs in self.ops:
            result = func(*args, **kwargs)
            if outs is None:
                continue
            for dst, src in zip(outs, tensors_in(result)):
                if dst is not None:
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
        recorder.host_reads = _HostReads()
        recorder.host_reads.__enter__()
        recorder.__enter__()
        return recorder

    def end(self, recorder: _Recorder) -> EmulatedSegment:
        self.abort(recorder)
        return EmulatedSegment(recorder.ops, recorder.touched)

    def abort(self, recorder: _Recorder) -> None:
        recorder.__exit__(None, None, None)
        recorder.host_reads.__exit__(None, None, None)

    @staticmethod
    def refused_while_capturing(exc: BaseException) -> bool:
        """Whether `exc`, raised inside a capture, is this backend refusing an op as CUDA capture does."""
        return isinstance(exc, CaptureSyncError)

    def finish(self, pool: EmulatedPool, outputs: tuple, segments, weak_outputs: bool) -> tuple:
        """End of a capture: what nothing holds any more returns to the pool.

        With weak outputs (as vLLM holds them) the outputs' memory returns too,
        while the graph still writes it at every replay.
        """
        if weak_outputs:
            pool.release([t for t in outputs if isinstance(t, torch.Tensor)])
        return outputs
