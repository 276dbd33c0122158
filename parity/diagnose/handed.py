"""The roles `audit/handed.py`'s stages hand the reference at the divergent forward, and the re-run they ask.

`drifts`: views of a captured storage at another layout (the capture-time
metadata's fields, the KV cache, the owner's attributes); `rebound`: metadata
roles at a fresh tensor where the graph read the persistent buffer; `handed`:
the reference re-run with them handed as the graph reads them, against the
graph run's outputs (`Divergence.drifts`, `.rebound`, `.handed`).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from parity.audit.handed import Drift, at_captured_layout, drifted
from parity.diagnose.readset import reference_reads
from parity.diagnose.state import max_diff, outputs
from parity.graphs.manifest import OBJECT_ROOT, live_object_tensor
from parity.graphs.roles import assign
from parity.graphs.tp_agree import agree_all, agree_any


def drifts(lab) -> list[Drift]:
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


def rebound(lab) -> list[Drift]:
    """Roles the reference reads through the metadata object at a tensor its persistent buffer does not share,
    where the graph read the persistent buffer."""
    registry = lab.ref.owner(lab.ev_r.owner).buffers
    captured: dict = {}
    for e in lab.entry.manifest:
        if e.holder == "registry":
            captured.setdefault(e.name, e.tensor)
    return [Drift(name, "metadata object", captured[name], getattr(lab.ev_g.meta, name), rebound=True)
            for name, holders in sorted(reference_reads(lab).items())
            if "metadata object" in holders and name in registry and name in captured
            and isinstance(getattr(lab.ev_g.meta, name, None), torch.Tensor)]


def _pointed_back(field: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor | None:
    """The reference's persistent buffer at the field's rows; None when it cannot hold them."""
    if buffer.dim() != field.dim() or buffer.shape[0] < field.shape[0] or buffer.shape[1:] != field.shape[1:]:
        return None
    return buffer[: field.shape[0]]


@contextmanager
def handed_at_captured_layout(lab, group: list[Drift]):
    """The reference's metadata with every role of `group` handed as the graph reads it (KV and object roles are
    swapped on the reference's cache / owner while the block runs); yields None when the reference has no such
    role or cannot hold it so."""
    meta, swaps = lab.ev_r.meta, []
    for drift in group:
        if drift.rebound:
            view = _pointed_back(getattr(meta, drift.name), lab.ref.owner(lab.ev_r.owner).buffers[drift.name])
            meta = None if view is None else dataclasses.replace(meta, **{drift.name: view})
        elif drift.holder == "metadata object":
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


def _held(lab, drift: Drift):
    """The reference's tensor for a KV or object role, and a setter of that role."""
    if drift.holder == "kv cache":
        cache = lab.ev_r.meta.kv_cache
        tensors = cache.keys if drift.index < len(cache.keys) else cache.values
        i = drift.index % len(cache.keys)
        return tensors[i], lambda value: tensors.__setitem__(i, value)
    ref_owner = lab.ref.owner(lab.ev_r.owner)
    return live_object_tensor(drift, ref_owner), lambda value: assign(drift.path, {OBJECT_ROOT: ref_owner}, value)


def handed(lab, group: list[Drift]) -> bool | None:
    """Re-run the reference with every role of `group` handed as the graph reads it: does it produce the graph's
    outputs bit for bit (on every rank)? None, and no re-run, when no rank can hand them (a layout or a buffer
    that does not fit the reference's); a rank that has none of them re-runs it unchanged."""
    d, fn = lab.ev_r.dispatch, lab.forward("ref")
    with handed_at_captured_layout(lab, group) as meta:
        if not agree_any("handed: the roles fit", meta is not None and bool(group)):
            return None
        # Memory both runs reach (a workspace of the model they share) as the graph's forward found it, then the
        # reference's own pre-state: the re-run reads through the captured views what the replay read.
        lab.restore("graph")
        lab.restore("ref")
        lab.replays += 1
        returned = fn(d.num_tokens_padded, d.num_reqs_padded, meta if group and meta is not None else lab.ev_r.meta)
    out = outputs(lab.ref, lab.ev_r, returned)     # the KV cache compared through its live tensors, as the graph's
    lab.restore("ref")
    return agree_all("handed: the reference produces the graph's outputs", max_diff(out, lab.out_g)[0] == 0)
