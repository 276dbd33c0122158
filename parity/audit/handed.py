"""The reference handed what the graph read: a role held otherwise than the graph captured it.

Two ways a role's holder can part from what a graph reads, both invisible to a
copy into the captured tensor, and one experiment for both, on any lab: the
reference is re-run with the role handed as the graph reads it; if it then
produces the graph's outputs bit for bit, that one rebinding is the difference:
BUFFER_REASSIGNED, naming the role.

- `stage`, a layout drift (`lab.drifts()`): the role holds another (offset,
  sizes, strides) of the storage the graph captured (a buffer re-viewed per
  batch at another row pitch, a state or KV tensor re-laid after capture; vLLM
  #50046, #51318); eager code writes and reads through the live view, the graph
  reads the same bytes at the captured stride. The reference gets a view of its
  own storage at the captured layout (`at_captured_layout`). Every tensor of
  one role is one variable (the KV cache's layers); when no role does alone but
  all together do (views cut anew from one workspace), delta debugging finds
  the smallest set, and the workspace is named first. The harness's lab looks
  at the capture-time metadata, the KV cache and the owner's attributes, the
  audit's at every role's path.
- `pointed_back`, a rebound role (`lab.rebound()`): the role holds a fresh
  tensor while the graph reads the persistent buffer, which another holder of
  the role still reads (RoPE from the registry, attention from the metadata),
  so copying the fresh values into the buffer would change the reads that were
  right too. The reference gets the persistent buffer back for that role. Run
  after the repairs, which name the simpler cases.
Under TP every rank's roles are tried (`ranks.candidates`), a plain re-run on a
rank where a role did not move (`lab.handed` with nothing of its own).
"""

from __future__ import annotations

import dataclasses

import torch

from parity.audit import ranks
from parity.audit.delta_debug import ddmin
from parity.diagnosis.kinds import BUFFER_REASSIGNED


@dataclasses.dataclass(frozen=True)
class Drift:
    name: str               # the role, by the lab's name for it
    holder: str             # who holds it ("metadata object", "kv cache", "object", "path")
    captured: torch.Tensor  # the tensor the graph captured
    live: torch.Tensor      # what the role holds now
    index: int = -1         # "kv cache": the tensor's place in the cache
    path: object = None     # a `roles.Path` to the role, where the lab has one
    rebound: bool = False   # another tensor than captured (`pointed_back`), not another view of it (`stage`)


def layout(t: torch.Tensor) -> tuple:
    return t.storage_offset(), tuple(t.shape), tuple(t.stride())


def drifted(captured, live) -> bool:
    """The same storage, another view of it."""
    return (isinstance(captured, torch.Tensor) and isinstance(live, torch.Tensor)
            and captured.untyped_storage().data_ptr() == live.untyped_storage().data_ptr()
            and captured.dtype == live.dtype and layout(captured) != layout(live))


def at_captured_layout(drift: Drift, own: torch.Tensor) -> torch.Tensor | None:
    """A view of `own`'s storage (the reference's tensor for the role) at the layout the graph captured; None
    when that layout does not fit the storage."""
    offset, size, stride = layout(drift.captured)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset
    if last >= own.untyped_storage().nbytes() // own.element_size():
        return None
    return torch.empty(0, dtype=own.dtype, device=own.device).set_(own.untyped_storage(), offset, size, stride)


def stage(lab):
    """BUFFER_REASSIGNED of the first drifted role whose captured layout, handed to the reference, makes it
    produce the graph's outputs bit for bit, or of the smallest set that does only together; None (ruled out)
    otherwise."""
    return _search(lab, lab.drifts(), "stride", "hand the reference {} at the layout the graph captured")


def pointed_back(lab):
    """BUFFER_REASSIGNED of the first rebound role whose persistent buffer, handed back to the reference, makes it
    produce the graph's outputs bit for bit; None (ruled out) otherwise."""
    return _search(lab, lab.rebound(), "pointed back", "point the reference's {} back at the persistent buffer")


