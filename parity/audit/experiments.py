"""One-variable experiments: change exactly one thing, replay, and see whether bitwise parity comes back.

Every experiment starts from the state the audited replay started from (the
`Lab` restores it), makes its one change, replays, compares with the eager
shadow run's result, and undoes its change:
- copy: copy the live tensor a moved role reaches into the captured tensor the
  graph reads, replay the same graph (a `repairs.Repair`, run by
  `repairs.attempt`, as the harness's repairs are). Restores parity when that
  buffer was stale (its storage is still the engine's persistent buffer) or
  reassigned (nothing reaches its storage any more).
- host: re-capture the callable with every host value as it was at capture
  except one at its live value, replay the new graph (`recaptures.py`, the
  re-capture experiments both labs run). A control re-capture with all of them
  as captured must still differ, or host values cannot be the cause (then a
  re-capture restoring parity means the graph baked some other capture-time
  context).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from parity.audit.cheap import Rebind, moved_names, rank
from parity.audit.repairs import Repair, attempt
from parity.audit.state import bit_equal


@dataclass
class Experiment:
    kind: str
    description: str
    buffers: list[str]
    restores: bool
    captured_address: int | None = None
    live_address: int | None = None
    evidence: list[str] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    max_abs_diff: float | None = None


def copy_repair(rebind: Rebind, found: list[Rebind]) -> Repair | None:
    """The repair copying the live value of one moved role into the captured tensor (a redirect: what the graph
    writes there is seen where eager writes); None when the shapes differ."""
    role, captured, live = rebind.role, rebind.role.tensor, rebind.live_tensor
    if live is None or tuple(live.shape) != tuple(captured.shape) or live.dtype != captured.dtype:
        return None
    at = rebind.live_address     # the engine's tensor (`live` may be its stand-in at the graph's shape)
    # NOTE: a buffer the graph writes is compared where eager writes it, so even equal values are replayed.
    futile = bit_equal(captured, live) and not role.written
    suffix = " (already equal: ruled out without a replay)" if futile else (
        ", its writes compared where eager writes (the graph writes it)" if role.written else "")
    if rebind.owned:
        keeper = rebind.keeper
        return Repair("STALE_BUFFER", keeper.name, "captured buffer", f"copy the live {role.name} (0x{at:x}) into "
                      f"the captured buffer {keeper.name} (0x{role.address:x}) and replay{suffix}", captured,
                      slice(None), live, role.address, at, f"the graph reads {keeper.name} at 0x{role.address:x}; "
                      f"the eager run reads {role.name} at 0x{at:x}, with other values: {keeper.name} was not "
                      "refreshed before the replay", live, futile=futile)
    names = moved_names(found, role.storage)
    return Repair("BUFFER_REASSIGNED", names[0], "captured storage", f"copy the live {role.name} (0x{at:x}) into "
                  f"the captured storage (0x{role.address:x}) and replay{suffix}", captured, slice(None), live,
                  role.address, at, rebind.describe() + ": it was rebound to a new tensor; nothing but the graph "
                  "reads the captured one", live, names, futile)


def copy_repairs(rebinds: list[Rebind]) -> tuple[list[Repair], list[str]]:
    """One copy per moved role (its captured storage, address and live value), where the rebinding happened
    first; notes for the roles no tensor of the captured shape and dtype reaches now."""
    found, notes, seen = [], [], set()
    for rebind in sorted(rebinds, key=rank):
        key = (rebind.role.storage, rebind.role.address, id(rebind.live))
        if key in seen:
            continue
        seen.add(key)
        repair = copy_repair(rebind, rebinds)
        if repair is None:
            notes.append(f"not copied (no tensor of the captured shape and dtype): {rebind.describe()}")
        else:
            found.append(repair)
    return found, notes


def copy_experiment(lab, repair: Repair) -> Experiment:
    """The copy alone, from the pre-replay state."""
    return Experiment(repair.kind, repair.experiment, repair.buffers, attempt(lab, [repair]), repair.captured,
                      repair.live, [repair.note])


def group_copy_experiment(lab, rebinds: list[Rebind]) -> Experiment | None:
    """All copies at once: the fallback when no single one restores parity."""
    usable = [(r, copy_repair(r, rebinds)) for r in rebinds]
    usable = [(r, repair) for r, repair in usable if repair is not None]
    if len(usable) < 2:
        return None
    restores = attempt(lab, [dataclasses.replace(repair, futile=False) for _, repair in usable])
    kind = "BUFFER_REASSIGNED" if any(not r.owned for r, _ in usable) else "STALE_BUFFER"
    names = sorted({(r.keeper or r.role).name for r, _ in usable})
    return Experiment(kind, f"copy the live values of all {len(usable)} moved roles into the captured buffers and "
                      "replay", names, restores)
