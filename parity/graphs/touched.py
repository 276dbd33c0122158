"""What one op touches: every storage among its arguments, and those it writes by its schema.

The capture backends trace each captured op through this, so a graph knows its
read set (every storage an op of it touched: the capture manifest) and its
write set (the storages its ops write in place: `Tensor(a!)` arguments and
`out=`), which the diagnosis compares with what the reference forward writes.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Touched:
    """The storages a traced region's ops touch (`read_storages`) and write in place (`write_storages`)."""

    def __init__(self):
        self.read_storages: set[int] = set()
        self.write_storages: set[int] = set()

    def add_tensors(self, reads, writes) -> None:
        """A region known by its tensors (a compiled call: parity.graphs.compiled)."""
        self.read_storages.update(storage_of(t) for t in [*reads, *writes] if t.numel())
        self.write_storages.update(storage_of(t) for t in writes if t.numel())

    def add(self, func, args, kwargs) -> None:
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.numel():
                self.read_storages.add(storage_of(t))
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            self.write_storages.update(storage_of(t) for t in tree_flatten(value)[0]
                                       if isinstance(t, torch.Tensor) and t.numel())
