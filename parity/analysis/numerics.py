"""Padding numerics: a mode's strict padded reference against plain eager. Reported, never a verdict.

The same maths at another padded shape rounds differently (in bf16 on a GPU
it does; on these CPUs it does not). That moves logprobs a little and, at a
near tie, flips a greedy token, after which the two streams part for good.
What is comparable is compared: emitted tokens and drafts whose context is
still the same in both runs. A flip is a near tie when eager's own top-1 /
top-2 gap there is within the fixed padding-numerics bound of the dtype
(`yardstick`): noise that size can swap the two. Departures beyond the bound
are not numerics: the comparison calls them a drift.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from parity.analysis.draft_parity import draft_parity
from parity.analysis.streams import same_context, stream_splits

MAX_LISTED = 20


@dataclass(frozen=True)
class Numerics:
    reference: str
    max_abs_logprob_diff: float         # target logprobs: same-context emitted tokens and verify rows
    max_abs_draft_logprob_diff: float
    token_flips: int                    # requests whose token streams parted
    draft_flips: int                    # same-context proposals with another draft token
    drafts_compared: int
    near_ties: int                      # flips explained by a near tie in eager
    first_token_divergence: dict | None
    flips: tuple = ()                   # each: kind, request, position, index, eager's top-2 gap, near tie
    bound: float = float("inf")         # the yardstick: the dtype's padding-numerics bound

    @property
    def noise(self) -> float:
        return max(self.max_abs_logprob_diff, self.max_abs_draft_logprob_diff)

    def as_dict(self) -> dict:
        return {"reference": self.reference, "max_abs_logprob_diff": self.max_abs_logprob_diff,
                "max_abs_draft_logprob_diff": self.max_abs_draft_logprob_diff, "token_flips": self.token_flips,
                "draft_flips": self.draft_flips, "drafts_compared": self.drafts_compared,
                "near_ties": self.near_ties, "first_token_divergence": self.first_token_divergence,
                "flips": list(self.flips[:MAX_LISTED]), "bound": self.bound}

    @property
    def beyond_bound(self) -> bool:
        return self.noise > self.bound


def _same_context_logprob_diff(eager: pd.DataFrame, other: pd.DataFrame, splits: dict) -> float:
    merged = eager.merge(other, on=["req_id", "output_index"], suffixes=("_e", "_o"))
    merged = merged[same_context(merged, splits)]
    return float((merged.logprob_e - merged.logprob_o).abs().max()) if len(merged) else 0.0


def numerics(reference_run, eager_run, name: str, bound: float) -> Numerics:
    """What padding numerics did to `reference_run` (a padded reference) relative to plain eager, judged
    with the fixed `bound` (`yardstick.Yardstick.bound`)."""
    splits = stream_splits(eager_run.tokens, reference_run.tokens)
    drafts = draft_parity(eager_run.drafts, reference_run.drafts,
                          {r: s["position"] for r, s in splits.items()})
    noise = max(_same_context_logprob_diff(eager_run.tokens, reference_run.tokens, splits),
                drafts.max_abs_verify_logprob_diff)
    flips = [{"kind": "token", "req_id": s["req_id"], "position": s["position"], "index": s["output_index"],
              "eager_gap": s["eager_gap"], "near_tie": s["eager_gap"] is not None and s["eager_gap"] <= bound}
             for s in splits.values()]
    flips += [{"kind": "draft", "req_id": f["req_id"], "position": f["position"], "index": f["draft_index"],
               "eager_gap": f["eager_gap"], "near_tie": f["eager_gap"] <= bound} for f in drafts.flips]
    flips.sort(key=lambda f: (f["req_id"], f["position"], f["kind"]))
    first = min(splits.values(), key=lambda s: (s["step"], s["req_id"])) if splits else None
    return Numerics(name, noise, drafts.max_abs_logprob_diff, len(splits), drafts.mismatches, drafts.compared,
                    sum(f["near_tie"] for f in flips), first, tuple(flips), bound)
