"""Checksums that tell model checkpoints apart without reading gigabytes.

Reports, summaries and gate baselines name the weights a run used by a short
sha256. Two checkpoints of one architecture share their config files, so the
weights themselves must count, yet reading 16 GB per run is not an option:
`checkpoint_checksum` hashes every JSON file in full, and of each weights file
its name, size, safetensors header (every tensor's name, dtype, shape and
offsets) and its first and last MiB (different seeds or training steps differ
there).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MIB = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_MAX_HEADER = 100 * MIB      # a larger "header length" is not a safetensors header


def config_checksum(folders) -> str:
    """The embedded pairs' checksum: their JSON files plus a model.safetensors under 64 MiB.

    NOTE: kept byte for byte as it was: committed goldens and gate baselines pin its value.
    """
    digest = hashlib.sha256()
    for folder in folders:
        folder = Path(folder)
        for path in sorted(folder.glob("*.json")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        weights = folder / "model.safetensors"
        if weights.is_file() and weights.stat().st_size < 64 << 20:
            digest.update(weights.read_bytes())
    return digest.hexdigest()[:16]


def _hash_weights(digest, path: Path) -> None:
    size = path.stat().st_size
    digest.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        if path.suffix == ".safetensors" and size >= 8:
            header_len = int.from_bytes(f.read(8), "little")
            if header_len <= min(size - 8, _MAX_HEADER):
                digest.update(f.read(header_len))
        f.seek(0)
        digest.update(f.read(MIB))
        if size > MIB:
            f.seek(max(MIB, size - MIB))
            digest.update(f.read(MIB))


def checkpoint_checksum(folders) -> str:
    """16 hex digits of sha256 over the checkpoints in `folders` (see the module docstring)."""
    digest = hashlib.sha256()
    for folder in folders:
        digest.update(b"\0folder\0")     # the same files split differently between target and head differ
        for path in sorted(Path(folder).iterdir()):
            if not path.is_file():
                continue
            if path.suffix == ".json":
                digest.update(path.name.encode() + b"\0")
                digest.update(path.read_bytes())
            elif path.name.endswith(WEIGHT_SUFFIXES):
                _hash_weights(digest, path)
    return digest.hexdigest()[:16]
