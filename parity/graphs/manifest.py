"""The capture manifest: per graph, every named tensor it reads, with who held it at capture.

Recorded at capture (name, storage address, shape, dtype, holder): the
registered persistent buffers it touched ("registry"), the tensors of the
capture-time metadata object it touched that no registry owns ("metadata": a
placeholder, or a tensor a builder made for that one batch), and the KV cache
tensors it read or wrote ("kv cache", role `kv_cache`, with the tensor's index
in the cache), and every other tensor it read that the owner object reaches
through its attributes ("object": the model's weights and buffers, a tensor the
proposer keeps), named by the attribute path (`model.hf.model.rotary_emb.inv_freq`).
`audit` compares
the registry entries with the live registry: a different address means the
buffer was reassigned behind the graph's back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

import torch

from parity.graphs.roles import resolve, walk

OBJECT_ROOT = "self"
OBJECT_DEPTH = 12     # deep enough for `model.hf.model.layers[31].self_attn.qkv_proj.weight`


@dataclass(frozen=True)
class ManifestEntry:
    owner: str
    name: str
    address: int
    shape: tuple[int, ...]
    dtype: str
    tensor: object = field(default=None, repr=False, compare=False)   # the captured tensor itself
    holder: str = "registry"         # "registry", "metadata" (only the metadata object held it), "kv cache", "object"
    index: int = -1                  # for the KV cache: the tensor's place in `PagedKVCache.tensors()`
    path: object = field(default=None, repr=False, compare=False)   # "object": the roles.Path from the owner

    def as_dict(self) -> dict:
        return {"owner": self.owner, "name": self.name, "address": self.address, "shape": list(self.shape),
                "dtype": self.dtype, "holder": self.holder}


@dataclass(frozen=True)
class AuditFinding:
    owner: str
    name: str
    captured_address: int
    live_address: int

    def as_dict(self) -> dict:
        return asdict(self)


def build_manifest(read_storages: set[int], registries, meta=None, held=()) -> tuple[ManifestEntry, ...]:
    """Entries for every registered buffer, every tensor of `meta` no registry owns, the KV cache, and every
    tensor the owner object held through its attributes as the capture began (`held`: `object_tensors`), that
    the graph touched."""
    entries, owned = [], set()
    for registry in registries:
        for name, tensor in registry.items():
            owned.add(tensor.untyped_storage().data_ptr())
            if tensor.untyped_storage().data_ptr() in read_storages:
                entries.append(_entry(registry.owner, name, tensor, "registry"))
    owner = registries[0].owner if registries else ""
    for name, tensor in _tensor_fields(meta):
        storage = tensor.untyped_storage().data_ptr()
        if storage in read_storages and storage not in owned:
            entries.append(_entry(owner, name, tensor, "metadata"))
    cache = getattr(meta, "kv_cache", None)
    for i, tensor in enumerate(cache.tensors() if cache is not None else ()):
        if tensor.untyped_storage().data_ptr() in read_storages:
            entries.append(_entry(owner, "kv_cache", tensor, "kv cache", i))
    named = owned | {e.tensor.untyped_storage().data_ptr() for e in entries}
    views: dict[int, set] = {}      # storage -> the layouts of it an "object" entry holds
    for path, tensor in held:
        storage = tensor.untyped_storage().data_ptr()
        if storage not in read_storages or (storage in named and storage not in views):
            continue
        # NOTE: every other view of a storage too (a buffer cut from a workspace): a later rebinding of one
        # view to another part of the same storage is seen only so. Weights are not views that move.
        if storage in views and (isinstance(tensor, torch.nn.Parameter) or _layout(tensor) in views[storage]):
            continue
        named.add(storage)
        if not isinstance(tensor, torch.nn.Parameter):
            views.setdefault(storage, set()).add(_layout(tensor))
        entries.append(dataclasses.replace(_entry(owner, role_name(path), tensor, "object"), path=path))
    return tuple(entries)


def _layout(tensor) -> tuple:
    return tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype


def object_tensors(holder) -> list:
    """(path, tensor) for every tensor the owner object reaches through its attributes, shortest path first."""
    if holder is None:
        return []
    return [(path, value) for path, value in walk({OBJECT_ROOT: holder}, max_depth=OBJECT_DEPTH)
            if isinstance(value, torch.Tensor) and value.numel()]


def role_name(path) -> str:
    """An attribute path from the owner object, as a role: `model.hf.model.rotary_emb.inv_freq`."""
    return str(path).removeprefix(OBJECT_ROOT + ".")


def live_object_tensor(entry: ManifestEntry, holder):
    """The tensor an "object" entry's path reaches on the live owner object now; None if none."""
    value = resolve(entry.path, {OBJECT_ROOT: holder})
    return value if isinstance(value, torch.Tensor) else None


def _entry(owner: str, name: str, tensor, holder: str, index: int = -1) -> ManifestEntry:
    return ManifestEntry(owner, name, tensor.data_ptr(), tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""),
                         tensor, holder, index)


def _tensor_fields(meta) -> list:
    if meta is None or not dataclasses.is_dataclass(meta):
        return []
    fields = [(f.name, getattr(meta, f.name)) for f in dataclasses.fields(meta)]
    return [(name, value) for name, value in fields if hasattr(value, "untyped_storage")]


def audit(manifest, registries) -> list[AuditFinding]:
    """Manifest entries whose live buffer now sits at another address."""
    live = {(r.owner, name): t for r in registries for name, t in r.items()}
    findings = []
    for entry in manifest:
        if entry.holder != "registry":
            continue
        tensor = live.get((entry.owner, entry.name))
        if tensor is not None and tensor.data_ptr() != entry.address:
            findings.append(AuditFinding(entry.owner, entry.name, entry.address, tensor.data_ptr()))
    return findings
