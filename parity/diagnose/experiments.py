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

When no repair of the graph restores parity, the experiment runs the other
way (`pointed_back`): a role the reference reads through the metadata object
at a tensor the persistent buffer does not share, while the graph read the
persistent buffer, is pointed back at that buffer in a re-run of the
reference. If the reference then produces the graph's outputs bit for bit,
that one rebinding is the difference: BUFFER_REASSIGNED (who: metadata
object). This covers a role read through two holders (RoPE from the registry,
attention from the metadata), where copying values into the captured buffer
would also change the reads that were right.

A PIECEWISE graph has holders of its own: each eager attention call's output,
which the next piece reads at the address it had at capture. When a call's
output no longer is that tensor after a replay, `static_outputs` replays the
pieces once more delivering every attention result into the captured output:
if that restores parity, the output was rebound (BUFFER_REASSIGNED
attention_output, who: the piecewise replay).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from parity.diagnosis.kinds import BUFFER_REASSIGNED, CAPTURE_CONTEXT, PADDING_LEAK, STALE_BUFFER
from parity.diagnose.delta_debug import ddmin
from parity.diagnose.state import executor_of, forward_fn, max_diff, outputs, registry_of, restore
from parity.graphs.manifest import live_object_tensor

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


def candidates(ref, graph, ev_r, ev_g, snaps, entry, read_by_reference: set[str]) -> list[Repair]:
    """Every repair the addresses and values at this forward suggest, most specific kind per role."""
    registry = registry_of(graph, ev_g.owner)
    ref_registry = registry_of(ref, ev_r.owner)
    graph_state = dict(zip([id(t) for t in snaps["graph"]["live"]], snaps["graph"]["saved"]))
    ref_state = dict(zip([id(t) for t in snaps["ref"]["live"]], snaps["ref"]["saved"]))

    def reference_value(name):
        if name in snaps["ref"]["meta"]:
            return snaps["ref"]["meta"][name]
        live = ref_registry[name]
        return ref_state.get(id(live), live)

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
                                    graph_state.get(id(live), live), e.address, live.data_ptr(),
                                    "the KV cache's tensors were replaced; the graph reads and writes the old ones",
                                    live))
            continue
        if e.name not in read_by_reference or _spec(registry, e.name) is None:
            continue
        region = registry.spec(e.name).used(d.num_tokens, d.num_reqs)
        before = graph_state.get(id(e.tensor), e.tensor)
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
                  e.tensor, slice(None), graph_state.get(id(live), live), e.address, live.data_ptr(),
                  "the attribute was rebound to a new tensor; the graph reads the one it held at capture", live)


def _repair_for(e, region, before, live_registry, live_meta, reference, graph_state) -> Repair | None:
    captured = e.address
    if e.holder == "registry" and live_registry.data_ptr() != captured:
        live = graph_state.get(id(live_registry), live_registry)
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
            before = graph_state.get(id(tensor), tensor)
            if before.dim() and (before[region] != inert).any():
                found.append(Repair(PADDING_LEAK, name, "registry", f"set the padded entries of {name} inert",
                                    tensor, region, torch.full_like(before[region], inert)))
    return found


def confirm(bisector, graph, ev_g, snaps, out_r, repairs: list[Repair]) -> tuple[list[Repair], list[Repair]]:
    """(culprits, others that alone also restore parity); ([], []) when nothing restores it.

    The capture context is one variable: every read the graph took from the
    capture-time metadata object is redirected together, as one experiment;
    so is the KV cache (all its tensors).
    """
    executor = executor_of(graph, ev_g.owner)
    fn = forward_fn(graph, ev_g.owner, ev_g.phase)
    # NOTE: a repair may write a tensor outside the engine's snapshot (a capture-time
    # placeholder, a replaced KV tensor): its region is saved here and put back before every experiment.
    originals = [(r.tensor, r.region, r.tensor[r.region].clone()) for r in repairs]
    together = {CAPTURE_CONTEXT: [r for r in repairs if r.kind == CAPTURE_CONTEXT],
                "kv_cache": [r for r in repairs if r.name == "kv_cache"]}
    units = [[r] for r in repairs if r.kind != CAPTURE_CONTEXT and r.name != "kv_cache"]
    units += [unit for unit in together.values() if unit]

    def replay_with(chosen) -> bool:
        restore(snaps["graph"])
        for tensor, region, value in originals:
            tensor[region].copy_(value)
        for unit in chosen:
            for r in unit:
                r.tensor[r.region].copy_(r.value)
        bisector.replays += 1
        executor.execute(ev_g.dispatch, fn, ev_g.meta)
        for unit in chosen:
            for r in unit:
                if r.live_tensor is not None:
                    r.live_tensor[r.region].copy_(r.tensor[r.region])
        return bisector.outputs_match(graph, ev_g, out_r)

    if not units or not replay_with(units):
        return [], []
    if len(units) == 1:
        return units[0], []
    alone = [u for u in sorted(units, key=lambda u: SPECIFICITY.index(u[0].kind)) if replay_with([u])]
    if alone:
        return alone[0], [r for u in alone[1:] for r in u]
    return [r for u in ddmin(units, replay_with) for r in u], []


