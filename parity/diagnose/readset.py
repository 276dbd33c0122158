"""The full read set (and write set) of the reference forward at the divergence, by role.

The reference forward is re-run from its pre-state under the audit's tracer
(`audit.trace.touched`: the storages a call reads and writes of the memory
that existed before it, as the audit traces a capture); each storage is named
by its role (`storage_roles` below, the naming `Divergence.name` gives): a
buffer of the owner's registry, a tensor field of the metadata object, the
owner's KV cache, or an attribute path from the owner object
(`model.hf.model.rotary_emb.inv_freq`, a tensor the proposer keeps), whichever
object holds it. A role can be read through two holders at once (RoPE reads
the registry's positions, attention the metadata's): both are kept. The
graph's side is its capture manifest (same roles, with the holder at
capture). A role the reference reads is what a graph must read from the live
holder; roles the reference never reads cannot explain a divergence and
are never repaired (no innocent buffer gets named).
"""

from __future__ import annotations

import dataclasses

import torch

from parity.audit.trace import touched
from parity.graphs.manifest import object_tensors, role_name


def reference_reads(lab) -> dict[str, set[str]]:
    """role name -> holders ("registry", "metadata object", "kv cache", "object") of every tensor the reference
    forward reads; traced once per lab (`lab.reads`, and `lab.ref_writes`: the roles it writes)."""
    return _traced(lab).reads


def reference_writes(lab) -> set[str]:
    """The roles the reference forward writes in place (its KV cache, the buffers it fills)."""
    return _traced(lab).ref_writes


def graph_writes(lab) -> set[str]:
    """The roles the graph the forward replayed writes in its captured pieces, named on the graph run."""
    return set(by_role(lab.entry.graph.write_storages, storage_roles(lab.graph, lab.ev_g)))


def _traced(lab):
    if lab.reads is not None:
        return lab
    ev_r, d = lab.ev_r, lab.ev_r.dispatch
    lab.restore("ref")
    lab.replays += 1
    reads, writes = touched(lambda: lab.forward("ref")(d.num_tokens_padded, d.num_reqs_padded, ev_r.meta))
    lab.restore("ref")
    named = storage_roles(lab.ref, ev_r)
    lab.reads, lab.ref_writes = by_role(reads, named), set(by_role(writes, named))
    return lab


def by_role(storages, named: dict) -> dict[str, set[str]]:
    """role -> holders of each of `storages` (`storage_roles`: storage -> [(role, holder)]); unnamed ones drop."""
    found: dict[str, set[str]] = {}
    for storage in storages:
        for role, holder in named.get(storage, ()):
            found.setdefault(role, set()).add(holder)
    return found


def storage_roles(engine, event) -> dict[int, list[tuple[str, str]]]:
    """storage -> (role, holder) of every tensor the forward's owner can hand a kernel: its registry's buffers,
    the metadata object's tensors (when not the same-named buffer's), its KV cache, its attributes."""
    found: dict[int, list[tuple[str, str]]] = {}

    def add(tensor, role, holder):
        found.setdefault(tensor.untyped_storage().data_ptr(), []).append((role, holder))

    registry = engine.owner(event.owner).buffers
    for name, tensor in registry.items():
        add(tensor, name, "registry")
    fields = [(f.name, getattr(event.meta, f.name)) for f in dataclasses.fields(event.meta)]
    for name, value in fields:
        held = registry[name] if name in registry else None
        if isinstance(value, torch.Tensor) and (
                held is None or held.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()):
            add(value, name, "metadata object")
    cache = engine.owner(event.owner).kv_cache.tensors()
    for tensor in cache:
        add(tensor, "kv_cache", "kv cache")
    taken = set(found)
    for path, tensor in object_tensors(engine.owner(event.owner)):
        if tensor.untyped_storage().data_ptr() not in taken:
            taken.add(tensor.untyped_storage().data_ptr())
            add(tensor, role_name(path), "object")
    return found
