"""Where the engine keeps a graph: the name an auto-audited graph is reported under.

A graph is named by the object attribute that holds it, through containers:
`Engine.decode[4]`, `SpecEngine.graphs[('draft', 4)]`. A graph wrapper keyed
by a batch descriptor (vLLM's CUDAGraphWrapper) keeps each graph in an entry
object, one per key, in a dict of its own; the entry's attribute
(`CUDAGraphEntry.cudagraph`) says nothing about which graph it is. So an
object that holds the graph directly and is itself a value of a dict some
object owns is taken as that dict's entry: the graph is named by where the
dict's owner (the wrapper) is kept, and the key, shown by the fields that
tell the dict's keys apart: `Model.pieces[1][num_tokens=4]`,
`GraphModule.submod_1[num_tokens=8]`.
"""

from __future__ import annotations

import dataclasses
import gc
import types
import weakref

MAX_HOPS = 5
# The object whose __dict__ a dict is, by the dict's id, as a weak reference: found once by a scan of the whole heap
# (`gc.get_referrers`, 80 ms with torch and transformers loaded), then checked (`owner.__dict__ is d`) at every use.
# The graphs of one engine sit in the same few dicts: naming each one after the first scans the heap twice, not eight
# times.
_OWNERS: dict[int, weakref.ref] = {}
_MAX_OWNERS = 4096


def _owner_of(d: dict):
    """The object whose __dict__ `d` is, or None (at once for a dict keyed by anything but strings: attribute names
    are strings, so no object's __dict__ holds graphs by batch size or descriptor)."""
    if not all(isinstance(key, str) for key in d):
        return None
    ref = _OWNERS.get(id(d))
    owner = ref() if ref is not None else None
    if owner is not None and getattr(owner, "__dict__", None) is d:
        return owner
    owner = next((o for o in gc.get_referrers(d) if getattr(o, "__dict__", None) is d), None)
    if owner is not None:
        if len(_OWNERS) >= _MAX_OWNERS:
            _OWNERS.clear()
        try:
            _OWNERS[id(d)] = weakref.ref(owner)
        except TypeError:       # an object without weak references: found again next time
            pass
    return owner


def _holders(obj):
    """(holder, step, kind) for each container or object attribute holding `obj`: kind "object" (an
    attribute of an object: a name to stop at), "tuple" (a position beside other values) or "item"."""
    return _held_by(obj, gc.get_referrers(obj))


def _held_by(obj, refs):
    """`_holders(obj)` among `refs`, the objects that refer to it (and maybe to others)."""
    for ref in refs:
        if isinstance(ref, (tuple, list)):
            kind = "tuple" if isinstance(ref, tuple) else "item"
            yield from ((ref, f"[{i}]", kind) for i, x in enumerate(ref) if x is obj)
        elif isinstance(ref, dict):
            keys = [k for k, v in ref.items() if v is obj][:1]
            owner = _owner_of(ref) if keys else None
            for key in keys:
                if owner is not None:
                    yield owner, f".{key}", "object"
                elif not (isinstance(key, str) and key.startswith("_")):
                    yield ref, f"[{key!r}]", "item"
        elif hasattr(ref, "__dict__") and not isinstance(ref, (types.FunctionType, types.ModuleType, type)):
            yield from ((ref, f".{k}", "object") for k, v in list(vars(ref).items()) if v is obj)


def _nearest(obj) -> tuple[object, str, int] | None:
    """(the object whose attribute holds `obj`, the path from it, hops) within a few containers; None if none.
    A position in a tuple beside `obj` is dropped."""
    frontier = [(obj, ())]
    for hops in range(1, MAX_HOPS + 1):
        found = []
        refs = gc.get_referrers(*(held for held, _ in frontier))     # one scan of the heap for the whole hop
        for held, steps in frontier:
            for holder, step, kind in _held_by(held, refs):
                path = ((step, kind),) + steps
                if kind == "object":
                    while path and path[-1][1] == "tuple":
                        path = path[:-1]
                    return holder, "".join(s for s, _ in path), hops
                found.append((holder, path))
        frontier = found[:16]
    return None


def _fields(key) -> dict | None:
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        return {f.name: getattr(key, f.name) for f in dataclasses.fields(key)}
    if isinstance(key, tuple) and hasattr(key, "_fields"):
        return dict(zip(key._fields, key))
    return None


def key_text(key, keys) -> str:
    """A dict key as it tells its dict's keys apart: a descriptor by the fields that differ among them."""
    fields = _fields(key)
    if fields is None:
        return repr(key)
    others = [f for f in map(_fields, keys) if f is not None and f.keys() == fields.keys()]
    varying = [name for name in fields if len({repr(f[name]) for f in others}) > 1] or list(fields)
    return ", ".join(f"{name}={fields[name]!r}" for name in varying)


def _entry_of(entry) -> tuple[object, str] | None:
    """(the object owning a dict that holds `entry` as a value, the key's text), or None."""
    for ref in gc.get_referrers(entry):
        if not isinstance(ref, dict) or _owner_of(ref) is not None:
            continue
        key = next((k for k, v in ref.items() if v is entry), None)
        owner = next((o for o, _, kind in _holders(ref) if kind == "object"), None)
        if key is not None and owner is not None:
            return owner, key_text(key, list(ref))
    return None


def located(graph) -> str | None:
    """Where the engine keeps `graph` (see the module docstring); None if no object attribute holds it."""
    found = _nearest(graph)
    if found is None:
        return None
    holder, path, hops = found
    entry = _entry_of(holder) if hops == 1 else None
    if entry is not None:
        owner, key = entry
        where = _nearest(owner)
        if where is not None:
            return f"{type(where[0]).__name__}{where[1]}[{key}]"
    return type(holder).__name__ + path
