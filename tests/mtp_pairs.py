"""Tiny synth pairs of the MTP heads, built once per session (`parity.commands.matrix.tiny_pair`: what the
mutation matrix runs a fault with a `head` on)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from parity.commands.matrix import tiny_pair

_BUILT: dict[str, tuple[Path, Path]] = {}


def synth_pair(head: str) -> tuple[Path, Path]:
    """(target folder, draft folder) of the tiny pair `head` names: "mtp-deepseek [--mtp-layers N]"."""
    if head not in _BUILT:
        _BUILT[head] = tiny_pair(head, Path(tempfile.mkdtemp(prefix="parity-synth-")) / "pair")
    return _BUILT[head]
