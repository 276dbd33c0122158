"""The divergent forward's repairs (`Divergence.repairs`): what its graph read against what it should read.

Candidates come from the capture manifest (every registered buffer the graph
read, and every tensor only the capture-time metadata object held), narrowed
to the roles the reference forward really reads (`readset.py`); the audit's
`repairs.stage` runs them. Per role, by what the addresses say: a redirect to
the tensor the live holder reaches now (the registry's: BUFFER_REASSIGNED; the
KV cache's tensors, as one variable; the live metadata's, CAPTURE_CONTEXT when
the graph read a tensor only the capture-time metadata held and the live one
holds the persistent buffer, all such reads as one variable, else
BUFFER_REASSIGNED; an owner attribute rebound since capture, named by its
attribute path); a refresh with the reference's values (STALE_BUFFER); the
padded entries set inert (PADDING_LEAK). The audit's `repairs.units` makes
them variables (under TP, every rank's).
"""

from __future__ import annotations

import torch

from parity.audit.repairs import Repair, Unit, units
from parity.diagnosis.kinds import BUFFER_REASSIGNED, CAPTURE_CONTEXT, PADDING_LEAK, STALE_BUFFER
from parity.diagnose.readset import reference_reads
from parity.graphs.manifest import live_object_tensor

INDEX_ORDER = ("token", "row", "row+1")


def repairs(lab) -> list[Unit]:
    """The variables of the audit's `repairs.stage` at this forward: every repair of a role the reference reads,
    each alone but the capture context's and the KV cache's each as one (`repairs.units`)."""
    found = candidates(lab, set(reference_reads(lab)))
    for r in found:
        r.variable = "capture context" if r.kind == CAPTURE_CONTEXT else "kv_cache" if r.name == "kv_cache" else ""
    return units(found)


def candidates(lab, read_by_reference: set[str]) -> list[Repair]:
    """Every repair the addresses and values at this forward suggest, most specific kind per role."""
    ref, graph, ev_r, ev_g, snaps, entry = lab.ref, lab.graph, lab.ev_r, lab.ev_g, lab.snaps, lab.entry
    registry = graph.owner(ev_g.owner).buffers
    ref_registry = ref.owner(ev_r.owner).buffers
    graph_state, ref_state = snaps["graph"]["tensors"], snaps["ref"]["tensors"]

    def reference_value(name):
        held = snaps["ref"]["meta"]
        return ref_state.before(held[name] if name in held else ref_registry[name])

    found = []
    d = ev_g.dispatch
    live_cache = graph.owner(ev_g.owner).kv_cache.tensors()
    holder = graph.owner(ev_g.owner)
    for e in entry.manifest:
        if e.holder == "object":
            repair = _redirect_attribute(e, live_object_tensor(e, holder), read_by_reference, graph_state, ev_g.owner)
            if repair is not None:
                found.append(repair)
            continue
        if e.holder == "kv cache":
            live = live_cache[e.index] if e.index < len(live_cache) else None
            if "kv_cache" in read_by_reference and live is not None and live.data_ptr() != e.address:
                found.append(Repair(BUFFER_REASSIGNED, "kv_cache", "kv cache object",
                                    "redirect the KV cache to the cache's live tensors", e.tensor, slice(None),
                                    graph_state.before(live), e.address, live.data_ptr(),
                                    "the KV cache's tensors were replaced; the graph reads and writes the old ones",
                                    live))
            continue
        if e.name not in read_by_reference or e.name not in registry:
            continue
        region = registry.spec(e.name).used(d.num_tokens, d.num_reqs)
        before = graph_state.before(e.tensor)
        live_registry = registry[e.name]
        live_meta = getattr(ev_g.meta, e.name, None)
        live_meta = live_meta if isinstance(live_meta, torch.Tensor) else None   # host fields are not reads
        if region.stop is not None and min(before.shape[0], reference_value(e.name).shape[0]) < region.stop:
            continue
        repair = _repair_for(e, region, before, live_registry, live_meta, reference_value(e.name), graph_state)
        if repair is not None:
            found.append(repair)
    return found + _padding_repairs(registry, ev_g, graph_state)


