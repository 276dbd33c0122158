"""What an audit concludes, as plain data: the diagnosis dict, the error that carries it, findings.

The dict is `Diagnosis.as_dict()` (parity/diagnosis/record.py), the record
`parity bisect --json` prints: the keys DIAGNOSIS_KEYS (kind, buffers, mode,
owner, step, phase, draft_step, forward_index, rows, graph, captured_address,
live_address, evidence, replays, max_abs_diff, timing, experiment, ruled_out,
also).
"""

from __future__ import annotations

from parity.diagnosis.kinds import (BUFFER_REASSIGNED, CAPTURE_CONTEXT, DESCRIPTOR_MISMATCH, FROZEN_AT_CAPTURE,
                                    NOT_REFRESHED, OUTPUT_ALIASED, PADDING_LEAK, POOL_ALIAS, STALE_BUFFER,
                                    UNEXPLAINED, WRONG_GRAPH)
from parity.diagnosis.record import Diagnosis

# The kinds the audit emits (docs/audit.md's table lists exactly these).
KINDS = (STALE_BUFFER, BUFFER_REASSIGNED, FROZEN_AT_CAPTURE, PADDING_LEAK, POOL_ALIAS, OUTPUT_ALIASED,
         CAPTURE_CONTEXT, DESCRIPTOR_MISMATCH, WRONG_GRAPH, NOT_REFRESHED, UNEXPLAINED)


def make_diagnosis(kind: str, buffers, *, owner: str, replay: int, graph: dict | None = None, rows=(),
                   captured_address: int | None = None, live_address: int | None = None, evidence=(),
                   replays: int = 0, max_abs_diff: float | None = None, timing: dict | None = None,
                   experiment: str | None = None, ruled_out=(), also=(), phase: str = "replay") -> dict:
    """A diagnosis dict with the keys of `parity bisect --json`: the one-variable experiment that restored
    parity, those that did not (`ruled_out`) and the less specific ones that restored it too (`also`).

    `owner` is the audit's name, `replay` the 1-based replay of that graph at
    which the audit found the problem (reported as `step` and `forward_index`),
    `replays` how many extra replays and re-captures the experiments used.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown diagnosis kind {kind!r}")
    return Diagnosis(kind, list(buffers), "full", owner=owner, step=replay, phase=phase, forward_index=replay,
                     rows=list(rows), graph=graph, captured_address=captured_address, live_address=live_address,
                     evidence=list(evidence), replays=replays, max_abs_diff=max_abs_diff, timing=timing,
                     experiment=experiment, ruled_out=list(ruled_out), also=list(also)).as_dict()


class GraphParityError(AssertionError):
    """A graph replay that is not bitwise equal to its callable run eagerly, with the diagnosis.

    `error.diagnosis` is the dict (see `make_diagnosis`); `error.kind` and
    `error.buffers` are shortcuts to its first two keys.
    """

    def __init__(self, diagnosis: dict):
        self.diagnosis = diagnosis
        super().__init__(summary(diagnosis))

    @property
    def kind(self) -> str:
        return self.diagnosis["kind"]

    @property
    def buffers(self) -> list[str]:
        return self.diagnosis["buffers"]


class GraphAuditWarning(UserWarning):
    """A cheap check's suspicion that is not an error by itself (NOT_REFRESHED)."""


def summary(d: dict) -> str:
    """One line: 'KIND (buffers) in graph OWNER at replay N: first evidence'."""
    named = f" ({', '.join(d['buffers'])})" if d.get("buffers") else ""
    first = f": {d['evidence'][0]}" if d.get("evidence") else ""
    return f"{d['kind']}{named} in graph {d.get('owner')!r} at replay {d.get('step')}{first}"
