"""What the eager run writes that the graph never does: a write skipped when the graph was captured.

The capture's tracer recorded every external storage the captured ops write
(`CaptureRecord.writes`); the shadow run's undo log, every storage the
callable run eagerly on the live inputs writes. A storage only the eager run
writes is a write the graph cannot perform at any replay: the code that makes
it did not run at capture (a branch on an input that was absent then). Each is
named by the shortest path from the callable's roots that reaches it now.
"""

from __future__ import annotations

import torch

from parity.audit.trace import storage_ptr
from parity.graphs.roles import walk


def skipped_writes(lab) -> list[str]:
    """Names of the storages the eager run writes and the captured graph never writes."""
    missing = [ptr for ptr in lab.eager.writes if ptr not in lab.record.writes]
    if not missing:
        return []
    names: dict[int, str] = {}
    for path, value in walk(lab.roots):
        if isinstance(value, torch.Tensor) and value.numel() and storage_ptr(value) in missing:
            names.setdefault(storage_ptr(value), str(path))
    return [names.get(ptr, f"storage 0x{ptr:x}") for ptr in missing]


def absent_evidence(name: str, skipped: list[str], writer: str) -> list[str]:
    """What an input absent (None) at capture explains: the work that reads it is not in the graph, and the
    writes `writer` ("the eager run", "the reference forward") performs that the captured graph never does."""
    evidence = [f"{name} was None when the graph was captured and holds a tensor now: what reads it never ran at "
                "capture, and a replay runs no Python"]
    if skipped:
        evidence.append(f"{writer} writes {', '.join(skipped)}; the captured graph never writes "
                        f"{'it' if len(skipped) == 1 else 'them'}")
    return evidence
