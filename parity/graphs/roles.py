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


def _opaque(obj) -> bool:
    # NOTE: enum members are shared singletons: host values themselves, never written into.
    if isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, type, types.ModuleType,
                        str, bytes, torch.dtype, torch.device, enum.Enum)):
        return True
    module = type(obj).__module__ or ""
    # NOTE: the benchmark's workload lives in parity.audit but is user code to the audit.
    return module.startswith(_OPAQUE_MODULES) and module != "parity.audit.bench"


def _children(obj):
    """(kind, key, child) for every walkable child of `obj`."""
    if isinstance(obj, torch.nn.Module):
        for name, p in obj._parameters.items():
            yield ATTR, name, p
        for name, b in obj._buffers.items():
            yield ATTR, name, b
        for name, m in obj._modules.items():
            yield ATTR, name, m
        for name, value in vars(obj).items():
            if not name.startswith("_"):
                yield ATTR, name, value
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield ATTR, f.name, getattr(obj, f.name, None)
    elif isinstance(obj, dict):
        for key in list(obj)[:MAX_ITEMS]:
            if isinstance(key, (str, int)):
                yield ITEM, key, obj[key]
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj[:MAX_ITEMS]):
            yield ITEM, i, value
    elif hasattr(obj, "__dict__"):
        for name, value in vars(obj).items():
            yield ATTR, name, value


def walk(roots: dict, max_depth: int = MAX_DEPTH, absent: bool = False):
    """Yield (path, value) for every tensor and host value reachable from `roots`, shortest paths first;
    with `absent`, every attribute or item that holds None too (an input missing, which a graph can bake)."""
    visits: dict[int, int] = {}
    frontier = [(Path(name), obj, ()) for name, obj in roots.items()]
    nodes = 0
    while frontier and nodes < MAX_NODES:
        next_frontier = []
        for path, obj, above in frontier:
            nodes += 1
            if isinstance(obj, torch.Tensor):
                yield path, obj
                continue
            if (isinstance(obj, HOST_TYPES) or (absent and obj is None)) and path.steps:
                yield path, obj
                continue
            # NOTE: a back-reference (`self.runner.engine` is `self`) is no name: a path never passes
            # through an object twice, so each object is named from its shortest canonical path.
            if obj is None or _opaque(obj) or visits.get(id(obj), 0) >= MAX_VISITS or path.depth() >= max_depth \
                    or id(obj) in above:
                continue
            visits[id(obj)] = visits.get(id(obj), 0) + 1
            for kind, key, child in _children(obj):
                next_frontier.append((path.child(kind, key), child, above + (id(obj),)))
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
