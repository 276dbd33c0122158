"""Repairs: the one-variable experiments that change what a graph reads, on any `Lab`, and the stage naming them.

A lab lists its repairs (`lab.repairs()`, the captured reads against the live
reads): each writes one value into a tensor the graph read, and names what
that would mean:
- redirect (the live holder now reaches another tensor): the live tensor's
  values go into the captured one, and what the graph writes there is seen at
  the live one (`lab.run(redirect=...)`): reads and writes both follow the
  live holder. BUFFER_REASSIGNED, or CAPTURE_CONTEXT for a tensor only the
  capture-time context held;
- refresh (every holder still reaches the captured tensor, its values are
  wrong): the reference's values, or the live holder's: STALE_BUFFER;
- inert padding (a padded entry off its pad value): PADDING_LEAK.
`units` groups them into variables (`Unit`: what this process applies, and how
it is told, the same in every process of a tensor-parallel run): each repair
alone, but those a lab gives one `variable` (every read of a capture-time
context, every tensor of one cache) as one.

`stage(lab)`: all variables together must restore bitwise parity, then each
alone in order of specificity (the first that does is the cause, the others
that do are told in `also`), then delta debugging finds the smallest set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from parity.audit import ranks
from parity.audit.one_variable import search
from parity.audit.state import Snapshot
from parity.diagnosis.kinds import BUFFER_REASSIGNED, CAPTURE_CONTEXT, PADDING_LEAK, STALE_BUFFER
from parity.graphs.tp_agree import world

# The most specific first: a repair that names where the live values went beats one that only refreshes.
SPECIFICITY = (BUFFER_REASSIGNED, CAPTURE_CONTEXT, STALE_BUFFER, PADDING_LEAK)


@dataclass
class Repair:
    kind: str
    name: str                  # the role, by the lab's name for it
    holder: str                # who holds it ("registry", "metadata object", "kv cache object", an owner...)
    experiment: str            # what the repair does, in words
    tensor: torch.Tensor | None   # the captured tensor it writes (None: another process's, told only)
    region: slice | None
    value: torch.Tensor | None
    captured: int | None = None
    live: int | None = None
    note: str = ""
    live_tensor: torch.Tensor | None = None   # a redirect's live holder: gets what the graph wrote
    names: list = field(default_factory=list)  # every name of the role when it has several (default: `name`)
    futile: bool = False       # the write changes nothing: ruled out without running the forward
    variable: str = ""         # repairs of one variable are applied together (`units`); "": its own

    @property
    def buffers(self) -> list[str]:
        return list(self.names) or [self.name]


@dataclass
class Unit:
    """One variable: the repairs this process applies together, and how they are told (the same everywhere)."""
    applied: list
    told: list


def units(repairs: list[Repair]) -> list[Unit]:
    """The experiments' variables: each repair alone, then those of one `variable` together. Under TP, every
    rank's (`ranks.candidates`): a variable another rank found is a no-op here, told as that rank tells it."""
    keyed: dict[str, list[Repair]] = {}
    for r in repairs:
        if not r.variable:
            key = f"{r.kind} {r.name} ({r.holder})"
            n = sum(k.split(" #")[0] == key for k in keyed)   # one role, two holders' tensors: two variables
            keyed[f"{key} #{n}" if n else key] = [r]
    for r in repairs:
        if r.variable:
            keyed.setdefault(r.variable, []).append(r)
    if world() == 1:
        return [Unit(unit, unit) for unit in keyed.values()]
    found = ranks.candidates("experiments: repairs", keyed, lambda unit: [_account(r) for r in unit])
    return [Unit(c.local or [], [Repair(**{**a, "note": a["note"] + ranks.where(c, world())}) for a in c.described])
            for c in found]


def _account(r: Repair) -> dict:
    """A repair as another process is told it: no tensor."""
    return {"kind": r.kind, "name": r.name, "holder": r.holder, "experiment": r.experiment, "tensor": None,
            "region": None, "value": None, "captured": r.captured, "live": r.live, "note": r.note}


def attempt(lab, repairs: list[Repair]) -> bool:
    """From the lab's pre-state, apply `repairs`, run the forward and compare with the reference; every tensor a
    repair wrote is put back after (it may lie outside the lab's pre-state: a tensor only the graph holds)."""
    if repairs and all(r.futile for r in repairs):
        return False
    keep = Snapshot()

    def change():
        for r in repairs:
            keep.add(r.tensor)
        for r in repairs:
            r.tensor[r.region].copy_(r.value)
    redirect = [(r.tensor[r.region], r.live_tensor[r.region]) for r in repairs if r.live_tensor is not None]
    try:
        return lab.matches(lab.run(change, redirect=redirect))
    finally:
        keep.restore()


def stage(lab):
    """The repair that restores bitwise parity, named (`lab.diagnosis`); None (its repairs added to
    `lab.ruled_out`) when none does."""
    units = lab.repairs()
    culprits, others = confirm(lab, units)
    told = [r for unit in units for r in unit.told]
    if culprits:
        return explain(lab, culprits, others, told)
    lab.ruled_out += [r.experiment for r in told] or [
        "no tensor the reference reads differs from what the graph read"]
    return None


def confirm(lab, units: list[Unit]) -> tuple[list[Repair], list[Repair]]:
    """(culprits, others that alone also restore parity), as told; ([], []) when nothing restores it."""
    def restores(chosen) -> bool:
        chosen = [u for u in units if any(u is c for c in chosen)]    # applied in one order, whatever is asked
        return attempt(lab, [r for u in chosen for r in u.applied])

    found = search(sorted(units, key=lambda u: SPECIFICITY.index(u.told[0].kind)), restores, minimise=True,
                   together=True)
    if found.restoring:
        return found.restoring[0].told, [r for u in found.restoring[1:] for r in u.told]
    return [r for u in found.smallest for r in u.told], []


def explain(lab, culprits, others, tried):
    """Kind of the most specific culprit, every culprit's role, the experiment, what was ruled out."""
    culprits = sorted(culprits, key=lambda r: SPECIFICITY.index(r.kind))
    kind, first = culprits[0].kind, culprits[0]
    names = sorted({r.name for r in culprits})      # then a role's other names, after every role's own
    names += list(dict.fromkeys(name for r in culprits for name in r.buffers if name not in names))
    evidence = []
    for r in culprits:
        line = f"{r.kind.lower()}: {r.name} ({r.holder})"
        if r.captured is not None and r.live is not None and r.captured != r.live:
            line += f", captured {r.captured:#x}, live {r.live:#x}"
        evidence.append(line + (f": {r.note}" if r.note else ""))
    if kind == CAPTURE_CONTEXT:
        experiment = f"redirect every read of the capture-time metadata ({', '.join(names)}) to the live metadata"
    else:
        experiment = "; ".join(r.experiment for r in culprits) + (
            " (together: no single repair restores parity)" if len(culprits) > 1 else "")
    evidence.append(f"{experiment}: replaying restores bitwise parity with the reference")
    also = [f"{r.experiment} also restores parity ({r.kind}, less specific)" for r in others]
    chosen = {id(r) for r in culprits} | {id(r) for r in others}
    ruled_out = lab.ruled_out + [r.experiment for r in tried if id(r) not in chosen]
    return lab.diagnosis(kind, names, captured=first.captured, live=first.live, evidence=evidence,
                         experiment=experiment, ruled_out=ruled_out, also=also)
