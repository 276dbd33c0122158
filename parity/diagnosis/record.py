"""What a diagnosis concludes: the kind, the buffers, where, and the evidence; one record for every layer.

`as_dict()` is what `parity bisect --json` prints and what `parity.audit`
hands its users (`GraphParityError.diagnosis`, `session.errors`): the keys
DIAGNOSIS_KEYS, in that order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from parity.diagnosis.kinds import MEANING


@dataclass
class Diagnosis:
    kind: str
    buffers: list[str]
    mode: str | None
    owner: str | None = None
    step: int | None = None
    phase: str | None = None
    draft_step: int | None = None
    forward_index: int | None = None
    rows: list[int] = field(default_factory=list)
    graph: dict | None = None
    captured_address: int | None = None
    live_address: int | None = None
    evidence: list[str] = field(default_factory=list)
    replays: int = 0
    max_abs_diff: float | None = None
    timing: dict | None = None
    experiment: str | None = None      # the one-variable experiment that restored bitwise parity
    ruled_out: list[str] = field(default_factory=list)   # experiments that did not
    also: list[str] = field(default_factory=list)        # less specific experiments that restored it too

    def __post_init__(self):
        if self.kind not in MEANING:
            raise ValueError(f"unknown diagnosis kind {self.kind!r} (known: {', '.join(MEANING)})")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


DIAGNOSIS_KEYS = tuple(f.name for f in dataclasses.fields(Diagnosis))
