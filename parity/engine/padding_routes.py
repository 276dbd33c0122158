"""The index buffer that routes a padding leak: the probe's questions to a routes reader.

The reader (`routes`, handed to the probe by the harness: `parity.diagnose.routing.Routes`) runs a forward
under a recorder of its indexed reads and writes and applies two rules to what it recorded; here is when the
probe asks, and what it makes of the answer:

- `overwrites`: padded rows whose write targets an element a live row writes
  in the same op are a PADDING_LEAK naming the index buffer, told from the
  indices before any one-variable experiment (`overwrites_first`, on a leak;
  when the forward then does not reproduce itself, as on CUDA where such writes
  race, no experiment follows; otherwise the experiments run twice and their
  names join it when both runs agree, `with_overwrites`); and at every probed
  forward whose two poisons agree (`overwrite_leak`, read from poison A's run):
  the two poisons cannot see a padded row that writes a live row's own
  (unpoisoned) data over it, a race on CUDA may leave the live row's write
  standing in this run, and a pad value declared wrong hides it from the
  contract check;
- `route_regions`: when poisoning a region of persistent slots alone (KV slots or
  state slots no live row holds) changes live outputs, the index buffer whose
  live entries routed live rows to those slots is named in place of the slots.
"""

from __future__ import annotations

from parity.engine.padding_state import saved_state

SLOT_REGIONS = ("kv", "state")     # regions poisoned inside persistent slot stores, read through an index


def labels(owner) -> dict[int, str]:
    """storage -> name of every tensor that persists across forwards: registry buffers, KV cache, state slots."""
    found = {t.untyped_storage().data_ptr(): name for name, t in owner.buffers.items()}
    found.update({t.untyped_storage().data_ptr(): "kv_cache" for t in owner.kv_cache.tensors()})
    found.update({t.untyped_storage().data_ptr(): "state_slots" for t, _ in saved_state(owner)})
    return found


def names_of(owner) -> dict[int, str]:
    """storage -> name of the owner's registry buffers: the index buffers a recorder names."""
    return {t.untyped_storage().data_ptr(): name for name, t in owner.buffers.items()}


def _recorded(routes, owner, run, b_regions):
    recorder = routes.recorder(names_of(owner))
    out, result = run(b_regions, watch=recorder)
    return recorder, out, result


def _overwrites(probe, owner, dispatch, run):
    """(index buffers, tensors written, evidence, the forward's live outputs and result) of poison A's run."""
    recorder, out, result = _recorded(probe.routes, owner, run, [])
    return (*probe.routes.overwrites(recorder, owner.buffers, dispatch, labels(owner)), out, result)


def _name(leak, names: list[str], evidence: list[str]) -> None:
    leak.buffers, leak.kinds = names, ["overwrite"]
    leak.regions = [f"{name} padded entries naming elements live rows write" for name in names]
    leak.experiment = "the padded forward's indexed writes read for the elements each batch row targets"
    leak.evidence += evidence


def overwrite_leak(probe, owner, dispatch, meta, index: int, recorder) -> bool:
    """When the two poisons agree: a leak recorded on `probe` when padded rows write over live rows' elements in
    one op of the forward `recorder` watched (poison A's run); False when no write does."""
    names, written, evidence = probe.routes.overwrites(recorder, owner.buffers, dispatch, labels(owner))
    if names:
        _name(probe._leak(owner, dispatch, meta, index, written), names, evidence)
    return bool(names)


def overwrites_first(probe, leak, owner, dispatch, run) -> list[str]:
    """On a leak, before any experiment: the index buffers whose padded rows write over live rows' elements in
    one op, named on `leak` (what a forward that does not reproduce itself gets: on CUDA it races); [] when
    no write does, or without a reader."""
    if probe.routes is None:
        return []
    names, _, evidence, _, _ = _overwrites(probe, owner, dispatch, run)
    if names:
        _name(leak, names, evidence)
    return names


def with_overwrites(leak, names: list[str], twin=None) -> None:
    """After the probe's experiments localised `leak` (and, the same way, `twin`): the overwriting writes' index
    buffers named beside what they found; when the two localisations differ, the writes race and only the
    indices' answer stands."""
    if not names:
        return
    if twin is not None and twin.buffers != leak.buffers:
        found = f"{', '.join(leak.buffers) or 'nothing'}, then {', '.join(twin.buffers) or 'nothing'}"
        leak.evidence = [line for line in leak.evidence if "padded rows write over live rows" in line
                         or line.startswith("told from the write's indices")]
        _name(leak, names, [f"the probe's experiments do not repeat their answer ({found}): the overwriting "
                            f"writes race, so only what the indices say is named"])
        leak.kinds.append("race")
        return
    leak.buffers = sorted(set(leak.buffers) | set(names))
    leak.kinds = sorted(set(leak.kinds) | {"overwrite"})
    leak.regions += [f"{name} padded entries naming elements live rows write" for name in names]
    leak.experiment = f"{leak.experiment}; and its indexed writes read" if leak.experiment else None


def route_regions(probe, owner, dispatch, run, leaking) -> tuple[dict, list[str]]:
    """{(buffer, kind) of a region: the index buffers that routed live rows into it} for the slot regions among
    `leaking`, and the evidence."""
    found, evidence = {}, []
    slot_regions = [r for r in leaking if r.kind in SLOT_REGIONS]
    if probe.routes is None or not slot_regions:
        return found, evidence
    plain, _, _ = _recorded(probe.routes, owner, run, [])
    for region in slot_regions:
        poisoned, _, _ = _recorded(probe.routes, owner, run, [region])
        names, why = probe.routes.routed(plain, poisoned, owner.buffers, dispatch, labels(owner))
        if names:
            found[(region.buffer, region.kind)], evidence = names, evidence + why
    return found, evidence
