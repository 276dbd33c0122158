"""The audit's repairs, and the record of one experiment.

- `copy_repairs`: for each role a path now reaches with another tensor than at
  capture (`cheap.Rebind`), copy the live tensor into the captured one the
  graph reads and replay the same graph: the repairs `ShadowLab.repairs()`
  hands `repairs.stage`, which the harness runs on its own. Restores parity
  when that buffer was stale (its storage is still the engine's persistent
  buffer: STALE_BUFFER) or reassigned (nothing reaches its storage any more:
  BUFFER_REASSIGNED).
- `Experiment`: what one experiment changed and whether it restored bitwise
  parity (the re-captures of `recaptures.py`, the padding poison of
  `padding.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.audit.cheap import Rebind, moved_names, rank
from parity.audit.repairs import Repair
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