def _search(lab, drifts: list[Drift], label: str, tried: str):
    groups: dict[str, list[Drift]] = {}
    for drift in drifts:
        groups.setdefault(f"{drift.name} ({drift.holder})", []).append(drift)
    found = ranks.candidates(f"{label}: roles", groups, lambda group: None)

    def handed(chosen) -> bool | None:
        return lab.handed([drift for c in chosen for drift in (c.local or [])])

    for candidate in found:
        if handed([candidate]):
            return ranks.shared(f"{label}: diagnosis", _named(lab, [candidate.local]) if candidate.local else None)
    if len(found) > 1 and handed(found):
        smallest = ddmin(found, lambda chosen: bool(handed(chosen)))
        held = [c.local for c in smallest if c.local]
        return ranks.shared(f"{label}: diagnosis", _named(lab, held) if len(held) == len(smallest) else None)
    lab.ruled_out += [tried.format(c.key) for c in found]
    if len(found) > 1:
        lab.ruled_out.append(tried.format("every role at once"))
    return None


def _named(lab, groups: list[list[Drift]]):
    """The roles handed at their captured layouts together; when several views of one storage moved, that
    storage (the workspace they are cut from) is named first."""
    if groups[0][0].rebound:
        return _pointed(lab, [group[0] for group in groups])
    evidence, handed = [], []
    for group in groups:
        drift = group[0]
        (c_off, c_size, c_stride), (l_off, l_size, l_stride) = layout(drift.captured), layout(drift.live)
        handed.append(f"{drift.name} handed at the layout the graph captured (offset {c_off}, size {list(c_size)}, "
                      f"stride {list(c_stride)})")
        many = f" ({len(group)} tensors; the first)" if len(group) > 1 else ""
        moved = "" if c_stride != l_stride or c_size != l_size else " (the view moved within its storage)"
        evidence.append(f"stride drift{moved}: {drift.name} ({drift.holder}){many}, the same storage at "
                        f"{drift.live.untyped_storage().data_ptr():#x} read at another layout than captured: "
                        f"captured stride {list(c_stride)} (offset {c_off}, size {list(c_size)}), live stride "
                        f"{list(l_stride)} (offset {l_off}, size {list(l_size)}); the holder rebound the role to a "
                        "new view, eager code writes and reads through it, the graph reads the captured one")
    names = [group[0].name for group in groups]
    storages = {group[0].live.untyped_storage().data_ptr() for group in groups}
    workspace = lab.name(groups[0][0].live) if len(groups) > 1 and len(storages) == 1 else None
    if workspace is not None and workspace not in names:
        evidence.append(f"every one of them is a view of {workspace}: the views were cut anew from it after "
                        "capture (a workspace reallocated); the graph reads the places it captured")
        names = [workspace, *names]
    together = " together (no one alone restores parity)" if len(groups) > 1 else ""
    experiment = f"re-run the reference with {'; '.join(handed)}{together}: it produces the graph's outputs bit for bit"
    first = groups[0][0]
    return lab.diagnosis(BUFFER_REASSIGNED, names, captured=first.captured.data_ptr(), live=first.live.data_ptr(),
                         evidence=evidence + [experiment], experiment=experiment, ruled_out=list(lab.ruled_out))


def _pointed(lab, drifts: list[Drift]):
    """The rebound roles pointed back at their persistent buffers together."""
    names = [d.name for d in drifts]
    experiment = (f"re-run the reference with {', '.join(names)} pointed back at the persistent buffer the graph "
                  f"captured{' (together)' if len(drifts) > 1 else ''}: it produces the graph's outputs bit for bit")
    evidence = [f"buffer_reassigned: {d.name} ({d.holder}), captured {d.captured.data_ptr():#x}, live "
                f"{d.live.data_ptr():#x}: the {d.holder} rebound it to a fresh tensor; the persistent buffer the "
                "graph reads kept its old values" for d in drifts]
    return lab.diagnosis(BUFFER_REASSIGNED, names, captured=drifts[0].captured.data_ptr(),
                         live=drifts[0].live.data_ptr(), evidence=evidence + [experiment], experiment=experiment,
                         ruled_out=list(lab.ruled_out))
