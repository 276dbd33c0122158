"""Padded rows reaching live rows through an index: told from the op's indices, never from its outcome.

When a padded row of a batch indexes the same element as a real row in one
indexed write (a padded row's cache row or slot pointing at a live request's),
the element keeps whichever write lands last. On the CPU that order is fixed;
on CUDA it is not, so the replay and the eager run can differ by chance and
every one-variable experiment on that replay is a coin flip. Poisoning cannot
be trusted to show it either (a race can hide the padded write in every run).

So a run is watched by a `Recorder` (the audit's shadow run of a replay with
padded rows; the harness's re-run of the reference's divergent forward and
its padding probe, through `diagnose/routing.py`, which says how many of an
index's rows are live from the engine's registry): every indexed write is
read for the elements each batch row targets; the batch row of an index
element is its position along the index's leading dimension. Computed from
the indices alone, on copies, it gives the same answer on every backend.
- `overlaps` (the audit, `num_valid` known) and `overwrites` (the harness: the
  named buffer that supplied the index, or that an index computed in the
  callable writes): padded rows target an element a live row targets in one
  write;
- `routed`: two runs of one forward that differ only in a poisoned region of
  persistent tensors; a read whose live rows' index entries are the same in
  both, yet whose live rows read different values, routed those rows to
  poisoned elements: its index buffer is named, not the tensor read.
Ops read: writes `index_put_` (1-D or broadcast integer indices),
`index_copy_`, `index_fill_` (along `dim`), `scatter_` and `put_`; reads
`index_select`, `gather` and advanced indexing with a leading index. A write
whose indices do not have the padded batch as leading dimension, writes inside
a `torch.compile`d region, and custom kernels (a Triton or CUDA KV store) are
not read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.audit.state import rows_apart
from parity.graphs.compiled import RegionAware, in_region

aten = torch.ops.aten
READS = (aten.index_select.default, aten.gather.default, aten.index.Tensor)


def _flat_targets(sizes: list[int], coords: list[torch.Tensor]) -> torch.Tensor:
    """Row-major flat ids of the coordinates (each normalised into [0, size))."""
    flat = torch.zeros_like(coords[0])
    for size, c in zip(sizes, coords):
        flat = flat * size + c % size
    return flat


def _index_put(dest, indices):
    if not indices or any(i is None or i.dtype == torch.bool or i.is_floating_point() for i in indices):
        return None
    coords = torch.broadcast_tensors(*[i.detach().cpu().long() for i in indices])
    return _flat_targets(list(dest.shape[:len(coords)]), list(coords))


def _along(dest, dim, index):
    return index.detach().cpu().long() % dest.shape[dim] if index.dim() == 1 else None


def _scatter(dest, dim, index):
    index = index.detach().cpu().long()
    grids = list(torch.meshgrid(*[torch.arange(n) for n in index.shape], indexing="ij"))
    grids[dim] = index
    return _flat_targets(list(dest.shape[:index.dim()]), grids)


def targets(func, args, kwargs) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor] | None:
    """(destination, index tensors, the flat target of each index element: leading dimension = batch row) of an
    indexed write; None for any other op."""
    get = lambda i, name: args[i] if len(args) > i else kwargs.get(name)  # noqa: E731
    dest = get(0, "self")
    if func in (aten.index_put_.default, aten._index_put_impl_.default):
        indices = [i for i in get(1, "indices") if i is not None]
        return dest, indices, _index_put(dest, list(get(1, "indices")))
    if func in (aten.index_copy_.default, aten.index_fill_.int_Scalar, aten.index_fill_.int_Tensor):
        dim, index = get(1, "dim"), get(2, "index")
        return dest, [index], _along(dest, dim % max(dest.dim(), 1), index)
    if func in (aten.scatter_.src, aten.scatter_.value):
        dim, index = get(1, "dim"), get(2, "index")
        return dest, [index], _scatter(dest, dim % max(dest.dim(), 1), index)
    if func is aten.put_.default:
        index = get(1, "index")
        return dest, [index], index.detach().cpu().long() % max(dest.numel(), 1)
    return None


def overlap(flat: torch.Tensor | None, num_valid: int, padded: int) -> tuple[int, int] | None:
    """(how many, one) targets both a real row (leading index < num_valid) and a padded row write."""
    if flat is None or flat.dim() == 0 or flat.shape[0] != padded:
        return None
    real, pad = flat[:num_valid].reshape(-1), flat[num_valid:].reshape(-1)
    both = pad[torch.isin(pad, real)].unique()
    return (int(both.numel()), int(both[0])) if both.numel() else None


@dataclass
class Access:
    op: str
    write: bool
    tensor: torch.Tensor             # the tensor written or read (the op's destination or source)
    indices: list[torch.Tensor]      # the op's index tensors, as passed
    index: str | None                # the named buffer that supplied the index (None: computed in the callable)
    flat: torch.Tensor               # each index element's target; leading dimension = batch row
    values: torch.Tensor | None      # a read's values, leading dimension = batch row

    @property
    def storage(self) -> int:
        return self.tensor.untyped_storage().data_ptr()


class Recorder(RegionAware):
    """Over a run: its indexed writes (every one with `every`, else those whose index is a view of a named
    buffer or that write one) and its indexed reads through a named buffer (`names`: storage -> name)."""

    def __init__(self, names: dict[int, str] | None = None, every: bool = False):
        super().__init__()
        self.names, self.every = names or {}, every
        self.accesses: list[Access] = []

    def _name(self, indices) -> str | None:
        return next((self.names[i.untyped_storage().data_ptr()] for i in indices if isinstance(i, torch.Tensor)
                     and i.untyped_storage().data_ptr() in self.names), None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        found = None if in_region() else targets(func, args, kwargs)
        write = None
        if found is not None and found[2] is not None:
            index = self._name(found[1])
            # NOTE: an index computed in the callable is kept where it writes a named buffer (named then).
            if self.every or index is not None or found[0].untyped_storage().data_ptr() in self.names:
                write = Access(str(func), True, found[0], found[1], index, found[2], None)
        out = func(*args, **kwargs)
        if write is not None:
            self.accesses.append(write)
        elif func in READS and not in_region():
            read = self._read(func, args, out)
            if read is not None:
                self.accesses.append(read)
        return out

    def _read(self, func, args, out) -> Access | None:
        source = args[0]
        if func is aten.index.Tensor:
            indices, flat, values = list(args[1]), _index_put(source, list(args[1])), out
        else:
            dim = args[1] % max(source.dim(), 1)
            along = func is aten.index_select.default
            indices = [args[2]]
            flat = _along(source, dim, args[2]) if along else _scatter(source, dim, args[2])
            values = out.movedim(dim, 0) if along else out
        name = self._name(indices) if flat is not None and flat.dim() else None
        if name is None:
            return None
        return Access(str(func), False, source, indices, name, flat, values.detach().clone())


def overlaps(recorder: Recorder, num_valid: int, padded: int) -> list[tuple[Access, tuple[int, int]]]:
    """(write, (how many, one) targets) of the recorded writes whose padded rows (`num_valid..padded-1`) target
    what their real rows target."""
    hits = [(a, overlap(a.flat, num_valid, padded)) for a in recorder.accesses if a.write]
    return [(a, hit) for a, hit in hits if hit is not None]


def overwrites(recorder: Recorder, live, persistent: dict[int, str]) -> tuple[list[str], list[str], list[str]]:
    """(buffers named, tensors written, evidence) of every write whose padded rows target an element a live row
    targets: its index buffer, or, for an index computed in the callable, the named buffer it writes.
    `live(index, rows)`: how many leading entries of a `rows`-long index from buffer `index` (None: computed)
    are live rows (None: unknown); `persistent`: storage -> name of what persists across runs."""
    names, written, evidence = [], [], []
    for a in (a for a in recorder.accesses if a.write):
        padded = a.flat.shape[0]
        valid = live(a.index, padded)
        hit = overlap(a.flat, valid, padded) if valid is not None and valid < padded else None
        if hit is None:
            continue
        label = persistent.get(a.storage) or recorder.names.get(a.storage, "a tensor")
        name = a.index if a.index is not None else label
        names += [name] if name not in names else []
        written += [label] if label not in written else []
        route = f"of {a.index}" if a.index is not None else "of an index computed in the forward"
        evidence.append(f"{a.op} writing {label}: the padded rows {valid}..{padded - 1} "
                        f"{route} target {hit[0]} element(s) a live row of the same write targets (element "
                        f"{hit[1]}): padded rows write over live rows, whatever pad value the registry declares")
    if names:
        evidence.append("told from the write's indices alone, before any re-run: on CUDA which of two writes to one "
                        "element lands is undefined, so the answer is the same on every backend")
    return names, written, evidence


def routed(first: Recorder, second: Recorder, live, persistent: dict[int, str]) -> tuple[list[str], list[str]]:
    """(index buffers, evidence) of the reads of persistent tensors whose live rows' index entries are the same in
    two runs of one forward yet read different values: the index routed them to what differs (`live` and
    `persistent` as `overwrites` takes them)."""
    names, evidence = [], []
    for a, b in zip(*[[a for a in r.accesses if not a.write] for r in (first, second)]):
        if (a.op, a.index, a.storage) != (b.op, b.index, b.storage) or a.storage not in persistent:
            continue
        valid = live(a.index, a.flat.shape[0])
        if not valid or not torch.equal(a.flat[:valid], b.flat[:valid]):
            continue    # an index that itself moved is named by its own region
        rows = rows_apart(a.values[:valid], b.values[:valid])
        if not rows or a.index in names:
            continue
        names.append(a.index)
        shown = ", ".join(f"row {r} -> element {int(a.flat[r].reshape(-1)[0])}" for r in rows[:4])
        evidence.append(f"{a.op} reading {persistent[a.storage]} through {a.index}: live rows read elements that "
                        f"differ between the two runs though {a.index}'s live entries are the same ({shown}): "
                        f"{a.index} routes live rows to poisoned elements")
    return names, evidence


def _name_of(t: torch.Tensor, record, found) -> str | None:
    """The persistent buffer behind a tensor the shadow run read: a moved role's keeper, else the role on its
    storage that names it best; None for a tensor computed inside the callable."""
    ptr = t.untyped_storage().data_ptr()
    for rebind in found:
        live = rebind.real if rebind.real is not None else rebind.live_tensor
        if any(x is not None and x.untyped_storage().data_ptr() == ptr for x in (live, rebind.live_tensor)):
            return (rebind.keeper or rebind.role).name
    roles = sorted((r for r in record.roles if r.storage == ptr), key=lambda r: r.owner_rank)
    return roles[0].name if roles else None


def racing(overlaps: list, record, found, num_valid: int, padded: int) -> tuple[list[str], list[str]]:
    """(buffers, evidence) of a PADDING_LEAK told from the overlaps: the index inputs of the writes, in order."""
    names, evidence = [], []
    dest = [record.layouts.get(a.storage, (f"a {tuple(a.tensor.shape)} tensor",))[0] for a, _ in overlaps]
    for (a, (elements, example)), written in zip(overlaps, dest):
        inputs = [n for n in (_name_of(i, record, found) for i in a.indices) if n is not None]
        names += [n for n in inputs if n not in names]
        evidence.append(f"{a.op} writing {written}: the padded rows {num_valid}..{padded - 1} target {elements} "
                        f"element(s) a real row targets in the same op (flat target {example}), indexed by "
                        f"{', '.join(inputs) or 'indices computed inside the callable'}")
    names = names or dest[:1]
    evidence.append("where two rows of one kernel write one element, the order is undefined on CUDA: real rows "
                    "race with padding, so the replay and eager differ by chance and no one-variable experiment "
                    "is run; told from the indices alone, the same on every backend")
    return names, evidence