def split_roles(ref, ev_r, ev_g, entry, reads: dict[str, set[str]]) -> list[str]:
    """Roles the reference reads through the metadata object at a tensor its persistent buffer does not share,
    where the graph read the persistent buffer."""
    registry = registry_of(ref, ev_r.owner)
    from_registry = {e.name for e in entry.manifest if e.holder == "registry"}
    return [name for name, holders in sorted(reads.items())
            if "metadata object" in holders and name in registry and name in from_registry
            and isinstance(getattr(ev_g.meta, name, None), torch.Tensor)]


def pointed_back(bisector, ref, ev_r, ev_g, snaps, entry, out_g, names: list[str]):
    """(role, captured, live, experiment, evidence) of the first role whose metadata tensor, pointed back at
    the persistent buffer in a re-run of the reference, makes it produce the graph's outputs bit for bit."""
    registry = registry_of(ref, ev_r.owner)
    fn = forward_fn(ref, ev_r.owner, ev_r.phase)
    d = ev_r.dispatch
    for name in names:
        field = getattr(ev_r.meta, name)
        buffer = registry[name]
        if buffer.dim() != field.dim() or buffer.shape[0] < field.shape[0] or buffer.shape[1:] != field.shape[1:]:
            continue
        meta = dataclasses.replace(ev_r.meta, **{name: buffer[: field.shape[0]]})
        restore(snaps["ref"])
        bisector.replays += 1
        result = fn(d.num_tokens_padded, d.num_reqs_padded, meta)
        out = outputs(ref, ev_r, result)
        restore(snaps["ref"])
        if max_diff(out, out_g)[0] == 0:
            captured = next(e.address for e in entry.manifest if e.name == name and e.holder == "registry")
            live = getattr(ev_g.meta, name).data_ptr()
            experiment = (f"re-run the reference with the metadata's {name} pointed back at the persistent buffer "
                          "the graph captured: it produces the graph's outputs bit for bit")
            evidence = [f"buffer_reassigned: {name} (metadata object), captured {captured:#x}, live {live:#x}: "
                        "the metadata object rebound it to a fresh tensor; the persistent buffer the graph reads "
                        "kept its old values", experiment]
            return name, captured, live, experiment, evidence
    return None


def static_outputs(bisector, graph, ev_g, snaps, out_r, entry):
    """(role, captured, live, experiment, evidence) when a PIECEWISE graph's attention outputs were rebound
    and delivering them into the captured tensors restores bitwise parity; None otherwise."""
    g = entry.graph
    moved = [i for i, call in enumerate(g.calls) if call.static is not None and call.out is not call.static]
    if not moved:
        return None
    restore(snaps["graph"])
    bisector.replays += 1
    for i, segment in enumerate(g.segments):
        segment.replay()
        if i < len(g.calls):
            call = g.calls[i]
            call.static.copy_(call.attend(ev_g.meta))
    if not bisector.outputs_match(graph, ev_g, out_r, g.outputs):
        return None
    call = g.calls[moved[0]]
    experiment = ("replay the pieces delivering every attention result into the output tensor the next piece "
                  "captured: replaying restores bitwise parity with the padded reference")
    evidence = [f"buffer_reassigned: attention_output (piecewise replay), captured {call.static.data_ptr():#x}, "
                f"live {call.out.data_ptr():#x}: {len(moved)} of {len(g.calls)} attention calls hold a new output "
                "tensor after the replay; the next piece reads the captured one", experiment]
    return "attention_output", call.static.data_ptr(), call.out.data_ptr(), experiment, evidence
