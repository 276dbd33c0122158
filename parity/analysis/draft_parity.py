"""Drafter parity: the same draft context must give the same draft in every mode.

Greedy target output is lossless, so a broken drafter shows only in
acceptance, and acceptance needs many drafts to show a drop. The drafts
themselves are a sharper witness: a draft is a function of the verified tokens
and of the draft tokens before it in the same proposal, not of the schedule.
Proposals are aligned on (request, position of draft 0); within one, drafts
are compared while the chain of draft tokens agrees.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class DraftParity:
    compared: int               # drafts compared
    mismatches: int             # same context, another draft token
    max_abs_logprob_diff: float
    first_mismatch: dict | None
    # The target's logprob of its own choice at every verified row with the same context:
    # rows of rejected drafts included, which emitted tokens never show.
    max_abs_verify_logprob_diff: float = 0.0


def _chains(drafts: pd.DataFrame) -> dict[tuple[int, int], list[tuple[int, float]]]:
    chains: dict = {}
    for (req_id, step), rows in drafts.groupby(["req_id", "step"], sort=False):
        rows = rows.sort_values("draft_index")
        key = (int(req_id), int(rows["position"].iloc[0]))
        chains[key] = list(zip(rows["draft_token"].tolist(), rows["draft_logprob"].tolist(),
                               rows["target_logprob"].tolist()))
    return chains


def draft_parity(reference: pd.DataFrame, run: pd.DataFrame) -> DraftParity:
    """Compare the drafts of two runs wherever they drafted from the same context."""
    ref, other = _chains(reference), _chains(run)
    compared = mismatches = 0
    worst, worst_verify, first = 0.0, 0.0, None
    for key in sorted(ref.keys() & other.keys()):
        for index, ((tok_a, lp_a, tl_a), (tok_b, lp_b, tl_b)) in enumerate(zip(ref[key], other[key])):
            compared += 1
            # row `index` of the verify query holds the drafts before it: same context so far
            worst_verify = max(worst_verify, abs(tl_a - tl_b))
            if tok_a != tok_b:
                mismatches += 1
                if first is None:
                    first = {"req_id": key[0], "position": key[1] + index, "draft_index": index,
                             "eager_token": int(tok_a), "mode_token": int(tok_b)}
                break
            worst = max(worst, abs(lp_a - lp_b))
    return DraftParity(compared, mismatches, worst, first, worst_verify)
