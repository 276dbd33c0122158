"""Measure the gate's false-alarm rate on the clean engine: `python -m parity.bench_gate`.

Two nulls, over many seeds of a small scenario on one backend (default: the
default scenario cut to 2 requests of 12 tokens, modes eager and full,
temperature 0.8 so the seed changes what is sampled):

1. graph vs eager, same seed (what the gate does in CI): every check of the
   gate: acceptance tests, token, logprob and drafter parity;
2. eager at seed s vs eager at seed s' (independent samples of one engine):
   the acceptance tests alone, the calibration of the statistics on real
   acceptance data, where drafts within a request are not independent.

Prints both rates with the number of runs; exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch


def tiny(scenario, requests: int, max_tokens: int, temperature: float):
    """The scenario cut to `requests` requests of `max_tokens` tokens, all arriving at once."""
    return dataclasses.replace(scenario, num_requests=requests, arrivals=(0,) * requests, max_tokens=max_tokens,
                               temperature=temperature, modes=("eager", "full"))


def measure(scenario, seeds: int, mode: str = "full", backend: str = "emulated", model: str = "tiny-llama3-eagle",
            progress=None) -> dict:
    """Run `seeds` seeds of eager and `mode`; count gate failures under both nulls."""
    from parity.analysis.compare import compare_runs
    from parity.analysis.gate import Pairing, evaluate_gate
    from parity.analysis.sources import from_acceptance
    from parity.gate_session import engine_pairings, refuse_vacuous
    from parity.models.pair import load_pair
    from parity.runner import run_mode
    from parity.session import resolve_backend

    backend, device = resolve_backend(backend)
    pair = load_pair(model, dtype=torch.float32, device=device)
    graph_alarms, eager_acceptance, drafts, reasons = 0, [], [], []
    for seed in range(seeds):
        s = dataclasses.replace(scenario, seed=seed)
        runs = {m: run_mode(pair, s, m, backend, device) for m in ("eager", mode)}
        comparisons = compare_runs(runs, s)
        refuse_vacuous(runs, comparisons)
        result = evaluate_gate(engine_pairings(runs, comparisons, s), s.tolerances, s.temperature, seed=seed)
        if result.verdict == "drift":
            graph_alarms += 1
            reasons.append((seed, [c.message for c in result.failures]))
        eager_acceptance.append(comparisons["eager"].acceptance)
        drafts.append(comparisons["eager"].acceptance.num_drafts)
        if progress:
            progress(seed, result.verdict)
    # disjoint pairs of independent eager runs: (0, 1), (2, 3), ...
    pairs = [(eager_acceptance[i], eager_acceptance[i + 1]) for i in range(0, seeds - 1, 2)]
    eager_alarms = sum(
        evaluate_gate([Pairing(from_acceptance("eager@s+1", "engine", b), from_acceptance("eager@s", "engine", a),
                               "eager@s")], scenario.tolerances).verdict == "drift" for a, b in pairs)
    return {"seeds": seeds, "mode": mode, "backend": backend, "alpha": scenario.tolerances.alpha,
            "graph_vs_eager_alarms": graph_alarms, "eager_vs_eager_pairs": len(pairs),
            "eager_vs_eager_alarms": eager_alarms, "mean_drafts_per_run": sum(drafts) / max(1, len(drafts)),
            "graph_alarm_reasons": reasons}


def main(argv: list[str] | None = None) -> int:
    """Command line: print the measured false-alarm rates."""
    from parity.scenario import load_scenario

    p = argparse.ArgumentParser(prog="python -m parity.bench_gate", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="scenarios/default.yaml")
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--mode", default="full")
    p.add_argument("--backend", default="emulated", choices=["auto", "cuda", "emulated"])
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    scenario = tiny(load_scenario(args.scenario), args.requests, args.max_tokens, args.temperature)
    start = time.perf_counter()
    r = measure(scenario, args.seeds, args.mode, args.backend,
                progress=lambda seed, verdict: print(f"seed {seed}: {verdict}", file=sys.stderr) if verdict != "pass"
                else None)
    took = time.perf_counter() - start
    print(f"{scenario.name}: {args.requests} requests x {args.max_tokens} tokens, T={args.temperature}, "
          f"{r['mean_drafts_per_run']:.1f} drafts per run, backend {r['backend']}, alpha {r['alpha']:g}, {took:.0f} s")
    print(f"{r['mode']} vs eager (same seed, every gate check): {r['graph_vs_eager_alarms']}/{r['seeds']} false "
          f"alarms ({r['graph_vs_eager_alarms'] / r['seeds']:.1%})")
    print(f"eager vs eager (independent seeds, acceptance tests): {r['eager_vs_eager_alarms']}/"
          f"{r['eager_vs_eager_pairs']} false alarms "
          f"({r['eager_vs_eager_alarms'] / max(1, r['eager_vs_eager_pairs']):.1%})")
    for seed, messages in r["graph_alarm_reasons"]:
        print(f"  seed {seed}: {messages[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