def _redirect_attribute(e, live, read_by_reference, graph_state, owner: str) -> Repair | None:
    """An attribute of the owner object (a model buffer, a tensor the proposer keeps) the graph read at its
    capture-time tensor, rebound since: redirect the graph's reads and writes to the live tensor."""
    if (e.name not in read_by_reference or live is None or live.shape != e.tensor.shape
            or live.untyped_storage().data_ptr() == e.tensor.untyped_storage().data_ptr()):
        return None
    return Repair(BUFFER_REASSIGNED, e.name, f"{owner} object", f"redirect {e.name} to the attribute's live tensor",
                  e.tensor, slice(None), graph_state.before(live), e.address, live.data_ptr(),
                  "the attribute was rebound to a new tensor; the graph reads the one it held at capture", live)


def _repair_for(e, region, before, live_registry, live_meta, reference, graph_state) -> Repair | None:
    captured = e.address
    if e.holder == "registry" and live_registry.data_ptr() != captured:
        live = graph_state.before(live_registry)
        return Repair(BUFFER_REASSIGNED, e.name, "registry", f"redirect {e.name} to the registry's live tensor",
                      e.tensor, region, live[region], captured, live_registry.data_ptr(),
                      "the registry rebound it to a new tensor", live_registry)
    if e.holder == "metadata" and live_meta is not None and live_meta.data_ptr() != captured:
        kind, who = ((CAPTURE_CONTEXT, "metadata object")
                     if live_meta.untyped_storage().data_ptr() == live_registry.untyped_storage().data_ptr()
                     else (BUFFER_REASSIGNED, "metadata object"))
        note = ("the graph was captured reading a tensor of the capture-time metadata, not the persistent buffer"
                if kind == CAPTURE_CONTEXT else "the metadata object gets a new tensor for every batch")
        return Repair(kind, e.name, who, f"redirect {e.name} to the live metadata's tensor", e.tensor, region,
                      live_meta[region], captured, live_meta.data_ptr(), note)
    if live_meta is not None and live_meta.untyped_storage().data_ptr() != e.tensor.untyped_storage().data_ptr():
        return Repair(BUFFER_REASSIGNED, e.name, "metadata object",
                      f"redirect {e.name} to the live metadata's tensor", e.tensor, region, live_meta[region],
                      captured, live_meta.data_ptr(), "the metadata object rebound it to a fresh tensor; the "
                      "persistent buffer the graph captured kept its old values")
    if before[region].shape != reference[region].shape or torch.equal(before[region], reference[region]):
        return None
    return Repair(STALE_BUFFER, e.name, e.holder, f"refresh {e.name} with the reference's values", e.tensor,
                  region, reference[region], captured, captured)


def _padding_repairs(registry, ev_g, graph_state) -> list[Repair]:
    """Set inert the padded entries that are off their pad value before the forward, per token, then per row."""
    d = ev_g.dispatch
    found = sorted(breaches(registry, ev_g.meta, d, graph_state.before),
                   key=lambda b: INDEX_ORDER.index(registry.spec(b[0]).index))
    return [Repair(PADDING_LEAK, name, "registry", f"set the padded entries of {name} inert", tensor, region,
                   torch.full_like(graph_state.before(tensor)[region], registry.spec(name).inert_value(d.num_tokens)))
            for name, tensor, region, _ in found]


def breaches(buffers, meta, dispatch, before=lambda t: t) -> list[tuple[str, torch.Tensor, slice, int]]:
    """(name, tensor, padded region, entries off) of every INERT buffer, as held by the registry and by the
    metadata object, whose padding (as `before` gives it: as it is now by default) is not its pad value."""
    found = []
    for name in buffers.names():
        spec = buffers.spec(name)
        region = spec.padded(dispatch)
        if not spec.inert or region.stop <= region.start:
            continue
        inert = spec.inert_value(dispatch.num_tokens)
        held = (buffers[name], getattr(meta, name, None))
        for tensor in {t.data_ptr(): t for t in reversed(held) if t is not None}.values():
            off = int((before(tensor)[region] != inert).sum())
            if off:
                found.append((name, tensor, region, off))
    return found
