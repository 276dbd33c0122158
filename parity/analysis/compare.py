"""Compare every graph mode's run with the eager run: tokens, logprobs, acceptance, verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from parity.analysis.metrics import Acceptance, acceptance, wilson_interval
from parity.scenario import Scenario, Tolerances

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
    verdict: str = "pass"
    reasons: list[str] = field(default_factory=list)


def two_proportion_p(x1: int, n1: int, x2: int, n2: int) -> float:
    """Two-sided p-value of a pooled two-proportion z-test (1.0 when undefined)."""
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = (x1 + x2) / (n1 + n2)
    var = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if var <= 0:
        return 1.0 if x1 * n2 == x2 * n1 else 0.0
    z = (x1 / n1 - x2 / n2) / math.sqrt(var)
    return math.erfc(abs(z) / math.sqrt(2))


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
    # Bonferroni over positions and modes: the family is every test this run makes.
    alpha = tol.alpha / max(1, k * max(1, num_modes - 1))
    for i in range(k):
        x_ref, x = acc_ref.accepted_per_position[i], acc.accepted_per_position[i]
        drop = (x_ref / acc_ref.num_drafts if acc_ref.num_drafts else 0.0) - (x / acc.num_drafts if acc.num_drafts else 0.0)
        p = two_proportion_p(x_ref, acc_ref.num_drafts, x, acc.num_drafts)
        if abs(drop) >= tol.acceptance_min_effect and p < alpha:
            cmp.position_drift[i] = True
            lo, hi = intervals[i]
            cmp.reasons.append(f"position {i}: acceptance {x}/{acc.num_drafts} (95% CI {lo:.2f}-{hi:.2f}) "
                               f"vs eager {x_ref}/{acc_ref.num_drafts}, p={p:.2g}")
    if temperature == 0 and tol.require_token_parity and divergences:
        d = divergences[0]
        cmp.reasons.append(f"tokens differ from eager in {len(divergences)} request(s); first: request {d.req_id} "
                           f"at output token {d.output_index}")
    if max_d > tol.logprob_abs:
        cmp.reasons.append(f"max |logprob - eager| {max_d:.3g} > {tol.logprob_abs:g}")
    cmp.verdict = "drift" if cmp.reasons else "pass"
    return cmp


def compare_runs(runs: dict, scenario: Scenario) -> dict[str, ModeComparison]:
    """Every mode against eager; eager itself is compared with itself (always passes)."""
    if REFERENCE not in runs:
        raise ValueError("the eager run is the reference and must be present")
    ref = runs[REFERENCE].result
    k = scenario.num_speculative_tokens
    return {mode: compare_mode(mode, ref, run.result, k, scenario.temperature, scenario.tolerances, len(runs))
            for mode, run in runs.items()}
