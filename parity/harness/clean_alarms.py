"""False alarms of the three-way verdict on the clean engine under padding numerics (`parity bench`).

N seeds x the shipped scenarios x the five modes, on the embedded tiny pair (or
a synthetic pair of a real shape, `parity bench --alarm-shape`) in bf16 with the
padding-numerics seam (`simulated_numerics`: padded forwards
move their logits by SCALE x a function of the padded shape, as bf16 GPU
kernels do). The engine is clean, so every graph mode must pass: a false
alarm is any mode whose verdict is drift. The numerics the references saw
against eager (max |d logprob|, token and draft flips, near ties) are what
the verdict must not be fooled by; they are returned with the count.
Scenarios are cut to a few requests and tokens (configurable) so the default
finishes in about a minute on two CPU cores.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from parity.analysis.compare import compare_runs
from parity.engine.parts import EngineParts
from parity.graphs.modes import EAGER, MODES
from parity.harness.modes import run_modes
from parity.harness.release import frozen_heap
from parity.harness.request import resolve_backend
from parity.harness.scenario import load_scenario
from parity.harness.simulated_numerics import simulate_padding_numerics
from parity.models.pair import load_pair

SCENARIOS = Path(__file__).resolve().parent.parent.parent / "scenarios"
# Made for 8B pairs on a GPU (long prompts, 256 tokens x 32 requests): not the tiny pair's CPU runs.
REAL_SCALE = ("llama3-eagle", "llama3-eagle-short", "long-context-8k", "llama3-70b-tp")



def shipped_scenarios(folder: Path = SCENARIOS) -> list[Path]:
    return [p for p in sorted(folder.glob("*.yaml")) if p.stem not in REAL_SCALE]


def cut(scenario, seed: int, requests: int, max_tokens: int):
    """The scenario's first `requests` requests (their arrivals kept), `max_tokens` each, every mode, `seed`."""
    n = min(requests, scenario.num_requests)
    return dataclasses.replace(scenario, seed=seed, num_requests=n, arrivals=scenario.arrivals[:n],
                               max_tokens=min(max_tokens, scenario.max_tokens), modes=MODES)


def clean_alarms(paths=None, seeds: int = 1, scale: float = 0.1, requests: int = 3, max_tokens: int = 12,
                 backend: str = "auto", dtype: torch.dtype = torch.bfloat16, progress=None,
                 pair_paths: tuple[str, str] | None = None, model: str = "tiny-llama3-eagle") -> dict:
    """Count drift verdicts (false alarms) of every graph mode on the clean engine; report the numerics.

    `pair_paths`: (target, draft) folders of a local pair (a synthetic one, `parity models synth`) instead
    of the embedded tiny pair; `model` names it in the result."""
    backend, device = resolve_backend(backend)
    if pair_paths is None:
        pair = load_pair("tiny-llama3-eagle", dtype=dtype, device=device)
    else:
        pair = load_pair("local", target_path=pair_paths[0], draft_path=pair_paths[1], dtype=dtype, device=device)
    parts = simulate_padding_numerics(EngineParts(), scale)
    with frozen_heap():
        rows = _rows(pair, paths or shipped_scenarios(), seeds, requests, max_tokens, backend, device, parts, progress)
    return {"model": model, "backend": backend, "dtype": str(dtype).removeprefix("torch."), "scale": scale,
            "seeds": seeds, "requests": requests, "max_tokens": max_tokens, "scenarios": sorted({r["scenario"] for r in rows}),
            "mode_runs": len(rows), "false_alarms": sum(r["verdict"] == "drift" for r in rows),
            "max_abs_logprob_diff": max((r["max_abs_logprob_diff"] for r in rows), default=0.0),
            "token_flips": sum(r["token_flips"] for r in rows), "draft_flips": sum(r["draft_flips"] for r in rows),
            "near_ties": sum(r["near_ties"] for r in rows), "rows": rows}


def _rows(pair, paths, seeds: int, requests: int, max_tokens: int, backend: str, device, parts,
          progress) -> list[dict]:
    """One row per (scenario, seed, graph mode): its verdict and numerics."""
    rows = []
    for path in paths:
        base = load_scenario(path)
        for seed in range(seeds):
            scenario = cut(base, seed, requests, max_tokens)
            comparisons = compare_runs(run_modes(pair, scenario, MODES, backend, device, parts), scenario)
            for mode, cmp in comparisons.items():
                if mode == EAGER:
                    continue
                n = cmp.numerics
                rows.append({"scenario": base.name, "seed": seed, "mode": mode, "verdict": cmp.verdict,
                             "max_abs_logprob_diff": n.noise if n else 0.0,
                             "token_flips": n.token_flips if n else 0, "draft_flips": n.draft_flips if n else 0,
                             "near_ties": n.near_ties if n else 0})
            if progress is not None:
                progress(base.name, seed, [r for r in rows if r["scenario"] == base.name and r["seed"] == seed])
    return rows
