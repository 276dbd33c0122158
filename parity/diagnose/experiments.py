"""One-variable experiments on a divergent graph forward: each repairs one tensor the graph read, and replays.

Candidates come from the capture manifest (every registered buffer the graph
read, and every tensor only the capture-time metadata object held), narrowed
to the roles the reference forward really reads (`readset.py`). Per role, the
experiment that fits what the addresses say:

- redirect (the live holder now points elsewhere): copy the live tensor's values
  into the captured address, replay, and copy what the graph wrote there back
  to the live tensor (reads and writes both follow the live holder).
  - registry rebound: BUFFER_REASSIGNED (who: registry);
  - KV cache rebound (the cache's tensors replaced): BUFFER_REASSIGNED
    (who: kv cache object), every tensor of the cache as one variable;
  - the graph read a tensor only the capture-time metadata held, and the live
    metadata holds the persistent buffer: CAPTURE_CONTEXT;
  - the graph read a tensor only the capture-time metadata held, and the live
    metadata holds another fresh tensor (a builder that reallocates):
    BUFFER_REASSIGNED (who: metadata object);
  - the graph read the persistent buffer, and the live metadata object holds a
    fresh tensor instead (the field was rebound per step, seeds 001 and 002):
    BUFFER_REASSIGNED (who: metadata object);
- an attribute of the owner object (a model buffer such as RoPE's inv_freq, a
  tensor the proposer keeps) that the graph read at its capture-time tensor and
  that now holds another: redirect it: BUFFER_REASSIGNED (who: the owner object,
  named by the attribute path);
- refresh (the captured tensor is the live tensor in every holder, its values
  are wrong): copy the reference's values in: STALE_BUFFER;
- inert padding (a padded entry of the padding contract off its pad value):
  PADDING_LEAK.

Every repair is tried alone (one variable); when none restores bitwise parity
alone, all together and then delta debugging find the smallest set.

When no repair restores parity, the stage adds every repair it tried to the
lab's `ruled_out`, and the next stages (`rebound.py`, `host_moves.py`,
`recapture.py`) go on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.diagnosis.kinds import BUFFER_REASSIGNED, CAPTURE_CONTEXT, PADDING_LEAK, STALE_BUFFER
from parity.audit.one_variable import search
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence
from parity.diagnose import ranks
from parity.diagnose.readset import reference_reads
from parity.diagnose.state import registry_of
from parity.graphs.manifest import live_object_tensor
from parity.graphs.tp_agree import world

# The most specific first: a repair that names where the live values went beats one that only refreshes.
SPECIFICITY = (BUFFER_REASSIGNED, CAPTURE_CONTEXT, STALE_BUFFER, PADDING_LEAK)
INDEX_ORDER = ("token", "row", "row+1")


@dataclass
class Repair:
    kind: str
    name: str                  # the role: a buffer name, or a metadata field
    holder: str                # "registry" or "metadata object"
    experiment: str            # what the repair does, in words
    tensor: torch.Tensor       # the captured tensor it writes
    region: slice
    value: torch.Tensor
    captured: int | None = None
    live: int | None = None
    note: str = ""
    live_tensor: torch.Tensor | None = None   # a redirect's live holder: gets back what the graph wrote


def _spec(registry, name):
    return registry.spec(name) if name in registry else None


def stage(lab: Divergence) -> Diagnosis | None:
    """The repair that restores bitwise parity, named; None (its repairs ruled out) when none does."""
    reads = reference_reads(lab)
    repairs = candidates(lab, set(reads))
    units = agreed_units(repairs)
    culprits, others = confirm(lab, repairs, units)
    told = [r for unit in units for r in unit.told]
    if culprits:
        return explain(lab, culprits, others, told)
    lab.ruled_out += [r.experiment for r in told] or [
        "no tensor the reference reads differs from what the graph read"]
    return None


@dataclass
class Unit:
    """One variable: the repairs this rank applies together, and how they are told (the same on every rank)."""
    applied: list
    told: list


def agreed_units(repairs: list[Repair]) -> list[Unit]:
    """The experiments' variables: each repair alone, but the capture context and the KV cache each as one.
    Under TP, every rank's (`ranks.candidates`): a variable another rank found is a no-op here."""
    keyed: dict[str, list[Repair]] = {}
    together = {"capture context": [r for r in repairs if r.kind == CAPTURE_CONTEXT],
                "kv_cache": [r for r in repairs if r.name == "kv_cache"]}
    for r in repairs:
        if r.kind != CAPTURE_CONTEXT and r.name != "kv_cache":
            key = f"{r.kind} {r.name} ({r.holder})"
            n = sum(k.split(" #")[0] == key for k in keyed)   # one role, two holders' tensors: two variables
            keyed[f"{key} #{n}" if n else key] = [r]
    keyed.update({key: unit for key, unit in together.items() if unit})
    if world() == 1:
        return [Unit(unit, unit) for unit in keyed.values()]
    found = ranks.candidates("experiments: repairs", keyed, lambda unit: [_account(r) for r in unit])
    return [Unit(c.local or [], [Repair(**{**a, "note": a["note"] + ranks.where(c, world())}) for a in c.described])
            for c in found]


