"""What an audit remembers of a capture: the read set by role, the host values, the outputs.

Built once, when the audited callable runs inside a capture: the tracer gives
the storages the captured kernels read and write; walking the callable's roots
names them (a role is a path that reaches a tensor on a storage the graph
touches); every Python bool/int/float reachable the same way is a host value
the graph may have baked in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from parity.audit.aliases import non_owning
from parity.audit.defined import Undefined
from parity.graphs.roles import HOST_TYPES, Path, chain_of, resolve, roots_of, walk
from parity.audit.state import bit_equal
from parity.audit.trace import ReadSetTracer, byte_range, merged, storage_ptr, version_of
from parity.graphs.ambient import Ambient

MAX_PATHS_PER_TENSOR = 3
MAX_HOST_VALUES = 4000
# Inference tensors have no version counter: what the graph only reads is copied at the first replay,
# up to this many bytes per capture, to tell later whether anything wrote it.
MAX_INFERENCE_COPY_BYTES = 16 << 20


@dataclass
class Role:
    path: Path
    tensor: torch.Tensor        # the tensor the path reached at capture (held: its address stays the graph's)
    storage: int
    address: int
    shape: tuple
    dtype: torch.dtype
    version: int | None         # its version counter right after capture (None: an inference tensor)
    written: bool               # the graph writes this storage
    declared: bool              # a declared static input or a direct tensor argument
    chain: tuple = ()           # ids of the objects along the path at capture (root excluded, leaf excluded)
    initial: torch.Tensor | None = None   # an inference tensor's values at the first replay (no version counter)

    def changed(self) -> bool | None:
        """Whether the tensor was written since capture; None when that cannot be told.

        The version counter says so; an inference tensor has none, so its
        values are compared with those at the first replay (a write of equal
        values then counts as none).
        """
        if self.version is not None:
            return version_of(self.tensor) != self.version
        if self.initial is None:
            return None
        return not bit_equal(self.tensor, self.initial)

    @property
    def name(self) -> str:
        return str(self.path)

    @property
    def whole(self) -> bool:
        """The tensor spans its whole storage: the buffer itself, not a view of part of it."""
        t = self.tensor
        return t.storage_offset() == 0 and t.numel() * t.element_size() == t.untyped_storage().nbytes()

    @property
    def owner_rank(self) -> tuple:
        """Sort key naming a storage best: the buffer itself first, then whole views, then the shortest path."""
        return (not self.whole, self.tensor._base is not None, self.path.depth(), self.name)


@dataclass
class CaptureRecord:
    fn: object
    args: tuple
    kwargs: dict
    roles: list[Role]
    host: dict[Path, object]                   # host values by path, and None where an input was absent
    writes: dict[int, torch.Tensor]            # storage -> a view of each external storage the graph writes
    outputs: list[torch.Tensor]                # non-owning aliases of the graph's output tensors
    output_names: list[str]
    unnamed: list[torch.Tensor] = field(default_factory=list)   # external reads no path reaches
    num_ops: int = 0
    undefined: Undefined = field(default_factory=Undefined)   # produced bytes the graph never writes
    defined: list | None = None     # per output: elements the graph writes (bool mask; None: all); see settle()
    produced: list = field(default_factory=list)   # byte ranges the capture handed out: what every replay writes
    ambient: Ambient = field(default_factory=Ambient.now)   # the torch state it was captured under

    def settle(self) -> None:
        """Work that runs torch ops, done once after the capture closed (ops inside it would be captured).

        Per output, the elements the graph defines; copies of the inference
        tensors the graph only reads (they have no version counter).
        """
        if self.defined is None:
            self.defined = [self.undefined.mask(t) for t in self.outputs]
            _copy_inference_inputs(self.roles)

    @property
    def layouts(self) -> dict[int, tuple]:
        """Storage -> (name, dtype, shape) of the role naming it best; dtype/shape None unless it spans the storage."""
        found: dict[int, tuple] = {}
        for role in sorted(self.roles, key=lambda r: r.owner_rank):
            if role.storage not in found:
                whole = role.whole and role.tensor.is_contiguous()
                found[role.storage] = (role.name, role.dtype if whole else None, role.shape if whole else None)
        return found


def _declared(path: Path, value: torch.Tensor, roots: dict) -> bool:
    """A declared static input or a direct tensor argument; never a weight (a module's parameter or buffer)."""
    if isinstance(value, torch.nn.Parameter):
        return False
    parent = resolve(Path(path.root, path.steps[:-1]), roots) if path.steps else None
    if isinstance(parent, torch.nn.Module) and path.steps[-1][1] in {**parent._parameters, **parent._buffers}:
        return False
    return path.root == "static" or (path.root in ("args", "kwargs") and path.depth() == 1)


def _touched(tracer: ReadSetTracer) -> dict[int, list[tuple[int, int]]]:
    spans: dict[int, list[tuple[int, int]]] = {}
    for storage, start, end in tracer.reads:
        spans.setdefault(storage, []).append((start, end))
    for storage, t in tracer.writes.items():
        spans.setdefault(storage, []).append(byte_range(t))
    return spans


def build_record(fn, args, kwargs, static_inputs, tracer: ReadSetTracer, result,
                 output_names=None) -> CaptureRecord:
    """The record of one capture of `fn(*args, **kwargs)` that returned `result`."""
    spans = _touched(tracer)
    roles, host, per_tensor = [], {}, {}
    roots = roots_of(fn, args, kwargs, static_inputs)
    for path, value in walk(roots, absent=True):
        if not isinstance(value, torch.Tensor):
            if (value is None or isinstance(value, HOST_TYPES)) and len(host) < MAX_HOST_VALUES:
                host[path] = value
            continue
        if not value.numel() or storage_ptr(value) not in spans:
            continue
        start, end = byte_range(value)
        if not any(s < end and start < e for s, e in spans[storage_ptr(value)]):
            continue
        if per_tensor.setdefault(id(value), 0) >= MAX_PATHS_PER_TENSOR:
            continue
        per_tensor[id(value)] += 1
        roles.append(Role(path, value, storage_ptr(value), value.data_ptr(), tuple(value.shape), value.dtype,
                          version_of(value), storage_ptr(value) in tracer.writes, _declared(path, value, roots),
                          chain_of(path, roots)))
    named = {r.storage for r in roles}
    unnamed = [t for (storage, _, _), t in tracer.reads.items() if storage not in named]
    outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
    names = list(output_names) if output_names else (
        ["out"] if isinstance(result, torch.Tensor) else [f"out[{i}]" for i in range(len(outputs))])
    return CaptureRecord(fn, tuple(args), dict(kwargs), roles, host, dict(tracer.writes),
                         [non_owning(t) for t in outputs], names, unnamed, len(tracer.ops), tracer.undefined,
                         produced=merged(tracer.allocated))


def _copy_inference_inputs(roles: list[Role]) -> None:
    """Copy what the graph only reads of inference tensors (no version counter), declared inputs first."""
    budget = MAX_INFERENCE_COPY_BYTES
    for role in sorted(roles, key=lambda r: not r.declared):
        size = role.tensor.numel() * role.tensor.element_size()
        if role.version is None and not role.written and size <= budget:
            role.initial = role.tensor.clone()
            budget -= size


def padded_rows_of(record: CaptureRecord) -> int | None:
    """The graph's batch size: the leading dimension of its first output with one."""
    for t in record.outputs:
        if t.dim():
            return int(t.shape[0])
    return None
