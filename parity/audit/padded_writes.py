"""Padded rows writing where real rows write, in one op: told from the op's indices, never from its outcome.

When a padded row of a batch indexes the same element as a real row in one
indexed write (a padded row's cache row or slot pointing at a live request's),
the element keeps whichever write lands last. On the CPU that order is fixed;
on CUDA it is not, so the replay and the eager run can differ by chance and
every one-variable experiment on that replay is a coin flip. Poisoning cannot
be trusted to show it either (a race can hide the padded write in every run).

So during the shadow run of a replay with padded rows, every indexed write is
read for the elements each batch row targets: the batch row of an index
element is its position along the index's leading dimension (rows
`num_valid..padded-1` are padding). Computed from the indices alone, on copies,
it gives the same answer on every backend. Ops read: `index_put_` (1-D or
broadcast integer indices), `index_copy_`, `index_fill_` (along `dim`),
`scatter_` and `put_`. A write whose indices do not have the padded batch as
leading dimension, writes inside a `torch.compile`d region, and custom kernels
(a Triton or CUDA KV store) are not read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.graphs.compiled import RegionAware, in_region

aten = torch.ops.aten


@dataclass
class Overlap:
    op: str
    dest: torch.Tensor                 # the tensor written (the op's destination)
    indices: list[torch.Tensor]        # the op's index tensors, as passed
    elements: int                      # index targets written by a padded row and a real row alike
    example: int                       # one such target (a flat index into the targets of the op)


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


class PaddedWrites(RegionAware):
    """Over a run of the callable: every indexed write whose padded rows target what its real rows target."""

    def __init__(self, num_valid: int, padded: int):
        super().__init__()
        self.num_valid, self.padded = num_valid, padded
        self.found: list[Overlap] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not in_region():
            found = targets(func, args, kwargs)
            hit = overlap(found[2], self.num_valid, self.padded) if found is not None else None
            if hit is not None:
                self.found.append(Overlap(str(func), found[0], found[1], *hit))
        return func(*args, **kwargs)


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


def racing(overlaps: list[Overlap], record, found, num_valid: int, padded: int) -> tuple[list[str], list[str]]:
    """(buffers, evidence) of a PADDING_LEAK told from the overlaps: the index inputs of the writes, in order."""
    names, evidence = [], []
    layouts = record.layouts
    for o in overlaps:
        inputs = [n for n in (_name_of(i, record, found) for i in o.indices) if n is not None]
        names += [n for n in inputs if n not in names]
        dest = layouts.get(o.dest.untyped_storage().data_ptr(), (f"a {tuple(o.dest.shape)} tensor",))[0]
        evidence.append(f"{o.op} writing {dest}: the padded rows {num_valid}..{padded - 1} target {o.elements} "
                        f"element(s) a real row targets in the same op (flat target {o.example}), indexed by "
                        f"{', '.join(inputs) or 'indices computed inside the callable'}")
    if not names:
        names = [layouts.get(o.dest.untyped_storage().data_ptr(), (f"a {tuple(o.dest.shape)} tensor",))[0]
                 for o in overlaps[:1]]
    evidence.append("where two rows of one kernel write one element, the order is undefined on CUDA: real rows "
                    "race with padding, so the replay and eager differ by chance and no one-variable experiment "
                    "is run; told from the indices alone, the same on every backend")
    return names, evidence
