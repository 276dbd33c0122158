"""Acceptance metrics with vLLM's definitions.

A draft is one proposal of K tokens for one request in one step. Position i's
acceptance rate is the fraction of drafts whose first i+1 tokens were all
accepted (`vllm:spec_decode_num_accepted_tokens_per_pos` / num_drafts). Mean
acceptance length is 1 + accepted / drafts, the bonus token included.

A tree draft (docs/tree.md) may keep no node at some depth in any of its
drafts: `nodes_per_position` counts the drafts that had a node there, and a
position with none has no rate (None), not a rate of 0: nothing was rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Acceptance:
    num_drafts: int
    accepted_per_position: tuple[int, ...]    # counts
    nodes_per_position: tuple[int, ...] | None = None    # drafts with a node there; None: every draft had one

    @property
    def k(self) -> int:
        return len(self.accepted_per_position)

    @property
    def rates(self) -> tuple[float, ...]:
        if not self.num_drafts:
            return tuple(0.0 for _ in self.accepted_per_position)
        return tuple(c / self.num_drafts for c in self.accepted_per_position)

    def has_node(self, position: int) -> bool:
        """False for a position no draft had a node at (its rate is no rate); True without node counts."""
        return self.nodes_per_position is None or self.nodes_per_position[position] > 0

    @property
    def shown_rates(self) -> list[float | None]:
        """The rates a summary shows: None where no draft had a node."""
        return [r if self.has_node(i) else None for i, r in enumerate(self.rates)]

    @property
    def num_accepted(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted / self.num_drafts if self.num_drafts else 0.0


def acceptance(drafts: pd.DataFrame, k: int) -> Acceptance:
    """Per-position acceptance counts from the draft records of one run."""
    per_draft = drafts.drop_duplicates(["step", "req_id"])
    counts = [int((per_draft["num_accepted"] > i).sum()) for i in range(k)]
    nodes = drafts.drop_duplicates(["step", "req_id", "draft_index"])["draft_index"]
    return Acceptance(len(per_draft), tuple(counts), tuple(int((nodes == i).sum()) for i in range(k)))


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (0, 0 when there are no trials)."""
    if trials == 0:
        return 0.0, 0.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
