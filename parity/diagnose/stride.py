"""Stride drift at the divergent forward: the roles `audit/stride.py`'s shared stage tries, and its re-run.

`drifts`: every tensor the graph captured under a role (the capture-time
metadata object's fields, the KV cache's tensors, the owner object's
attributes) that the role holds at the divergent forward as another view of
the same storage. `handed`: the reference re-run with those roles handed at
the captured layout (a metadata field in a copy of its metadata, a KV or
attribute role swapped on the reference's cache or owner while it runs),
compared with the graph run's outputs (`Divergence.drifts`,
`Divergence.handed`).
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from parity.audit.stride import Drift, at_captured_layout, drifted
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


@contextmanager
def handed_at_captured_layout(lab, group: list[Drift]):
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
    """Re-run the reference with every role of `group` handed at its captured layout: does it produce the graph's
    outputs bit for bit (on every rank)? None, and no re-run, when no rank can hand them (a layout that does not
    fit the reference's storage); a rank that has none of them re-runs it unchanged."""
    d, fn = lab.ev_r.dispatch, lab.forward("ref")
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
