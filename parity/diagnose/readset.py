"""The full read set of the reference forward at the divergence, by role.

The reference forward is re-run from its pre-state under a dispatch-mode
tracer that collects every storage its ops read; each storage is named by its
role: a buffer of the owner's registry, or a tensor field of the metadata
object. The graph's side is its capture manifest (same roles, with the holder
at capture). A role the reference reads is what a graph must read from the
live holder; roles the reference never reads cannot explain a divergence and
are never repaired (no innocent buffer gets named).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from parity.diagnose.state import forward_fn, registry_of, restore


class _Reads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(t, torch.Tensor) and t.numel():
                self.storages.add(t.untyped_storage().data_ptr())
        return func(*args, **(kwargs or {}))


def reference_reads(bisector, ref, ev_r, snap) -> dict[str, str]:
    """role name -> holder ("registry" or "metadata object") of every tensor the reference forward reads."""
    restore(snap)
    tracer = _Reads()
    bisector.replays += 1
    with tracer, torch.no_grad():
        forward_fn(ref, ev_r.owner, ev_r.phase)(ev_r.dispatch.num_tokens_padded, ev_r.dispatch.num_reqs_padded,
                                                ev_r.meta)
    restore(snap)
    roles = {}
    for name, tensor in registry_of(ref, ev_r.owner).items():
        if tensor.untyped_storage().data_ptr() in tracer.storages:
            roles[name] = "registry"
    for f in dataclasses.fields(ev_r.meta):
        value = getattr(ev_r.meta, f.name)
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in tracer.storages:
            roles.setdefault(f.name, "metadata object")
    return roles
