"""POOL_ALIAS: an audited graph's output changed by another audited graph's replay while still live.

After a checked replay the audit remembers a copy of the graph's outputs.
They stay live until the same forward runs again: a graph of the same family
(the same function on the same object, at any batch size, whose newest output
replaces the old one, as an engine reads only the latest). Pieces of one
split forward are one family: a graph whose capture read another graph's
output continues that graph's forward (PIECEWISE: the piece after attention
reads the piece before's outputs), so the last piece's logits stay live until
the forward's first piece runs again, not until the last piece does.

Before every audited replay, remembered outputs of other families that
changed since were changed by the engine's own eager code (attention filling
its output buffer in place between pieces): that is their value now. After
the replay, one that changed was overwritten by that replay: its temporaries
were placed in the same pool memory (seed 004). To confirm, the output is
restored and the suspect graph replayed once more on its own: if the output
changes again, the two graphs share pool memory. The confirmation leaves every
byte it touched as the real replay left it. Sharing a pool is no bug by
itself (an engine that copies an output into a buffer of its own inside the
capture never reads it after): the overwritten output is watched
(`lifetime.py`), and POOL_ALIAS is reported when the program reads it
before its graph replays again, and the read gives other values than on the
output as its replay left it.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch

from parity.audit.state import Snapshot, bit_equal, clone_outputs
from parity.audit.trace import byte_range


@dataclass
class _Live:
    audit: "weakref.ReferenceType"
    outputs: list[torch.Tensor]       # the graph's outputs (non-owning aliases)
    values: list[torch.Tensor]        # what they held after the replay, or after eager code last wrote them


_LIVE: dict[object, _Live] = {}
_SAME_FORWARD: dict[object, object] = {}     # family -> the family of the forward it continues
_PRODUCED: list[tuple["weakref.ReferenceType", list[tuple[int, int]]]] = []   # in capture order
_OVERWRITTEN: list[tuple] = []     # the last replay's overwrites of other forwards' live outputs (`overwritten`)


def family_of(fn) -> object:
    """Graphs of one family replace each other's outputs: same function, same bound object."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    owner = getattr(fn, "__self__", None)
    func = getattr(fn, "__func__", fn)
    return (id(owner) if owner is not None else None, getattr(func, "__code__", None) or id(func))


def forward_of(audit) -> object:
    """The family of the forward `audit`'s graph belongs to (its own, unless it continues another's)."""
    family = audit.family
    while family in _SAME_FORWARD:
        family = _SAME_FORWARD[family]
    return family


def _overlaps(spans, start: int, end: int) -> bool:
    return any(s < end and start < e for s, e in spans)


def inputs_overwritten(record) -> list:
    """The inputs (roles) whose bytes the capture handed out as its own memory: read from memory that was
    free in the pool at capture (its producer held it only weakly), so every replay's temporaries overwrite what
    the graph reads (a split forward whose every piece's output is held weakly)."""
    return [role for role in record.roles
            if role.tensor.numel() and _overlaps(record.produced, *byte_range(role.tensor))]


def link(audit) -> None:
    """At capture: a graph reading the memory another graph's capture produced continues that graph's forward."""
    global _PRODUCED
    _PRODUCED = [(ref, spans) for ref, spans in _PRODUCED if ref() is not None]
    record = audit.record
    reads = [byte_range(r.tensor) for r in record.roles] + [byte_range(t) for t in record.unnamed]
    # NOTE: pool memory is handed out again once freed: the newest capture producing it is its producer.
    for ref, spans in reversed(_PRODUCED):
        producer = ref()
        if producer is not audit and any(_overlaps(spans, *r) for r in reads):
            if forward_of(producer) != forward_of(audit):
                _SAME_FORWARD[forward_of(audit)] = forward_of(producer)
            break
    produced = [byte_range(record.outputs[i]) for i in produced_outputs(record)]
    _PRODUCED.append((weakref.ref(audit), produced))


def produced_outputs(record) -> list[int]:
    """The indexes of the outputs the capture produced (pool memory): none of the callable's inputs, reads or
    in-place writes. Called eagerly, the callable returns them fresh every call."""
    external = ([byte_range(r.tensor) for r in record.roles] + [byte_range(t) for t in record.unnamed]
                + [byte_range(t) for t in record.writes.values()])
    return [i for i, t in enumerate(record.outputs) if t.numel() and not _overlaps(external, *byte_range(t))]


