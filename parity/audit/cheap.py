"""Checks that need no shadow run: rebound static inputs, static inputs never refreshed.

Every replay re-resolves each role's path on the live objects. A path that now
reaches another storage is a *rebinding*. What it means depends on whether the
captured storage is still someone's: when another role still reaches it (the
engine keeps the persistent buffer and builds fresh per-step tensors that it
copies in, as nano-vllm and vLLM do), the moved path is where the live value
comes from, which the shadow check compares; so it is when a live path no role
of the capture names reaches it (a registry the engine builds after its
capture loop); when nothing reaches it any more, the graph reads memory nobody
refreshes: BUFFER_REASSIGNED, at once.

Version counters tell whether a declared static input (in `static_inputs`, or
a tensor argument) was written at all since capture: one never written while
the graph replayed N times is NOT_REFRESHED (a warning: it may be constant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.audit import pool
from parity.audit.record import CaptureRecord, Role
from parity.graphs.roles import MISSING, chain_of, resolve, walk
from parity.audit.trace import storage_ptr


@dataclass(frozen=True)
class Reached:
    """A live path to a captured storage that no role of the capture names: a root that appeared after the
    capture (a static input whose getter had nothing then, as nano-vllm's `graph_vars`, built after its loop)."""
    name: str


@dataclass
class Rebind:
    role: Role
    live: object          # what the path reaches now: a tensor, another value or MISSING
    keeper: Role | Reached | None   # what still reaches the captured storage (the persistent buffer), if any
    at_leaf: bool = True  # the path's objects are the captured ones: its last attribute/item itself was rebound
    real: torch.Tensor | None = None   # the engine's smaller tensor when `live` is its stand-in at the graph's shape

    @property
    def owned(self) -> bool:
        return self.keeper is not None

    @property
    def live_tensor(self) -> torch.Tensor | None:
        return self.live if isinstance(self.live, torch.Tensor) else None

    @property
    def live_address(self) -> int | None:
        live = self.real if self.real is not None else self.live
        return live.data_ptr() if isinstance(live, torch.Tensor) else None

    def describe(self) -> str:
        role = self.role
        if self.live_tensor is None:
            now = "no tensor" if self.live is MISSING else f"a {type(self.live).__name__}"
            return f"{role.name} reached {tuple(role.shape)} at 0x{role.address:x} at capture and reaches {now} now"
        live = self.real if self.real is not None else self.live
        shaped = (f" (its {tuple(live.shape)} rows seen at the graph's shape, the rest as the graph's buffer holds "
                  "them)") if self.real is not None else ""
        return (f"{role.name} was at 0x{role.address:x} {tuple(role.shape)} at capture and is at "
                f"0x{live.data_ptr():x} {tuple(live.shape)} now{shaped}")


def _moved(role: Role, live) -> bool:
    if not isinstance(live, torch.Tensor):
        return True
    return storage_ptr(live) != role.storage or live.data_ptr() != role.address or tuple(live.shape) != role.shape


def rebinds(record: CaptureRecord, roots: dict) -> list[Rebind]:
    """Every role whose path reaches another tensor (or none) than at capture."""
    live = {id(r): resolve(r.path, roots) for r in record.roles}
    moved = [r for r in record.roles if _moved(r, live[id(r)])]
    if not moved:
        return []
    keepers: dict[int, Role] = {}
    # NOTE: the role holding the whole buffer names it best (`static.positions`, not a per-step view of it).
    for r in sorted(record.roles, key=lambda r: r.owner_rank):
        if isinstance(live[id(r)], torch.Tensor) and storage_ptr(live[id(r)]) == r.storage:
            keepers.setdefault(r.storage, r)
    if any(r.storage not in keepers for r in moved):
        keepers.update(_reached({r.storage for r in moved} - set(keepers), roots))
    return [Rebind(r, live[id(r)], keepers.get(r.storage), chain_of(r.path, roots) == r.chain) for r in moved]


def _reached(storages: set[int], roots: dict) -> dict[int, Reached]:
    """The shortest live path to each of `storages` (whole tensors first), among paths no role names."""
    found: dict[int, Reached] = {}
    for path, value in walk(roots):
        if isinstance(value, torch.Tensor) and value.numel() and storage_ptr(value) in storages:
            found.setdefault(storage_ptr(value), Reached(str(path)))
            if len(found) == len(storages):
                break
    return found


def rank(rebind: Rebind) -> tuple:
    """Sort key of rebinds: where the rebinding happened first, then the buffer itself before views."""
    # NOTE: name the rebinding where it happened: a field rebound on an object that is still the
    # captured one (`static.pos = new`) before a path through an object replaced as a whole.
    return (not rebind.at_leaf,) + rebind.role.owner_rank


def moved_names(found: list[Rebind], storage: int) -> list[str]:
    """Names of the moved roles on one captured storage, where the rebinding happened first."""
    return list(dict.fromkeys(r.role.name for r in sorted(found, key=rank) if r.role.storage == storage))


def reassigned(found: list[Rebind]) -> list[Rebind]:
    """Rebinds that leave the graph reading memory no role reaches any more (one per storage)."""
    picked: dict[int, Rebind] = {}
    for rebind in sorted(found, key=rank):
        if not rebind.owned and rebind.role.storage not in picked:
            picked[rebind.role.storage] = rebind
    return list(picked.values())


def not_refreshed(record: CaptureRecord, replays: int, after: int, reported: set) -> list[Role]:
    """Declared inputs the graph only reads whose version has not moved since capture, after `after` replays.

    Not told for inference tensors (no version counter: equal values written
    each step would look unwritten) nor for another audited graph's outputs
    (that graph's replays write them without a version bump).
    """
    if replays < after:
        return []
    found = []
    for role in record.roles:
        if role.declared and not role.written and role.storage not in reported and role.version is not None \
                and not role.changed() and not pool.graph_produced(role.tensor):
            reported.add(role.storage)
            found.append(role)
    return found
