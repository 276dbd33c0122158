"""Host state: the Python values an owner object reaches, snapshotted around a forward.

A captured graph replays kernels, never the Python around them. A forward
that advances host state itself (`self.calls += 1`, `self.rng_offset += n`, a
step index kept on the object) moves it in eager code at every call, at
capture once, and never at replay: every replay reads what its capture read,
and the counter stops. Only a snapshot of the host values around the forward
shows that the forward itself moved one.

The values are the bools, ints, floats, strings and enums the owner object
reaches through its attributes (`roles.walk`, as the capture manifest names
tensors), and its small tuples of them as one value each, keyed by their
attribute path.
"""

from __future__ import annotations

from parity.graphs.manifest import OBJECT_DEPTH, OBJECT_ROOT, role_name
from parity.graphs.roles import HOST_TYPES, ITEM, MISSING, Path, assign, resolve, walk

MAX_TUPLE = 16      # a longer tuple is data, not state


def host_values(holder) -> dict[Path, object]:
    """Every host value `holder` reaches through its attributes, by path (shortest paths first)."""
    return values_of({OBJECT_ROOT: holder}) if holder is not None else {}


def values_of(roots: dict) -> dict[Path, object]:
    """Every host value reachable from `roots` ({name: object}), by path (shortest paths first)."""
    values, parents = {}, {}
    for path, value in walk(roots, max_depth=OBJECT_DEPTH):
        if not isinstance(value, HOST_TYPES):
            continue
        if path.steps[-1][0] == ITEM:
            # NOTE: a tuple cannot be written item by item: it is one value, set by its holder. Its items come
            # one after another: the holder is resolved once (through a model config's slow getattr).
            parent_path = Path(path.root, path.steps[:-1])
            parent = parents.get(parent_path, MISSING)
            if parent is MISSING:
                parent = parents[parent_path] = resolve(parent_path, roots)
            if isinstance(parent, tuple):
                if len(parent) <= MAX_TUPLE and all(isinstance(v, HOST_TYPES) for v in parent):
                    values[parent_path] = parent
                continue
        values[path] = value
    return values


def moved(before: dict, holder) -> dict[Path, tuple]:
    """{path: (before, now)} for each host value of `before` that `holder` now holds another value at."""
    return moved_in(before, {OBJECT_ROOT: holder})


def added_in(before: dict, roots: dict) -> dict[Path, object]:
    """{path: now} for each host value held among `roots` now at a path `before` lacks, on an object that held
    host values then: an attribute made since (a counter started lazily, `getattr(self, "calls", 0) + 1`)."""
    holders = {Path(path.root, path.steps[:-1]) for path in before}
    return {path: value for path, value in values_of(roots).items()
            if path not in before and Path(path.root, path.steps[:-1]) in holders}


def moved_in(before: dict, roots: dict) -> dict[Path, tuple]:
    """{path: (before, now)} for each host value of `before` now held at another value among `roots`, and each
    one made since (before: MISSING) (one entry per attribute: a value reached by several paths is named by the
    first)."""
    found, seen = {}, set()
    for path, old in {**before, **dict.fromkeys(added_in(before, roots), MISSING)}.items():
        now = resolve(path, roots)
        if now is MISSING or same(old, now):
            continue
        parent = resolve(Path(path.root, path.steps[:-1]), roots)
        key = (id(parent), path.steps[-1])
        if key not in seen:
            seen.add(key)
            found[path] = (old, now)
    return found


def restore(before: dict, holder) -> None:
    """Put back every host value of `before` that `holder` now holds another value at."""
    restore_in(before, {OBJECT_ROOT: holder})


def restore_in(before: dict, roots: dict) -> None:
    """Put back every host value of `before` now held at another value among `roots`; take away each made since."""
    for path, old in before.items():
        now = resolve(path, roots)
        if now is not MISSING and not same(old, now):
            assign(path, roots, old)
    for path in added_in(before, roots):
        assign(path, roots, MISSING)


def put(holder, path: Path, value) -> bool:
    """Set the host value at `path` on `holder`; False when it cannot be set (a frozen dataclass, a property)."""
    return assign(path, {OBJECT_ROOT: holder}, value)


def name(path: Path) -> str:
    """An attribute path from the owner object, as a role: `rng_offset`, `sampler.step`."""
    return role_name(path)


def same(a, b) -> bool:
    """Equal host values of one type (NaN equals NaN)."""
    return type(a) is type(b) and (a == b or (a != a and b != b))


def short(value) -> str:
    """A host value as evidence prints it: its repr, cut at 40 characters."""
    text = "absent" if value is MISSING else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
