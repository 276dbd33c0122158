"""The full read set of the reference forward at the divergence, by role.

The reference forward is re-run from its pre-state under a dispatch-mode
tracer that collects every storage its ops read; each storage is named by its
role: a buffer of the owner's registry, a tensor field of the metadata
object, the owner's KV cache, or an attribute path from the owner object
(`model.hf.model.rotary_emb.inv_freq`, a tensor the proposer keeps), whichever
object holds it. A role can be read through two holders at
once (RoPE reads the registry's positions, attention the metadata's): both
are kept. The graph's side is its capture manifest (same roles, with the
holder at capture). A role the reference reads is what a graph must read from the
live holder; roles the reference never reads cannot explain a divergence and
are never repaired (no innocent buffer gets named).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from parity.diagnose.lab import Divergence
from parity.diagnose.state import registry_of
from parity.graphs.manifest import object_tensors, role_name


class _Reads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(t, torch.Tensor) and t.numel():
                self.storages.add(t.untyped_storage().data_ptr())
        return func(*args, **(kwargs or {}))


def reference_reads(lab: Divergence) -> dict[str, set[str]]:
    """role name -> holders ("registry", "metadata object", "kv cache", "object") of every tensor the reference
    forward reads; traced once per lab (`lab.reads`)."""
    if lab.reads is None:
        lab.reads = _traced(lab)
    return lab.reads


def _traced(lab: Divergence) -> dict[str, set[str]]:
    ref, ev_r = lab.ref, lab.ev_r
    lab.restore("ref")
    tracer = _Reads()
    lab.replays += 1
    with tracer, torch.no_grad():
        lab.forward("ref")(ev_r.dispatch.num_tokens_padded, ev_r.dispatch.num_reqs_padded, ev_r.meta)
    lab.restore("ref")
    roles: dict[str, set[str]] = {}
    registry = registry_of(ref, ev_r.owner)
    for name, tensor in registry.items():
        if tensor.untyped_storage().data_ptr() in tracer.storages:
            roles.setdefault(name, set()).add("registry")
    for f in dataclasses.fields(ev_r.meta):
        value = getattr(ev_r.meta, f.name)
        if not isinstance(value, torch.Tensor) or value.untyped_storage().data_ptr() not in tracer.storages:
            continue
        held = registry[f.name] if f.name in registry else None
        if held is None or held.untyped_storage().data_ptr() != value.untyped_storage().data_ptr():
            roles.setdefault(f.name, set()).add("metadata object")
    cache = ref.owner(ev_r.owner).kv_cache.tensors()
    if any(t.untyped_storage().data_ptr() in tracer.storages for t in cache):
        roles["kv_cache"] = {"kv cache"}
    fields = [getattr(ev_r.meta, f.name) for f in dataclasses.fields(ev_r.meta)]
    named = {t.untyped_storage().data_ptr() for t in [*(t for _, t in registry.items()), *cache, *fields]
             if isinstance(t, torch.Tensor)}
    for path, tensor in object_tensors(ref.owner(ev_r.owner)):
        storage = tensor.untyped_storage().data_ptr()
        if storage in tracer.storages and storage not in named:
            named.add(storage)
            roles.setdefault(role_name(path), set()).add("object")
    return roles
