"""The gate's false-alarm rate on the clean engine (`parity bench false-alarms`).

Two nulls, over many seeds of a small scenario on one backend (default: the
default scenario cut to 2 requests of 12 tokens, modes eager and full,
temperature 0.8 so the seed changes what is sampled):

1. graph vs eager, same seed (what the gate does in CI): every check of the
   gate: acceptance tests, token, logprob and drafter parity;
2. eager at seed s vs eager at seed s' (independent samples of one engine):
   the acceptance tests alone, the calibration of the statistics on real
   acceptance data, where drafts within a request are not independent.

Returns both rates with the number of runs.
"""

from __future__ import annotations

import dataclasses

import torch

from parity.analysis.compare import compare_runs
from parity.analysis.gate import Pairing, evaluate_gate
from parity.analysis.sources import from_acceptance
from parity.harness.gate import engine_pairings, refuse_vacuous
from parity.harness.modes import run_modes
from parity.harness.release import frozen_heap
from parity.harness.request import resolve_backend
from parity.models.pair import load_pair


def tiny(scenario, requests: int, max_tokens: int, temperature: float):
    """The scenario cut to `requests` requests of `max_tokens` tokens, all arriving at once."""
    return dataclasses.replace(scenario, num_requests=requests, arrivals=(0,) * requests, max_tokens=max_tokens,
                               temperature=temperature, modes=("eager", "full"))


def measure(scenario, seeds: int, mode: str = "full", backend: str = "emulated", model: str = "tiny-llama3-eagle",
            progress=None, first_seed: int = 0) -> dict:
    """Run `seeds` seeds (from `first_seed` on) of eager and `mode`; count gate failures under both nulls."""
    backend, device = resolve_backend(backend)
    pair = load_pair(model, dtype=torch.float32, device=device)
    graph_alarms, eager_acceptance, reasons = 0, [], []
    with frozen_heap():
        for seed in range(first_seed, first_seed + seeds):
            result, acceptance = _one_seed(pair, dataclasses.replace(scenario, seed=seed), mode, backend, device)
            if result.verdict == "drift":
                graph_alarms += 1
                reasons.append((seed, [c.message for c in result.failures]))
            eager_acceptance.append(acceptance)
            if progress:
                progress(seed, result.verdict)
    # disjoint pairs of independent eager runs: (0, 1), (2, 3), ...
    pairs = [(eager_acceptance[i], eager_acceptance[i + 1]) for i in range(0, seeds - 1, 2)]
    eager_alarms = sum(
        evaluate_gate([Pairing(from_acceptance("eager@s+1", "engine", b), from_acceptance("eager@s", "engine", a),
                               "eager@s")], scenario.tolerances).verdict == "drift" for a, b in pairs)
    drafts = [a.num_drafts for a in eager_acceptance]
    return {"seeds": seeds, "mode": mode, "backend": backend, "alpha": scenario.tolerances.alpha,
            "graph_vs_eager_alarms": graph_alarms, "eager_vs_eager_pairs": len(pairs),
            "eager_vs_eager_alarms": eager_alarms, "mean_drafts_per_run": sum(drafts) / max(1, len(drafts)),
            "graph_alarm_reasons": reasons}


def _one_seed(pair, scenario, mode: str, backend: str, device):
    """(the gate's result for `mode` against eager, eager's acceptance) at the scenario's seed."""
    runs = run_modes(pair, scenario, ("eager", mode), backend, device)
    comparisons = compare_runs(runs, scenario)
    refuse_vacuous(runs.runs, comparisons)
    return (evaluate_gate(engine_pairings(runs, comparisons), scenario.tolerances, seed=scenario.seed),
            comparisons["eager"].acceptance)
