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

import numpy as np
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
    # Every mismatch: request, position, draft index, both tokens, the reference side's top-2 gap.
    flips: tuple = ()


def _chains(drafts: pd.DataFrame) -> dict[tuple[int, int], list[tuple]]:
    """(request, position of draft 0) -> the proposal's (draft token, draft logprob, target logprob, draft gap)
    in draft order; of two proposals at one key, the one whose first record comes later wins."""
    if drafts.empty:
        return {}
    # One stable sort: proposals in order of first appearance, each in draft order.
    proposal = drafts.groupby(["req_id", "step"], sort=False).ngroup().to_numpy()
    order = np.lexsort((drafts["draft_index"].to_numpy(), proposal))
    starts = np.flatnonzero(np.diff(proposal[order], prepend=-1)).tolist()
    ends = starts[1:] + [len(order)]
    req, position = (drafts[c].to_numpy()[order][starts].tolist() for c in ("req_id", "position"))
    columns = [drafts[c].to_numpy()[order].tolist()
               for c in ("draft_token", "draft_logprob", "target_logprob", "draft_top2_gap")]
    chains: dict = {}
    for r, p, start, end in zip(req, position, starts, ends):
        chains[(int(r), int(p))] = list(zip(*(c[start:end] for c in columns)))
    return chains


def draft_parity(reference: pd.DataFrame, run: pd.DataFrame, split_at: dict[int, int] | None = None) -> DraftParity:
    """Compare the drafts of two runs wherever they drafted from the same context.

    `split_at` maps a request to the position of the first token where the two
    runs' streams differ; proposals drafted after it saw another context and
    are not compared.
    """
    ref, other = _chains(reference), _chains(run)
    split_at = split_at or {}
    compared = 0
    worst, worst_verify, flips = 0.0, 0.0, []
    for key in sorted(ref.keys() & other.keys()):
        if key[1] > split_at.get(key[0], key[1]):
            continue
        for index, (a, b) in enumerate(zip(ref[key], other[key])):
            compared += 1
            # row `index` of the verify query holds the drafts before it: same context so far
            worst_verify = max(worst_verify, abs(a[2] - b[2]))
            if a[0] != b[0]:
                flips.append({"req_id": key[0], "position": key[1] + index, "draft_index": index,
                              "eager_token": int(a[0]), "mode_token": int(b[0]), "eager_gap": float(a[3])})
                break
            worst = max(worst, abs(a[1] - b[1]))
    return DraftParity(compared, len(flips), worst, flips[0] if flips else None, worst_verify, tuple(flips))
