"""What a bisection concludes: the bug class, the buffers, where, and the evidence."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class Diagnosis:
    kind: str
    buffers: list[str]
    mode: str
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

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
