"""What the eager run writes that the graph never does: a write skipped when the graph was captured.

The capture's tracer recorded every external storage the captured ops write
(`CaptureRecord.writes`); the shadow run's undo log, every storage the
callable run eagerly on the live inputs writes. A storage only the eager run
writes is a write the graph cannot perform at any replay: the code that makes
it did not run at capture (a branch on an input that was absent then). Each is
named by the lab (`lab.name`: the shortest path from the callable's roots that reaches it now).
"""

from __future__ import annotations


def skipped_writes(lab) -> list[str]:
    """Names of the storages the eager run writes and the captured graph never writes."""
    missing = [ptr for ptr in lab.eager.writes if ptr not in lab.record.writes]
    # NOTE: the pre-state holds every storage the eager run wrote (the shadow run's undo log is merged into it).
    return [(lab.name(lab.pre.saved[ptr][0]) if ptr in lab.pre.saved else None) or f"storage 0x{ptr:x}"
            for ptr in missing]


def absent_evidence(name: str, skipped: list[str], writer: str) -> list[str]:
    """What an input absent (None) at capture explains: the work that reads it is not in the graph, and the
    writes `writer` ("the eager run", "the reference forward") performs that the captured graph never does."""
    evidence = [f"{name} was None when the graph was captured and holds a tensor now: what reads it never ran at "
                "capture, and a replay runs no Python"]
    if skipped:
        evidence.append(f"{writer} writes {', '.join(skipped)}; the captured graph never writes "
                        f"{'it' if len(skipped) == 1 else 'them'}")
    return evidence