def _account(r: Repair) -> dict:
    return {"kind": r.kind, "name": r.name, "holder": r.holder, "experiment": r.experiment, "tensor": None,
            "region": None, "value": None, "captured": r.captured, "live": r.live, "note": r.note}


def candidates(lab: Divergence, read_by_reference: set[str]) -> list[Repair]:
    """Every repair the addresses and values at this forward suggest, most specific kind per role."""
    ref, graph, ev_r, ev_g, snaps, entry = lab.ref, lab.graph, lab.ev_r, lab.ev_g, lab.snaps, lab.entry
    registry = registry_of(graph, ev_g.owner)
    ref_registry = registry_of(ref, ev_r.owner)
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
        if e.name not in read_by_reference or _spec(registry, e.name) is None:
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
    d = ev_g.dispatch
    names = sorted((n for n in registry.names() if registry.spec(n).inert),
                   key=lambda n: INDEX_ORDER.index(registry.spec(n).index))
    found = []
    for name in names:
        spec = registry.spec(name)
        region = spec.padded(d)
        if region.stop <= region.start:
            continue
        inert = spec.inert_value(d.num_tokens)
        held = (registry[name], getattr(ev_g.meta, name, None))
        for tensor in {t.data_ptr(): t for t in held if t is not None}.values():
            before = graph_state.before(tensor)
            if before.dim() and (before[region] != inert).any():
                found.append(Repair(PADDING_LEAK, name, "registry", f"set the padded entries of {name} inert",
                                    tensor, region, torch.full_like(before[region], inert)))
    return found


def confirm(lab: Divergence, repairs: list[Repair], units: list[Unit]) -> tuple[list[Repair], list[Repair]]:
    """(culprits, others that alone also restore parity), as told; ([], []) when nothing restores it.

    The capture context is one variable: every read the graph took from the
    capture-time metadata object is redirected together, as one experiment;
    so is the KV cache (all its tensors).
    """
    executor, fn, ev_g = lab.executor, lab.forward(), lab.ev_g
    # NOTE: a repair may write a tensor outside the engine's snapshot (a capture-time
    # placeholder, a replaced KV tensor): its region is saved here and put back before every experiment.
    originals = [(r.tensor, r.region, r.tensor[r.region].clone()) for r in repairs]

    def replay_with(chosen) -> bool:
        chosen = [u for u in units if any(u is c for c in chosen)]    # applied in one order, whatever is asked
        lab.restore()
        for tensor, region, value in originals:
            tensor[region].copy_(value)
        for unit in chosen:
            for r in unit.applied:
                r.tensor[r.region].copy_(r.value)
        lab.replays += 1
        executor.execute(ev_g.dispatch, fn, ev_g.meta)
        for unit in chosen:
            for r in unit.applied:
                if r.live_tensor is not None:
                    r.live_tensor[r.region].copy_(r.tensor[r.region])
        return lab.matches()

    found = search(sorted(units, key=lambda u: SPECIFICITY.index(u.told[0].kind)), replay_with, minimise=True,
                   together=True)
    if found.restoring:
        return found.restoring[0].told, [r for u in found.restoring[1:] for r in u.told]
    return [r for u in found.smallest for r in u.told], []


def explain(lab: Divergence, culprits, others, tried) -> Diagnosis:
    """Kind of the most specific culprit, every culprit's role, the experiment, what was ruled out."""
    culprits = sorted(culprits, key=lambda r: SPECIFICITY.index(r.kind))
    kind = culprits[0].kind
    names = sorted({r.name for r in culprits})
    first = culprits[0]
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
    evidence.append(f"{experiment}: replaying restores bitwise parity with the padded reference")
    also = [f"{r.experiment} also restores parity ({r.kind}, less specific)" for r in others]
    chosen = {id(r) for r in culprits} | {id(r) for r in others}
    ruled_out = lab.ruled_out + [r.experiment for r in tried if id(r) not in chosen]
    return lab.diagnosis(kind, names, captured=first.captured, live=first.live, evidence=evidence,
                         experiment=experiment, ruled_out=ruled_out, also=also)