def graph_produced(t: torch.Tensor) -> bool:
    """Memory an audited graph's capture produced (a piece's output another piece reads): its replays write it."""
    start, end = byte_range(t)
    return any(_overlaps(spans, start, end) for ref, spans in _PRODUCED if ref() is not None)


def remember(audit, values: list[torch.Tensor]) -> None:
    """After a checked replay: these outputs are live until the forward runs again."""
    _LIVE[forward_of(audit)] = _Live(weakref.ref(audit), list(audit.record.outputs), values)


def before_replay(audit) -> None:
    """Before a replay of `audit`: its forward's earlier outputs are no longer read; others' eager writes stand."""
    _LIVE.pop(forward_of(audit), None)
    for family, live in list(_LIVE.items()):
        if live.audit() is None:
            del _LIVE[family]
        elif _changed(live) is not None:
            live.values = clone_outputs(live.outputs)


def live_outputs() -> list[torch.Tensor]:
    """Every output some audited graph's forward still holds live."""
    return [t for live in _LIVE.values() if live.audit() is not None for t in live.outputs]


def _changed(live: _Live) -> str | None:
    for name, out, value in zip(live.audit().record.output_names, live.outputs, live.values):
        if not bit_equal(out, value):
            return name
    return None


def after_replay(culprit) -> None:
    """Live outputs of other forwards that `culprit`'s replay just overwrote: each is handed to the read watcher
    (`overwritten`, `lifetime.after_replay`) and reported, to its audit, only when the program reads it before its
    own graph replays again."""
    for family, live in list(_LIVE.items()):
        victim = live.audit()
        if victim is None:
            del _LIVE[family]
            continue
        if family == forward_of(culprit) or (name := _changed(live)) is None:
            continue
        del _LIVE[family]
        again = _overwrites_again(culprit, live)
        evidence = [f"output {name} of graph {victim.name!r} matched its replay, then changed during the replay "
                    f"of graph {culprit.name!r}, before {victim.name!r}'s forward ran again"]
        if again:
            evidence.append(f"restoring it and replaying {culprit.name!r} alone overwrites it again: the two graphs "
                            f"share pool memory; whatever reads {name} after that replay reads the other graph's data")
        else:
            evidence.append(f"replaying {culprit.name!r} alone on restored outputs did not overwrite them again")
        index = victim.record.output_names.index(name)
        found = dict(kind="POOL_ALIAS" if again else "UNEXPLAINED", buffers=[name],
                     captured_address=live.outputs[index].data_ptr(), evidence=evidence, replays=1,
                     experiment=f"restore the outputs of {victim.name!r}, replay {culprit.name!r} alone"
                     if again else None,
                     ruled_out=[] if again else [f"replay {culprit.name!r} alone on restored outputs"])
        _OVERWRITTEN.append((victim, index, live.values[index], culprit.name, found))


def overwritten() -> list[tuple]:
    """(audit, output index, its value as its replay left it, the culprit's name, the finding) of every output the
    last replay overwrote, handed over once: `lifetime.after_replay` watches each for the program's read."""
    found = list(_OVERWRITTEN)
    _OVERWRITTEN.clear()
    return found


def _overwrites_again(culprit, live: _Live) -> bool:
    def replay():
        culprit._raw_replay()
        culprit.backend.sync()
    return overwrites_again(live.outputs, live.values, replay, [*culprit.record.writes.values(),
                                                                *culprit.record.outputs])


def overwrites_again(outputs: list[torch.Tensor], values: list[torch.Tensor], replay, keep=()) -> bool:
    """The confirmation of a POOL_ALIAS (the audit's, and the bisector's, `diagnose/pool.py`): put `outputs` back
    to `values`, `replay()` the suspect graph alone: does it overwrite them again? Every byte of `keep` and of
    the outputs is put back after."""
    saved = Snapshot([*keep, *outputs])
    try:
        for out, value in zip(outputs, values):
            out.copy_(value)
        replay()
        return any(not bit_equal(out, value) for out, value in zip(outputs, values))
    finally:
        saved.restore()
