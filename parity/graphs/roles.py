"""Roles: where a captured tensor or host value lives, as a path from the callable's roots.

A graph reads memory, not names. To say *which* buffer went wrong, every
tensor reachable from the callable's roots is named by the path that reaches
it: `args[0]`, `kwargs['x']`, `self.static.positions` (a bound method's
object), `static['ctx'].slot_mapping` (a user-declared static input, or the
object a getter returns), `self.layers[1].wq`. Paths are walked through
modules, dataclasses, dicts, lists, tuples and plain objects, and re-resolved
on the live objects at every replay: a path that now reaches another storage
is a rebinding, a path whose Python value changed is a host-value candidate.

Shared by `parity.audit` (any callable's graph) and the engine's capture
manifest (tensors a graph reads through its owner's attributes: the model's,
the proposer's).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from dataclasses import dataclass

import torch

ATTR, ITEM = "attr", "item"
MAX_DEPTH = 6
MAX_ITEMS = 256
MAX_NODES = 20000
MAX_VISITS = 3          # paths explored through one object (a buffer kept under two names gets both)
_GETTERS = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)
HOST_TYPES = (bool, int, float, str, enum.Enum)     # values a graph can bake: compared, never walked into
# Objects of these modules are machinery, not engine state: never walked into.
_OPAQUE_MODULES = ("torch.cuda", "torch._C", "torch.utils", "parity.audit", "parity.graphs", "threading",
                   "weakref", "logging", "_pytest", "pluggy")


@dataclass(frozen=True)
class Path:
    root: str                      # "args", "kwargs", "self", "static" or a closure variable name
    steps: tuple = ()              # ((ATTR, name) | (ITEM, key), ...)

    def child(self, kind: str, key) -> "Path":
        return Path(self.root, self.steps + ((kind, key),))

    def __str__(self) -> str:
        text = self.root
        for kind, key in self.steps:
            text += f".{key}" if kind == ATTR else f"[{key!r}]"
        return text

    def depth(self) -> int:
        return len(self.steps)


def roots_of(fn, args: tuple, kwargs: dict, static_inputs: dict | None) -> dict:
    """The objects a callable can reach: declared static inputs, arguments, bound object, closure.

    In that order: the walk names a tensor by the first path that reaches it,
    and the names users declared are the best ones.
    """
    roots = {}
    if static_inputs:
        roots["static"] = {name: (value() if isinstance(value, _GETTERS) else value)
                           for name, value in static_inputs.items()}
    roots.update({"args": tuple(args), "kwargs": dict(kwargs)})
    if isinstance(fn, functools.partial):
        roots["partial"] = {"args": fn.args, "keywords": fn.keywords}
        fn = fn.func
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, types.MethodType) or (owner is not None and not isinstance(owner, types.ModuleType)):
        roots["self"] = owner
    elif not isinstance(fn, (types.FunctionType, types.BuiltinFunctionType, type)):
        roots["self"] = fn          # a module or any object with __call__
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is not None and cells:
        for name, cell in zip(code.co_freevars, cells):
            try:
                roots[name] = cell.cell_contents
            except ValueError:   # an empty cell
                pass
    return roots


# What the walk does with an object depends on its type only: classified once per type (`isinstance` on an
# object whose class overrides `__getattribute__`, as transformers' configs do, calls it for `__class__`).
_TENSOR, _HOST, _NONE, _OPAQUE, _MODULE, _DATACLASS, _DICT, _SEQUENCE, _OBJECT = range(9)
_KINDS: dict[type, int] = {}
_FIELDS: dict[type, tuple[str, ...]] = {}


def _classify(tp: type) -> int:
    if issubclass(tp, torch.Tensor):
        return _TENSOR
    if issubclass(tp, HOST_TYPES):
        return _HOST
    if tp is type(None):
        return _NONE
    # NOTE: enum members are shared singletons: host values themselves, never written into.
    if issubclass(tp, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, type, types.ModuleType,
                       bytes, torch.dtype, torch.device)):
        return _OPAQUE
    module = tp.__module__ or ""
    # NOTE: the benchmark's workload lives in parity.audit but is user code to the audit.
    if module.startswith(_OPAQUE_MODULES) and module != "parity.audit.bench":
        return _OPAQUE
    if issubclass(tp, torch.nn.Module):
        return _MODULE
    if dataclasses.is_dataclass(tp):
        _FIELDS[tp] = tuple(f.name for f in dataclasses.fields(tp))
        return _DATACLASS
    if issubclass(tp, dict):
        return _DICT
    if issubclass(tp, (list, tuple)):
        return _SEQUENCE
    return _OBJECT


def _kind(obj) -> int:
    tp = type(obj)
    kind = _KINDS.get(tp)
    if kind is None:
        kind = _KINDS[tp] = _classify(tp)
    return kind


def _children(obj, kind: int):
    """(kind, key, child) for every walkable child of `obj`."""
    if kind == _MODULE:
        yield from ((ATTR, name, p) for name, p in obj._parameters.items())
        yield from ((ATTR, name, b) for name, b in obj._buffers.items())
        yield from ((ATTR, name, m) for name, m in obj._modules.items())
        yield from ((ATTR, name, value) for name, value in vars(obj).items() if not name.startswith("_"))
    elif kind == _DATACLASS:
        yield from ((ATTR, name, getattr(obj, name, None)) for name in _FIELDS[type(obj)])
    elif kind == _DICT:
        yield from ((ITEM, key, obj[key]) for key in list(obj)[:MAX_ITEMS] if isinstance(key, (str, int)))
    elif kind == _SEQUENCE:
        yield from ((ITEM, i, value) for i, value in enumerate(obj[:MAX_ITEMS]))
    elif kind == _OBJECT and hasattr(obj, "__dict__"):
        yield from ((ATTR, name, value) for name, value in vars(obj).items())


def walk(roots: dict, max_depth: int = MAX_DEPTH, absent: bool = False):
    """Yield (path, value) for every tensor and host value reachable from `roots`, shortest paths first;
    with `absent`, every attribute or item that holds None too (an input missing, which a graph can bake)."""
    visits: dict[int, int] = {}
    # (root, steps, object, identities of the objects above it): a `Path` is made only for what is yielded.
    frontier = [(name, (), obj, ()) for name, obj in roots.items()]
    nodes = 0
    while frontier and nodes < MAX_NODES:
        next_frontier = []
        for root, steps, obj, above in frontier:
            nodes += 1
            kind = _kind(obj)
            if kind == _TENSOR or (steps and (kind == _HOST or (absent and kind == _NONE))):
                yield Path(root, steps), obj
                continue
            # NOTE: a back-reference (`self.runner.engine` is `self`) is no name: a path never passes
            # through an object twice, so each object is named from its shortest canonical path.
            if kind in (_NONE, _OPAQUE) or (kind == _HOST and isinstance(obj, (str, enum.Enum))) \
                    or visits.get(id(obj), 0) >= MAX_VISITS or len(steps) >= max_depth or id(obj) in above:
                continue
            visits[id(obj)] = visits.get(id(obj), 0) + 1
            below = above + (id(obj),)
            next_frontier += [(root, steps + ((step, key),), child, below)
                              for step, key, child in _children(obj, kind)]
        frontier = next_frontier


_MISSING = object()


def resolve(path: Path, roots: dict):
    """The value at `path` among `roots` now; `MISSING` when the path no longer leads anywhere."""
    obj = roots.get(path.root, _MISSING)
    for kind, key in path.steps:
        if obj is _MISSING:
            return _MISSING
        try:
            obj = getattr(obj, key) if kind == ATTR else obj[key]
        except (AttributeError, KeyError, IndexError, TypeError):
            return _MISSING
    return obj


MISSING = _MISSING


def chain_of(path: Path, roots: dict) -> tuple:
    """Identities of the objects a path passes through (after the root, before the leaf)."""
    return tuple(id(resolve(Path(path.root, path.steps[:i]), roots)) for i in range(1, len(path.steps)))


def assign(path: Path, roots: dict, value) -> bool:
    """Set the value at `path` (attributes, dict and list items; MISSING: take it away, as it was absent); False
    when it cannot be set."""
    if not path.steps:
        return False
    parent = resolve(Path(path.root, path.steps[:-1]), roots)
    kind, key = path.steps[-1]
    try:
        if kind == ATTR:
            if value is MISSING:
                delattr(parent, key)
            else:
                setattr(parent, key, value)
        elif isinstance(parent, dict) and value is MISSING:
            parent.pop(key, None)
        elif isinstance(parent, (dict, list)) and value is not MISSING:
            parent[key] = value
        else:
            return False
    except (AttributeError, TypeError, dataclasses.FrozenInstanceError):
        return False
    return True
