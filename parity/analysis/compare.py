"""Compare every graph mode's run with the eager run: tokens, logprobs, acceptance, verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from parity.analysis import stats
from parity.analysis.draft_parity import draft_parity
from parity.analysis.metrics import Acceptance, acceptance, wilson_interval
from parity.analysis.tolerances import Tolerances

REFERENCE = "eager"


@dataclass
class Divergence:
    req_id: int
    output_index: int
    position: int
    step_reference: int
    step_mode: int
    reference_tokens: list[int]   # a window of the reference stream around the divergence
    mode_tokens: list[int]
    window_start: int             # output index of the windows' first token


@dataclass
class ModeComparison:
    mode: str
    acceptance: Acceptance
    intervals: list[tuple[float, float]]
    tokens_equal_to_eager: bool
    divergences: list[Divergence]
    max_abs_logprob_diff: float
    mean_abs_logprob_diff: float
    max_logprob_diff_at: dict | None
    position_drift: list[bool]
    drafts: object = None          # DraftParity against eager
    verdict: str = "pass"
    reasons: list[str] = field(default_factory=list)


# Kept for callers of the old name; the test lives in parity.analysis.stats.
two_proportion_p = stats.two_proportion_z


def _divergences(ref: pd.DataFrame, other: pd.DataFrame, window: int = 6) -> list[Divergence]:
    found = []
    for req_id, ref_rows in ref.groupby("req_id"):
        ref_rows = ref_rows.sort_values("output_index")
        mode_rows = other[other.req_id == req_id].sort_values("output_index")
        a, b = ref_rows["token"].tolist(), mode_rows["token"].tolist()
        if a == b:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        lo = max(0, first - window)

        def step_at(rows, i):
            return int(rows["step"].iloc[i]) if i < len(rows) else -1

        pos = int(ref_rows["position"].iloc[first]) if first < len(ref_rows) else -1
        found.append(Divergence(int(req_id), first, pos, step_at(ref_rows, first), step_at(mode_rows, first),
                                a[lo:first + window], b[lo:first + window], lo))
    return found


def _logprob_deltas(ref: pd.DataFrame, other: pd.DataFrame) -> tuple[float, float, dict | None]:
    merged = ref.merge(other, on=["req_id", "output_index"], suffixes=("_ref", "_mode"))
    merged = merged[merged.token_ref == merged.token_mode]
    if merged.empty:
        return 0.0, 0.0, None
    delta = (merged.logprob_ref - merged.logprob_mode).abs()
    at = merged.loc[delta.idxmax()]
    return float(delta.max()), float(delta.mean()), {
        "req_id": int(at.req_id), "output_index": int(at.output_index), "position": int(at.position_ref)}


def compare_mode(mode: str, reference, run, k: int, temperature: float, tol: Tolerances,
                 num_modes: int) -> ModeComparison:
    """Compare one mode's run with the reference (eager) run under the scenario's tolerances."""
    acc_ref = acceptance(reference.drafts, k)
    acc = acceptance(run.drafts, k)
    divergences = _divergences(reference.tokens, run.tokens)
    max_d, mean_d, where = _logprob_deltas(reference.tokens, run.tokens)
    intervals = [wilson_interval(c, acc.num_drafts) for c in acc.accepted_per_position]
    cmp = ModeComparison(mode, acc, intervals, not divergences, divergences, max_d, mean_d, where, [False] * k)
    if mode == REFERENCE:
        return cmp
    # The family is every position of every graph mode: Holm over this mode's positions at
    # alpha / (graph modes), i.e. Bonferroni across modes (compare_mode sees one mode at a time).
    alpha = tol.alpha / max(1, num_modes - 1)
    tests = stats.position_tests(acc_ref.num_drafts, acc_ref.accepted_per_position,
                                 acc.num_drafts, acc.accepted_per_position)
    for t, p_adj in zip(tests, stats.holm([t.p for t in tests])):
        t.p_adjusted = p_adj
        if stats.is_drift(p_adj, t.delta, alpha, tol.acceptance_min_effect):
            t.drift = True
            cmp.position_drift[t.position] = True
            cmp.reasons.append(stats.position_message(t, REFERENCE, alpha))
    if temperature == 0 and tol.require_token_parity and divergences:
        d = divergences[0]
        cmp.reasons.append(f"tokens differ from eager in {len(divergences)} request(s); first: request {d.req_id} "
                           f"at output token {d.output_index}")
    if max_d > tol.logprob_abs:
        cmp.reasons.append(f"max |logprob - eager| {max_d:.3g} > {tol.logprob_abs:g}")
    cmp.drafts = draft_parity(reference.drafts, run.drafts)
    if tol.require_draft_parity:
        dp = cmp.drafts
        if dp.mismatches:
            f = dp.first_mismatch
            cmp.reasons.append(f"{dp.mismatches} of {dp.compared} drafts differ from eager's for the same context; "
                               f"first: request {f['req_id']}, position {f['position']} (draft {f['draft_index']})")
        if dp.max_abs_logprob_diff > tol.logprob_abs:
            cmp.reasons.append(f"max |draft logprob - eager| {dp.max_abs_logprob_diff:.3g} > {tol.logprob_abs:g}")
    if cmp.drafts.max_abs_verify_logprob_diff > tol.logprob_abs:
        cmp.reasons.append(f"max |verify-row target logprob - eager| {cmp.drafts.max_abs_verify_logprob_diff:.3g}"
                           f" > {tol.logprob_abs:g}")
    cmp.verdict = "drift" if cmp.reasons else "pass"
    return cmp


def compare_runs(runs: dict, scenario) -> dict[str, ModeComparison]:
    """Every mode against eager; eager itself is compared with itself (always passes)."""
    if REFERENCE not in runs:
        raise ValueError("the eager run is the reference and must be present")
    ref = runs[REFERENCE].result
    k = scenario.num_speculative_tokens
    return {mode: compare_mode(mode, ref, run.result, k, scenario.temperature, scenario.tolerances, len(runs))
            for mode, run in runs.items()}
