"""The run summary: plain data every renderer reads (summary.json's schema)."""

from __future__ import annotations

import datetime as _dt

import parity
from parity.analysis.compare import ModeComparison

# 2: per graph mode `reference` (bitwise verdict) and `numerics`; top-level `references`.
SCHEMA_VERSION = 2


def _decode(tokenizer, ids: list[int]) -> str:
    if tokenizer is None:
        return " ".join(map(str, ids))
    return tokenizer.decode(ids)


def build_summary(*, model: str, model_checksum: str, scenario, backend: str, device: str,
                  comparisons: dict[str, ModeComparison], runs, tokenizer=None,
                  diagnosis: dict | None = None, target_path: str | None = None,
                  draft_path: str | None = None) -> dict:
    """Everything a report shows, as JSON-ready data; the verdict is drift if any mode drifts.

    `target_path`/`draft_path`: the checkpoint folders a pair given by path was loaded from
    (None for embedded pairs, whose files are part of the package).
    """
    modes = {mode: mode_summary(cmp, runs.runs[mode]) for mode, cmp in comparisons.items()}
    divergences = {mode: divergence_summary(cmp, tokenizer) for mode, cmp in comparisons.items() if cmp.divergences}
    verdicts = {m["verdict"] for m in modes.values()}
    verdict = "drift" if "drift" in verdicts else ("not_exercised" if "not_exercised" in verdicts else "pass")
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": parity.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": model,
        "model_checksum": model_checksum,
        "target_path": target_path,
        "draft_path": draft_path,
        "scenario": scenario.name,
        "scenario_path": scenario.path,
        "backend": backend,
        "device": device,
        "k": scenario.num_speculative_tokens,
        "temperature": scenario.temperature,
        "seed": scenario.seed,
        "num_requests": scenario.num_requests,
        "tolerances": vars(scenario.tolerances),
        "verdict": verdict,
        "modes": modes,
        "divergences": divergences,
        "references": {name: {"modes": [m for m, r in runs.reference_of.items() if r == name]}
                       for name in runs.references},
        "diagnosis": diagnosis,
    }


def mode_summary(cmp: ModeComparison, run) -> dict:
    """One mode's entry under `modes`: acceptance, parity with eager, verdict, how its forwards ran."""
    acc = cmp.acceptance
    ran = run.result is not None
    return {
        "num_drafts": acc.num_drafts,
        "accepted_per_position": list(acc.accepted_per_position),
        # null where no draft had a node (a tree's depth it never reached): no rate, not a rate of 0
        "acceptance_per_position": _rounded(acc.shown_rates),
        "nodes_per_position": list(acc.nodes_per_position) if acc.nodes_per_position is not None else None,
        "acceptance_ci95": [[round(lo, 6), round(hi, 6)] if acc.has_node(i) else None
                            for i, (lo, hi) in enumerate(cmp.intervals)],
        "mean_acceptance_length": round(acc.mean_acceptance_length, 6),
        "tokens_equal_to_eager": cmp.tokens_equal_to_eager,
        "max_abs_logprob_diff": cmp.max_abs_logprob_diff,
        "mean_abs_logprob_diff": cmp.mean_abs_logprob_diff,
        "max_logprob_diff_at": cmp.max_logprob_diff_at,
        "drafts_compared": cmp.drafts.compared if cmp.drafts else 0,
        "draft_mismatches": cmp.drafts.mismatches if cmp.drafts else 0,
        "max_abs_draft_logprob_diff": cmp.drafts.max_abs_logprob_diff if cmp.drafts else 0.0,
        "max_abs_verify_logprob_diff": cmp.drafts.max_abs_verify_logprob_diff if cmp.drafts else 0.0,
        "position_drift": cmp.position_drift,
        "verdict": cmp.verdict,
        "reasons": cmp.reasons,
        "num_output_tokens": int(len(run.result.tokens)) if ran else 0,
        "forwards_by_runtime_mode": {str(k): int(v) for k, v in run.result.forwards.groupby("runtime_mode").size()
                                     .items()} if ran else {},
        # The capacity audit's findings when it refused the mode before capture (nothing ran).
        "short_buffers": getattr(run, "short_buffers", None),
        # The capture that stopped at an op no graph can capture (nothing ran), and its engine source line.
        "capture_error": getattr(run, "capture_error", None),
        # The run stopped before a batch replayed a graph captured for another key than its own (both keys).
        "wrong_graph": getattr(run, "wrong_graph", None),
        # The engine raised in this graph mode (eager did not): the step, the exception and the engine's line.
        "crashed": getattr(run, "crashed", None),
        "capture": run.capture,
        "graph_replays": run.graph_replays,
        "reference": reference_summary(cmp),
        "numerics": cmp.numerics.as_dict() if cmp.numerics is not None else None,
    }


def _rounded(rates: list) -> list:
    return [None if r is None else round(r, 6) for r in rates]


def reference_summary(cmp: ModeComparison) -> dict | None:
    """The verdict's evidence: bitwise parity with the padded reference, its acceptance, padding checks."""
    if cmp.reference is None:
        return None
    acc = cmp.reference_acceptance
    return {**cmp.reference.as_dict(),
            "acceptance_per_position": _rounded(acc.shown_rates),
            "mean_acceptance_length": round(acc.mean_acceptance_length, 6),
            "padding": cmp.padding,
            "padding_contract": cmp.padding_contract}


def divergence_summary(cmp: ModeComparison, tokenizer) -> dict:
    """Where a mode's tokens first part from eager's, with both windows decoded."""
    d = cmp.divergences[0]
    return {
        "req_id": d.req_id, "output_index": d.output_index, "position": d.position,
        "step": d.step_reference, "window_start": d.window_start,
        "reference_tokens": d.reference_tokens, "mode_tokens": d.mode_tokens,
        "reference_text": _decode(tokenizer, d.reference_tokens),
        "mode_text": _decode(tokenizer, d.mode_tokens),
        "num_requests_diverged": len(cmp.divergences),
    }
