"""The capture manifest: per graph, every named persistent buffer it reads.

Recorded at capture (name, storage address, shape, dtype). `audit` compares it
with the live buffer registry: a different address means the buffer was
reassigned behind the graph's back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ManifestEntry:
    owner: str
    name: str
    address: int
    shape: tuple[int, ...]
    dtype: str
    tensor: object = field(default=None, repr=False, compare=False)   # the captured tensor itself

    def as_dict(self) -> dict:
        return {"owner": self.owner, "name": self.name, "address": self.address, "shape": list(self.shape),
                "dtype": self.dtype}


@dataclass(frozen=True)
class AuditFinding:
    owner: str
    name: str
    captured_address: int
    live_address: int

    def as_dict(self) -> dict:
        return asdict(self)


def build_manifest(read_storages: set[int], registries) -> tuple[ManifestEntry, ...]:
    """Entries for every registered buffer whose storage the graph touched."""
    entries = []
    for registry in registries:
        for name, tensor in registry.items():
            if tensor.untyped_storage().data_ptr() in read_storages:
                entries.append(ManifestEntry(registry.owner, name, tensor.data_ptr(), tuple(tensor.shape),
                                             str(tensor.dtype).replace("torch.", ""), tensor))
    return tuple(entries)


def audit(manifest, registries) -> list[AuditFinding]:
    """Manifest entries whose live buffer now sits at another address."""
    live = {(r.owner, name): t for r in registries for name, t in r.items()}
    findings = []
    for entry in manifest:
        tensor = live.get((entry.owner, entry.name))
        if tensor is not None and tensor.data_ptr() != entry.address:
            findings.append(AuditFinding(entry.owner, entry.name, entry.address, tensor.data_ptr()))
    return findings
