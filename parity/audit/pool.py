"""POOL_ALIAS: an audited graph's output changed by another audited graph's replay while still live.

After a checked replay the audit remembers a copy of the graph's outputs.
They stay live until the same callable runs again (any graph of its family:
the same function on the same object, at any batch size, whose newest
output replaces the old one, as an engine reads only the latest). After every
audited replay of another family the remembered outputs are compared with
their copies; one that changed was overwritten by that replay: its
temporaries were placed in the same pool memory (seed 004). To confirm, the
output is restored and the suspect graph replayed once more on its own: if
the output changes again, it is POOL_ALIAS.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch

from parity.audit.state import Snapshot, bit_equal


@dataclass
class _Live:
    audit: "weakref.ReferenceType"
    outputs: list[torch.Tensor]       # the graph's outputs (non-owning aliases)
    values: list[torch.Tensor]        # what they held after the replay


_LIVE: dict[object, _Live] = {}


def family_of(fn) -> object:
    """Graphs of one family replace each other's outputs: same function, same bound object."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    owner = getattr(fn, "__self__", None)
    func = getattr(fn, "__func__", fn)
    return (id(owner) if owner is not None else None, getattr(func, "__code__", None) or id(func))


def remember(audit, values: list[torch.Tensor]) -> None:
    """After a checked replay: these outputs are live until the family replays again."""
    _LIVE[audit.family] = _Live(weakref.ref(audit), list(audit.record.outputs), values)


def forget(audit) -> None:
    """Before any replay of `audit`'s family: its earlier outputs are no longer read."""
    _LIVE.pop(audit.family, None)


def _changed(live: _Live) -> str | None:
    for name, out, value in zip(live.audit().record.output_names, live.outputs, live.values):
        if not bit_equal(out, value):
            return name
    return None


def after_replay(culprit) -> None:
    """Report, to their audits, live outputs of other families that `culprit`'s replay just overwrote."""
    found = []
    for family, live in list(_LIVE.items()):
        victim = live.audit()
        if victim is None:
            del _LIVE[family]
            continue
        if family == culprit.family or (name := _changed(live)) is None:
            continue
        del _LIVE[family]
        again = _overwrites_again(culprit, live)
        evidence = [f"output {name} of graph {victim.name!r} matched its replay, then changed during the replay "
                    f"of graph {culprit.name!r}, before {victim.name!r} ran again"]
        if again:
            evidence.append(f"restoring it and replaying {culprit.name!r} alone overwrites it again: the two graphs "
                            f"share pool memory; whatever reads {name} after that replay reads the other graph's data")
        else:
            evidence.append(f"replaying {culprit.name!r} alone on restored outputs did not overwrite them again")
        index = live.audit().record.output_names.index(name)
        found.append((victim, victim._diagnosis(
            "POOL_ALIAS" if again else "UNEXPLAINED", [name], captured_address=live.outputs[index].data_ptr(),
            evidence=evidence, replays=1,
            experiment=f"restore the outputs of {victim.name!r}, replay {culprit.name!r} alone" if again else None,
            ruled_out=[] if again else [f"replay {culprit.name!r} alone on restored outputs"])))
    for victim, diagnosis in found:
        victim._report(diagnosis)


def _overwrites_again(culprit, live: _Live) -> bool:
    keep = Snapshot(culprit.record.writes.values())
    for out, value in zip(live.outputs, live.values):
        out.copy_(value)
    culprit._raw_replay()
    culprit.backend.sync()
    again = any(not bit_equal(out, value) for out, value in zip(live.outputs, live.values))
    keep.restore()
    return again
