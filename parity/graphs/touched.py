"""What one op touches: every storage among its arguments, and those it writes by its schema.

The capture backends trace each captured op through this, so a graph knows its
read set (every storage an op of it touched: the capture manifest) and its
write set (the storages its ops write in place: `Tensor(a!)` arguments and
`out=`), which the diagnosis compares with what the reference forward writes.

Every captured op passes through here, so the walk is the hot path of a
capture: `tensors_in` finds the tensors of plain lists, tuples and dicts itself
(what aten arguments and results are) and leaves any other container to
pytree, and what an op's schema says is read once per op (`schema_facts`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils._pytree import SUPPORTED_NODES, tree_flatten


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def tensors_in(tree) -> list[torch.Tensor]:
    """The tensors among `tree`'s leaves, in pytree's order (what `tree_flatten` would find)."""
    found: list[torch.Tensor] = []
    _collect(tree, found)
    return found


def _collect(tree, found: list) -> None:
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif type(tree) is list or type(tree) is tuple:
        for item in tree:
            _collect(item, found)
    elif type(tree) is dict:
        for item in tree.values():
            _collect(item, found)
    elif is_node(tree):
        found.extend(t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))


def is_node(tree) -> bool:
    """Whether pytree walks into `tree` (a registered container, a named or other tuple, list or dict); else
    it is a leaf."""
    return isinstance(tree, (tuple, list, dict)) or type(tree) in SUPPORTED_NODES


class SchemaFacts(NamedTuple):
    writes: tuple[tuple[int, str, bool], ...]   # (position, name, kwarg-only) of each argument written in place
    returns_alias: bool                         # some return aliases an input by the schema


_FACTS: dict = {}


def schema_facts(func) -> SchemaFacts:
    """What `func`'s schema says, read once per op."""
    facts = _FACTS.get(func)
    if facts is None:
        schema = func._schema
        writes = tuple((i, a.name, a.kwarg_only) for i, a in enumerate(schema.arguments)
                       if a.alias_info is not None and a.alias_info.is_write)
        facts = _FACTS[func] = SchemaFacts(writes, any(r.alias_info is not None for r in schema.returns))
    return facts


class Touched:
    """The storages a traced region's ops touch (`read_storages`) and write in place (`write_storages`)."""

    def __init__(self):
        self.read_storages: set[int] = set()
        self.write_storages: set[int] = set()

    def add_tensors(self, reads, writes) -> None:
        """A region known by its tensors (a compiled call: parity.graphs.compiled)."""
        self.read_storages.update(storage_of(t) for t in [*reads, *writes] if t.numel())
        self.write_storages.update(storage_of(t) for t in writes if t.numel())

    def add(self, func, args, kwargs, read: set[int] | None = None) -> None:
        """Count one op; `read`: the storages of its argument tensors (`read_of`), when the caller has them."""
        self.read_storages |= read_of(args, kwargs) if read is None else read
        for i, name, kwarg_only in schema_facts(func).writes:
            value = args[i] if i < len(args) and not kwarg_only else kwargs.get(name)
            self.write_storages.update(storage_of(t) for t in tensors_in(value) if t.numel())


def read_of(args, kwargs) -> set[int]:
    """The storages of every non-empty tensor among an op's arguments."""
    return {storage_of(t) for t in tensors_in((args, kwargs)) if t.numel()}
