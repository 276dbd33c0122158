"""Stride drift: the graph reads a role's storage at the layout it captured, the eager path hands another.

A captured graph bakes in more than an address: each kernel reads its input at
the storage offset, sizes and strides the tensor had at capture. When the code
later hands the same role as another view of the same storage (a buffer re-viewed
per batch at another row pitch, a state or KV tensor re-laid after capture;
vLLM #50046, #51318), the address audit sees nothing (the storage and its data
pointer are the ones captured), eager code writes and reads through the live
view and stays right, and the graph reads the same bytes at the captured stride.

One general comparison, then a one-variable experiment:

- every tensor the graph captured under a role (the capture-time metadata
  object's fields, the KV cache's tensors, the owner object's attributes) is
  compared with what that role holds at the divergent forward: same storage,
  another (offset, sizes, strides) is a drifted view;
- the reference is re-run with that one role handed as a view of its own
  storage at the captured layout; if it then produces the graph's outputs bit
  for bit, the layout is the difference: BUFFER_REASSIGNED (the holder rebound
  the role to a new view), naming the role, the captured and the live layout.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from parity.diagnosis.kinds import BUFFER_REASSIGNED
from parity.diagnosis.record import Diagnosis
from parity.audit.delta_debug import ddmin
from parity.diagnose import ranks
from parity.diagnose.lab import Divergence
from parity.diagnose.state import max_diff, outputs
from parity.graphs.manifest import OBJECT_ROOT, live_object_tensor
from parity.graphs.roles import assign
from parity.graphs.tp_agree import agree_all, agree_any


@dataclasses.dataclass(frozen=True)
class Drift:
    name: str               # the role: a metadata field, `kv_cache`, or an attribute path from the owner
    holder: str             # "metadata object", "kv cache", "object"
    captured: torch.Tensor  # the tensor the graph captured
    live: torch.Tensor      # what the role holds at the divergent forward
    index: int = -1         # "kv cache": the tensor's place in the cache; "object": unused
    path: object = None     # "object": the roles.Path from the owner


def layout(t: torch.Tensor) -> tuple:
    return t.storage_offset(), tuple(t.shape), tuple(t.stride())


def drifted(captured, live) -> bool:
    """The same storage, another view of it."""
    return (isinstance(captured, torch.Tensor) and isinstance(live, torch.Tensor)
            and captured.untyped_storage().data_ptr() == live.untyped_storage().data_ptr()
            and captured.dtype == live.dtype and layout(captured) != layout(live))


def drifts(lab: Divergence) -> list[Drift]:
    """Every role whose live tensor is another view of the storage the graph captured for it."""
    found, entry, live_meta = [], lab.entry, lab.ev_g.meta
    captured_meta = entry.capture_meta
    if captured_meta is not None and dataclasses.is_dataclass(captured_meta):
        for f in dataclasses.fields(captured_meta):
            c, live = getattr(captured_meta, f.name), getattr(live_meta, f.name, None)
            if drifted(c, live):
                found.append(Drift(f.name, "metadata object", c, live))
    holder = lab.graph.owner(lab.ev_g.owner)
    cache = getattr(live_meta, "kv_cache", None)
    live_cache = cache.tensors() if cache is not None else []
    for e in entry.manifest:
        if e.holder == "kv cache" and e.index < len(live_cache) and drifted(e.tensor, live_cache[e.index]):
            found.append(Drift("kv_cache", "kv cache", e.tensor, live_cache[e.index], index=e.index))
        elif e.holder == "object" and drifted(e.tensor, live := live_object_tensor(e, holder)):
            found.append(Drift(e.name, "object", e.tensor, live, path=e.path))
    return found


def at_captured_layout(drift: Drift, own: torch.Tensor) -> torch.Tensor | None:
    """A view of `own`'s storage (the reference's tensor for the role) at the layout the graph captured; None
    when that layout does not fit the storage."""
    offset, size, stride = layout(drift.captured)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset
    if last >= own.untyped_storage().nbytes() // own.element_size():
        return None
    return torch.empty(0, dtype=own.dtype, device=own.device).set_(own.untyped_storage(), offset, size, stride)


@contextmanager
def handed_at_captured_layout(lab: Divergence, group: list[Drift]):
    """The reference's metadata with every tensor of one role handed at the captured layout (KV and object
    roles are swapped on the reference's cache / owner while the block runs); yields None when the reference
    has no such role or a layout does not fit its storage."""
    meta, swaps = lab.ev_r.meta, []
    for drift in group:
        if drift.holder == "metadata object":
            view = at_captured_layout(drift, getattr(meta, drift.name))
            meta = None if view is None else dataclasses.replace(meta, **{drift.name: view})
        else:
            own, put = _held(lab, drift)
            view = at_captured_layout(drift, own) if isinstance(own, torch.Tensor) else None
            swaps.append((put, own, view))
        if meta is None or (swaps and swaps[-1][2] is None):
            yield None
            return
    for put, _, view in swaps:
        put(view)
    try:
        yield meta
    finally:
        for put, own, _ in swaps:
            put(own)


def _held(lab: Divergence, drift: Drift):
    """The reference's tensor for a KV or object role, and a setter of that role."""
    if drift.holder == "kv cache":
        cache = lab.ev_r.meta.kv_cache
        tensors = cache.keys if drift.index < len(cache.keys) else cache.values
        i = drift.index % len(cache.keys)
        return tensors[i], lambda value: tensors.__setitem__(i, value)
    ref_owner = lab.ref.owner(lab.ev_r.owner)
    return live_object_tensor(drift, ref_owner), lambda value: assign(drift.path, {OBJECT_ROOT: ref_owner}, value)


