"""Audit a divergent forward's captured buffers and confirm suspects by repair-and-replay.

Suspects come from the capture manifest: a buffer whose name now points at
another tensor (BUFFER_REASSIGNED), a captured buffer holding other values
than the reference forward used (STALE_BUFFER), a padded entry that is not inert
(PADDING_LEAK). Each suspect carries its repair: the values to copy into the
captured tensor. Delta debugging keeps the smallest set of repairs that
restores parity.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from parity.analysis.kinds import BUFFER_REASSIGNED, PADDING_LEAK, STALE_BUFFER
from parity.engine.buffers import ROW, ROW_PLUS_ONE, TOKEN
from parity.diagnose.state import executor_of, forward_fn, registry_of, restore
from parity.diagnose.delta_debug import ddmin

_INDEX_ORDER = (TOKEN, ROW, ROW_PLUS_ONE)
# The kind a diagnosis names when repairs of several kinds are needed together.
_PRECEDENCE = (BUFFER_REASSIGNED, PADDING_LEAK, STALE_BUFFER)


class Suspect(NamedTuple):
    kind: str
    name: str
    tensor: torch.Tensor     # where the graph reads
    region: slice
    value: torch.Tensor      # what repairing it writes there


def find_suspects(ref, graph, ev_r, ev_g, snaps, entry) -> list[Suspect]:
    """Every captured buffer that differs from what the reference used, and every non-inert padded entry."""
    dispatch = ev_g.dispatch
    registry = dict(registry_of(graph, ev_g.owner).items())
    ref_registry = registry_of(ref, ev_r.owner)
    ref_meta = snaps["ref"]["meta"]
    ref_state = dict(zip([id(t) for t in snaps["ref"]["live"]], snaps["ref"]["saved"]))
    graph_state = dict(zip([id(t) for t in snaps["graph"]["live"]], snaps["graph"]["saved"]))

    def eager_value(name):
        if name in ref_meta:
            return ref_meta[name]
        live = ref_registry[name]
        return ref_state.get(id(live), live)

    found = []
    graph_registry = registry_of(graph, ev_g.owner)
    for e in entry.manifest:
        captured = e.tensor
        before = graph_state.get(id(captured), captured)   # unregistered (reassigned): as it is
        live = registry.get(e.name)
        region = graph_registry.spec(e.name).used(dispatch.num_tokens, dispatch.num_reqs)
        used = eager_value(e.name)
        if region.stop is not None and (used.shape[0] < region.stop or before.shape[0] < region.stop):
            continue
        if live is not None and live.data_ptr() != e.address:
            found.append(Suspect(BUFFER_REASSIGNED, e.name, captured, region, used[region]))
        elif before[region].shape == used[region].shape and not torch.equal(before[region], used[region]):
            found.append(Suspect(STALE_BUFFER, e.name, captured, region, used[region]))
    contract = [name for name in registry if graph_registry.spec(name).inert]
    # Token entries first, then rows: the finest-grained padding is suspected first.
    contract.sort(key=lambda name: _INDEX_ORDER.index(graph_registry.spec(name).index))
    for name in contract:
        spec = graph_registry.spec(name)
        region = spec.padded(dispatch)
        if region.stop <= region.start:
            continue
        inert = spec.inert_value(dispatch.num_tokens)
        held = (registry.get(name), getattr(ev_g.meta, name, None))
        for tensor in {id(t): t for t in held if t is not None}.values():
            before = graph_state.get(id(tensor), tensor)
            if before.dim() and (before[region] != inert).any():
                found.append(Suspect(PADDING_LEAK, name, tensor, region, torch.full_like(before[region], inert)))
    # A buffer flagged twice (padding and value) is repaired by both entries.
    return list({(s.kind, s.name, id(s.tensor)): s for s in found}.values())


def confirm(bisector, graph, ev_g, snaps, out_r, suspects: list[Suspect]) -> list[Suspect]:
    """The smallest set of repairs after which the replay matches eager; [] when none does."""
    executor = executor_of(graph, ev_g.owner)
    fn = forward_fn(graph, ev_g.owner, ev_g.phase)

    def replay_with(subset) -> bool:
        restore(snaps["graph"])
        for s in subset:
            s.tensor[s.region].copy_(s.value)
        return bisector.replay_matches(graph, ev_g, executor, fn, out_r)

    if not suspects or not replay_with(suspects):
        return []
    return ddmin(suspects, replay_with)


def explain(bisector, graph, ev_g, culprits: list[Suspect], entry, **where):
    """The diagnosis for confirmed culprits."""
    kinds = {s.kind for s in culprits}
    kind = next(k for k in _PRECEDENCE if k in kinds)
    names = sorted({s.name for s in culprits})
    first = next((e for e in entry.manifest if e.name == names[0]), None)
    live = dict(registry_of(graph, ev_g.owner).items()).get(names[0])
    evidence = [f"{s.kind.lower()}: {s.name}" for s in culprits]
    evidence.append(f"copying the padded reference's values of {', '.join(names)} into the captured buffers "
                    "and replaying restores bitwise parity")
    return bisector.diagnosis(kind, names, ev_g, captured=first.address if first else None,
                              live=live.data_ptr() if live is not None else None, evidence=evidence, **where)
