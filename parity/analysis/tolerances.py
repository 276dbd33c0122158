"""The thresholds of a verdict, as a scenario file states them (README, 'Scenario files')."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerances:
    logprob_abs: float = 1e-3         # max |target logprob(graph) - logprob(eager)| on equal tokens
    acceptance_min_effect: float = 0.05  # smallest per-position acceptance drop that counts as drift
    alpha: float = 0.01               # family-wise significance of the acceptance tests
    require_token_parity: bool = True  # greedy: graph tokens must equal eager tokens
    require_draft_parity: bool = True  # drafts from the same context must equal eager's
