"""Compare every graph mode: bit for bit with its padded reference (the verdict), and with eager.

Three runs per graph mode M: plain eager, M, and M's strict padded reference
(the same schedule and dispatch, every graphed forward run eagerly at the
padded shape, its padding poisoned). M's verdict is bitwise equality with the
reference (`reference_parity`). The reference against eager is padding
numerics (`numerics`), reported and never a verdict. Acceptance against eager
is tested statistically per position (`position_drift`), which the gate judges.
Nothing here reads which modes exist beyond the runs it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from parity.analysis import stats
from parity.analysis.draft_parity import draft_parity
from parity.analysis.metrics import Acceptance, acceptance, wilson_interval
from parity.analysis.numerics import Numerics, numerics
from parity.analysis.reference_parity import ReferenceParity, describe, reference_parity
from parity.analysis.streams import parted_streams, same_context, stream_splits
from parity.errors import ParityInputError

EAGER = "eager"
NOT_EXERCISED = "not_exercised"


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
    drafts: object = None          # DraftParity against eager (same-context proposals)
    reference: ReferenceParity | None = None      # the verdict: bit for bit against the padded reference
    numerics: Numerics | None = None              # the padded reference against eager
    reference_acceptance: Acceptance | None = None
    padding: dict | None = None    # after a drift: is the padding inert, does the graph match a clean reference
    padding_contract: dict | None = None   # the reference's padding probe (`engine.padding_probe`): leaks found
    verdict: str = "pass"
    reasons: list[str] = field(default_factory=list)


def _divergences(ref: pd.DataFrame, other: pd.DataFrame, window: int = 6) -> list[Divergence]:
    found = []
    for p in parted_streams(ref, other):
        i, lo = p.index, max(0, p.index - window)
        a, b = p.firsts("token"), p.seconds("token")
        pos, step_ref = (int(p.firsts("position")[i]), int(p.firsts("step")[i])) if i < len(a) else (-1, -1)
        step_mode = int(p.seconds("step")[i]) if i < len(b) else -1
        found.append(Divergence(p.req_id, i, pos, step_ref, step_mode, a[lo:i + window].tolist(),
                                b[lo:i + window].tolist(), lo))
    return found


def _logprob_deltas(ref: pd.DataFrame, other: pd.DataFrame, splits: dict) -> tuple[float, float, dict | None]:
    """|Δ logprob| of emitted tokens whose context is the same in both runs."""
    merged = ref.merge(other, on=["req_id", "output_index"], suffixes=("_ref", "_mode"))
    merged = merged[same_context(merged, splits)]
    if merged.empty:
        return 0.0, 0.0, None
    # NOTE: NaN against a number is as far apart as two logprobs get (eager's are finite: compare_runs checks).
    delta = (merged.logprob_ref - merged.logprob_mode).abs().fillna(math.inf)
    at = merged.loc[delta.idxmax()]
    return float(delta.max()), float(delta.mean()), {
        "req_id": int(at.req_id), "output_index": int(at.output_index), "position": int(at.position_ref)}


def compare_mode(mode: str, eager, run, k: int, alpha: float, min_effect: float, reference=None,
                 numbers: Numerics | None = None) -> ModeComparison:
    """One mode against eager (acceptance tests, numerics) and against its padded reference (the verdict)."""
    acc_eager, acc = acceptance(eager.drafts, k), acceptance(run.drafts, k)
    divergences = _divergences(eager.tokens, run.tokens)
    splits = stream_splits(eager.tokens, run.tokens)
    max_d, mean_d, where = _logprob_deltas(eager.tokens, run.tokens, splits)
    intervals = [wilson_interval(c, acc.num_drafts) for c in acc.accepted_per_position]
    cmp = ModeComparison(mode, acc, intervals, not divergences, divergences, max_d, mean_d, where, [False] * k)
    if mode == EAGER:
        return cmp
    tests = stats.position_tests(acc_eager.num_drafts, acc_eager.accepted_per_position,
                                 acc.num_drafts, acc.accepted_per_position)
    for t, p_adj in zip(tests, stats.holm([t.p for t in tests])):
        cmp.position_drift[t.position] = stats.is_drift(p_adj, t.delta, alpha, min_effect)
    cmp.drafts = draft_parity(eager.drafts, run.drafts, {r: s["position"] for r, s in splits.items()})
    if reference is not None:
        name, ref_run = reference
        cmp.reference = reference_parity(run, ref_run, name)
        cmp.reference_acceptance = acceptance(ref_run.drafts, k)
        cmp.numerics = numbers
        if not cmp.reference.bitwise_equal:
            cmp.reasons.append(f"differs from its padded reference ({name}) in {cmp.reference.rows_differing} "
                               f"record(s); first: {describe(cmp.reference.first_difference)}")
    cmp.verdict = "drift" if cmp.reasons else "pass"
    return cmp


def judge_padding_contract(cmp: ModeComparison, probe: dict | None) -> None:
    """A leak the reference's padding probe found is a drift of every mode that reference judges.

    The graph and its reference share their padding code: a leak there is
    invisible to the bitwise verdict and is judged here, exactly (live outputs
    under two poisons of the padding, bit for bit).
    """
    if not probe:
        return
    cmp.padding_contract = {k: probe[k] for k in ("padded_forwards", "probed_forwards", "sampling")}
    cmp.padding_contract["leaks"] = len(probe["leaks"])
    if not probe["leaks"]:
        return
    named = next((leak for leak in probe["leaks"] if leak["buffers"]), probe["leaks"][0])
    cmp.padding_contract["first"] = named
    cmp.reasons.append(f"padding leak in {len(probe['leaks'])} of {probe['probed_forwards']} probed forward(s) of "
                       f"the padded reference: {describe_leak(named)}")
    cmp.verdict = "drift"


def judge_padding_numerics(cmp: ModeComparison, yardstick) -> None:
    """A reference that departs from eager beyond the dtype's fixed bound is not padding numerics: a drift."""
    n = cmp.numerics
    if n is None or not n.beyond_bound:
        return
    cmp.reasons.append(f"the padded reference departs from eager by max |Δ logprob| {n.noise:.3g} on same-context "
                       f"records, beyond the padding-numerics bound {yardstick.describe()}")
    cmp.verdict = "drift"


