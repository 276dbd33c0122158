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
from parity.engine.target_runner import TargetRunner


@dataclass(frozen=True)
class EngineParts:
    target_runner: type[TargetRunner] = TargetRunner
    target_builder: type[MetadataBuilder] = MetadataBuilder
    proposer: type[EagleProposer] = EagleProposer
    drafter_builder: type[MetadataBuilder] = MetadataBuilder
    records: type[Records] = Records

    def replace(self, **parts) -> "EngineParts":
        """These parts with some roles played by other classes."""
        return dataclasses.replace(self, **parts)
