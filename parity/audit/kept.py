"""OUTPUT_ALIASED by a graph's own next replay: a view of its output taken after one replay, read after the next.

Called eagerly, the audited callable returns a fresh tensor every call, so a
view the program takes of one call's output keeps that call's values. Under
the graph, every replay writes its outputs again where the last one did, and
a view kept from an earlier replay reads the newest values instead (SGLang
#15399's logits read a step late; a runner returning `out[:n]` of the graph's
own buffer and keeping it). Only outputs the capture produced (pool memory,
`pool.produced_outputs`) are watched: an output that is an input or a buffer
the callable writes in place is the same tensor eagerly too.

- Lineage: while the watcher of `lifetime.py` is on (between replays, outside
  the audit), a view op whose input lies in such an output, or is a view
  already tagged, tags its output with the graph, the output and the graph's
  replay clock then (`tag`). The output tensor itself, which the program may
  hold from capture on, is never tagged: reading it is reading the newest.
- At a checked replay of a graph that has views of its current outputs alive,
  the outputs are saved as they are; after the replay the copy is dropped if
  the replay left them unchanged (`before_replay`, `after_replay`).
- A read of a view tagged before the graph's last replay, whose replay's
  values are saved, is confirmed by the same op on those values
  (`lifetime._confirm`): OUTPUT_ALIASED naming the output.

One copy per graph (its replay before the last): a view kept across two or
more replays is seen when read only if its own replay is that one, and an
output the program holds by plain reference across replays is not seen.
"""

from __future__ import annotations

import weakref

import torch

from parity.audit.pool import produced_outputs
from parity.audit.trace import byte_range

_TAGS: dict[int, tuple] = {}      # id(view) -> (view ref, audit ref, output index, the audit's replay clock then)
_SAVED: dict[int, tuple] = {}     # id(audit) -> (audit ref, replay clock, its outputs as that replay left them)
_WATCHED: list[tuple] = []        # (start, end, audit ref, index) of each produced output: a graph's stay put


def watch(audit) -> None:
    """At capture: views of `audit`'s produced outputs are tagged from its first replay on."""
    _WATCHED[:] = [w for w in _WATCHED if w[2]() is not None and w[2]() is not audit]
    ref = weakref.ref(audit)
    _WATCHED.extend((*byte_range(audit.record.outputs[i]), ref, i) for i in produced_outputs(audit.record))


def wanted() -> bool:
    """Whether the watcher must see the program's view ops (some audited graph's outputs are watched)."""
    return any(w[2]() is not None for w in _WATCHED)


def saved() -> bool:
    """Whether some live graph's earlier outputs are saved (an audit that died takes its copy with it)."""
    for key in [k for k, entry in _SAVED.items() if entry[0]() is None]:
        del _SAVED[key]
    return bool(_SAVED)


def tag(args, out) -> None:
    """A view op ran on `args`: its outputs inherit the tag of its input, or get one if the input lies in a
    watched output."""
    base = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if base is None or not base.numel():
        return
    found = _tag_of(base) or _current(base)
    if found is None:
        return
    audit_ref, index, clock = found
    for t in out if isinstance(out, (list, tuple)) else (out,):
        if isinstance(t, torch.Tensor):
            key = id(t)
            _TAGS[key] = (weakref.ref(t, lambda _, key=key: _TAGS.pop(key, None)), audit_ref, index, clock)


def before_replay(audit, checked: bool) -> None:
    """Before a replay of `audit`: on a checked one, its outputs are saved when views of them are alive."""
    if not checked:
        return
    clock = audit.replayed_at
    if any(ref() is audit and at == clock and view() is not None for view, ref, _, at in list(_TAGS.values())):
        _SAVED[id(audit)] = (weakref.ref(audit), clock, [t.clone() for t in audit.record.outputs])


def after_replay(audit, clock_before: int) -> None:
    """After a replay of `audit`: a copy its replay left unchanged is dropped (nothing to read wrongly)."""
    entry = _SAVED.get(id(audit))
    if entry is not None and entry[1] == clock_before and all(
            torch.equal(a, b) for a, b in zip(audit.record.outputs, entry[2])):
        del _SAVED[id(audit)]


def stale(reads) -> tuple | None:
    """(audit, output index, its saved values, the view) for the first of `reads` tagged before its graph's last
    replay and whose replay's values are saved; the view's tag is dropped (it is confirmed once)."""
    for t in reads:
        entry = _TAGS.get(id(t))
        if entry is None or entry[0]() is not t:
            continue
        audit = entry[1]()
        saved_entry = _SAVED.get(id(audit)) if audit is not None else None
        if saved_entry is None or saved_entry[0]() is not audit or audit.replayed_at <= entry[3] \
                or saved_entry[1] != entry[3]:
            continue
        del _TAGS[id(t)]
        return audit, entry[2], saved_entry[2][entry[2]], t
    return None


def stop() -> None:
    """Forget every tag and copy (end of an auto_audit scope)."""
    _TAGS.clear()
    _SAVED.clear()


def _tag_of(t: torch.Tensor) -> tuple | None:
    entry = _TAGS.get(id(t))
    return entry[1:] if entry is not None and entry[0]() is t else None


def _current(t: torch.Tensor) -> tuple | None:
    """(audit ref, index, its replay clock) of the watched output whose bytes hold all of `t`'s."""
    start, end = byte_range(t)
    for o0, o1, ref, i in _WATCHED:
        if o0 <= start and end <= o1:
            audit = ref()
            if audit is not None and audit.replayed_at:
                return ref, i, audit.replayed_at
    return None