def describe_leak(leak: dict) -> str:
    where = (f"{leak['owner']} {leak['phase']} at step {leak['step']} ({leak['num_tokens']} live of "
             f"{leak['num_tokens_padded']} tokens, {leak['num_reqs']} live of {leak['num_reqs_padded']} rows)")
    what = "; ".join(leak["regions"]) if leak["regions"] else "no single region isolated"
    return f"{where}: live {', '.join(leak['outputs'][:4])} change with the padding ({what})"


def describe_crash(crash: dict) -> str:
    """One line for a graph mode whose engine raised (`harness.crashes`): the step, the engine line, the error."""
    return (f"stopped at step {crash['step']}: the engine raised at {crash['source']} ({crash['function']}: "
            f"{crash['code']}): {crash['error']}")


def refused_comparison(mode: str, eager, k: int, run) -> ModeComparison:
    """A mode refused before it ran (the capacity audit, a capture that stopped at an op no graph can capture),
    stopped before a batch replayed a graph captured for another key, or stopped where its engine raised while
    eager's did not: no records, and a graph bug (drift)."""
    acc = acceptance(eager.drafts.iloc[0:0], k)
    cmp = ModeComparison(mode, acc, [(0.0, 0.0)] * k, False, [], 0.0, 0.0, None, [False] * k, verdict="drift")
    cmp.reasons = [f"not run: a padded batch does not fit a persistent buffer: {s['message']}"
                   for s in getattr(run, "short_buffers", None) or ()]
    error = getattr(run, "capture_error", None)
    if error:
        cmp.reasons.append(f"not run: capturing the {error['graph']} stopped at "
                           f"{error['source'] or 'an op of torch'}: {error['message']}")
    wrong = getattr(run, "wrong_graph", None)
    if wrong:
        cmp.reasons.append(f"stopped at step {wrong['step']}: a batch that asked for the {wrong['wanted']['graph']} "
                           f"was about to replay the {wrong['replayed']['graph']} (differing in "
                           f"{', '.join(wrong['differs'])})")
    crash = getattr(run, "crashed", None)
    if crash:
        cmp.reasons.append(describe_crash(crash))
    return cmp


def compare_runs(runset, scenario) -> dict[str, ModeComparison]:
    """Eager, then every graph mode against its padded reference (verdict) and against eager (numerics)."""
    runs, references, reference_of = runset.runs, runset.references, runset.reference_of
    if EAGER not in runs:
        raise ValueError("the eager run is the reference of numerics and must be present")
    eager = runs[EAGER].result
    broken = int((~np.isfinite(eager.tokens["logprob"].to_numpy(dtype=float))).sum())
    if broken:
        raise ParityInputError(f"the eager run emitted {broken} token(s) with a NaN or infinite logprob: the model "
                               f"computes NaN with these weights and this config (rope_theta, rms_norm_eps, ...); "
                               f"parity cannot be judged on it")
    k, tol = scenario.num_speculative_tokens, scenario.tolerances
    # The family is every position of every graph mode: Holm within a mode at alpha / (graph modes).
    alpha = tol.alpha / max(1, len(runs) - 1)
    bound = runset.yardstick.bound
    numbers = {name: numerics(ref.result, eager, name, bound) for name, ref in references.items()
               if ref.result is not None}
    out = {}
    for mode, run in runs.items():
        if run.result is None:
            out[mode] = refused_comparison(mode, eager, k, run)
            continue
        name = reference_of.get(mode)
        reference = (name, references[name].result) if name is not None and name in numbers else None
        out[mode] = compare_mode(mode, eager, run.result, k, alpha, tol.acceptance_min_effect, reference,
                                 numbers.get(name))
        if name is not None and name in references:
            judge_padding_contract(out[mode], references[name].padding_probe)
            judge_padding_numerics(out[mode], runset.yardstick)
        if mode != EAGER and not getattr(run, "graph_replays", None):
            # A graph mode whose forwards all ran eagerly proves nothing about graphs.
            out[mode].verdict = NOT_EXERCISED
            out[mode].reasons.append("no forward replayed a graph (every batch ran eagerly): not exercised")
    return out
