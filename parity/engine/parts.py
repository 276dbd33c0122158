"""The parts an engine is assembled from: which class plays each role.

A user's engine is `EngineParts()`. A variant (a planted bug, an experiment)
is the same engine with one part replaced by a subclass that overrides one
named step; the engine itself never learns why a part was replaced.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from parity.engine.metadata import MetadataBuilder
from parity.engine.proposer import EagleProposer
from parity.engine.records import Records
from parity.engine.staging import Stager
from parity.engine.target_runner import TargetRunner


@dataclass(frozen=True)
class EngineParts:
    target_runner: type[TargetRunner] = TargetRunner
    target_builder: type[MetadataBuilder] = MetadataBuilder
    proposer: type[EagleProposer] = EagleProposer
    drafter_builder: type[MetadataBuilder] = MetadataBuilder
    records: type[Records] = Records
    stager: type[Stager] = Stager        # the overlapped loop's host staging (`overlap.py`)
    # NOTE: how far these parts' padded forwards are declared to move the logits beyond the dtype's own rounding
    # (the padding-numerics yardstick widens by twice it); the numerics seam declares its scale here.
    padding_numerics: float = 0.0

    def replace(self, **parts) -> "EngineParts":
        """These parts with some roles played by other classes (or another declared `padding_numerics`)."""
        return dataclasses.replace(self, **parts)

    def roles(self) -> dict[str, type]:
        """role -> the class that plays it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), type)}
