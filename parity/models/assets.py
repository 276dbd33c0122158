"""The committed model assets under parity/assets/ and their checksum manifest.

`MANIFEST.json` maps every asset file's path (relative to the assets root,
POSIX separators) to its sha256 and size, so a clone can prove it holds the
exact weights the project built.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ASSETS_ROOT = Path(__file__).resolve().parent.parent / "assets"
MANIFEST = "MANIFEST.json"
TINY_PAIR = "tiny-llama3-eagle"


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _asset_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and p.name != MANIFEST and "__pycache__" not in p.parts)


def write_manifest(assets_root: Path = ASSETS_ROOT) -> dict:
    """Write `assets_root/MANIFEST.json` for every file below it; returns the mapping."""
    root = Path(assets_root)
    files = {p.relative_to(root).as_posix(): {"sha256": _sha256(p), "size": p.stat().st_size}
             for p in _asset_files(root)}
    (root / MANIFEST).write_text(json.dumps(files, indent=2, sort_keys=True) + "\n")
    return files


def verify_manifest(assets_root: Path = ASSETS_ROOT) -> list[str]:
    """Problems found comparing the files under `assets_root` with its manifest (empty: all good)."""
    root = Path(assets_root)
    manifest_file = root / MANIFEST
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{manifest_file}: unreadable ({' '.join(str(exc).split())})"]
    problems = []
    for rel, entry in sorted(manifest.items()):
        file = root / rel
        if not file.is_file():
            problems.append(f"{rel}: missing")
        elif file.stat().st_size != entry.get("size"):
            problems.append(f"{rel}: size {file.stat().st_size}, manifest says {entry.get('size')}")
        elif _sha256(file) != entry.get("sha256"):
            problems.append(f"{rel}: sha256 differs from the manifest")
    for file in _asset_files(root):
        rel = file.relative_to(root).as_posix()
        if rel not in manifest:
            problems.append(f"{rel}: not in the manifest")
    return problems


def tiny_pair_dir(assets_root: Path = ASSETS_ROOT) -> Path:
    return Path(assets_root) / TINY_PAIR