def stage(lab: Divergence) -> Diagnosis | None:
    """BUFFER_REASSIGNED of the first drifted role (every tensor under it at once: the KV cache's layers) whose
    captured layout, handed to the reference, makes it produce the graph's outputs bit for bit; when no role
    does alone but all together do (views cut from one workspace, re-cut after capture), of the smallest set
    that does (delta debugging); None (ruled out) otherwise. Under TP every rank's drifted roles are tried, a
    plain re-run on a rank where a role did not drift (`ranks.candidates`)."""
    groups: dict[str, list[Drift]] = {}
    for drift in drifts(lab):
        groups.setdefault(f"{drift.name} ({drift.holder})", []).append(drift)
    found = ranks.candidates("stride: drifted roles", groups, lambda group: None)
    for candidate in found:
        if _reference_matches(lab, [candidate]):
            return ranks.shared("stride: diagnosis", _named(lab, [candidate.local]) if candidate.local else None)
    if len(found) > 1 and _reference_matches(lab, found):
        smallest = ddmin(found, lambda chosen: bool(_reference_matches(lab, chosen)))
        held = [c.local for c in smallest if c.local]
        return ranks.shared("stride: diagnosis", _named(lab, held) if len(held) == len(smallest) else None)
    lab.ruled_out += [f"hand the reference {c.key} at the layout the graph captured" for c in found]
    if len(found) > 1:
        lab.ruled_out.append("hand the reference every drifted role at once at the layouts the graph captured")
    return None


def _reference_matches(lab: Divergence, chosen) -> bool | None:
    """Re-run the reference with every role of `chosen` handed at its captured layout: does it produce the graph's
    outputs bit for bit (on every rank)? None, and no re-run, when no rank can hand them (a layout that does not
    fit the reference's storage); a rank that has none of them re-runs it unchanged."""
    d, fn = lab.ev_r.dispatch, lab.forward("ref")
    group = [drift for c in chosen for drift in (c.local or [])]
    with handed_at_captured_layout(lab, group) as meta:
        if not agree_any("stride: a layout fits", meta is not None and bool(group)):
            return None
        # Memory both runs reach (a workspace of the model they share) as the graph's forward found it, then the
        # reference's own pre-state: the re-run reads through the captured views what the replay read.
        lab.restore("graph")
        lab.restore("ref")
        lab.replays += 1
        returned = fn(d.num_tokens_padded, d.num_reqs_padded, meta if group and meta is not None else lab.ev_r.meta)
    out = outputs(lab.ref, lab.ev_r, returned)     # the KV cache compared through its live tensors, as the graph's
    lab.restore("ref")
    return agree_all("stride: the reference produces the graph's outputs", max_diff(out, lab.out_g)[0] == 0)


def _named(lab: Divergence, groups: list[list[Drift]]) -> Diagnosis:
    """The roles handed at their captured layouts together; when several views of one storage moved, that
    storage (the workspace they are cut from) is named first."""
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
