"""One `parity run` or `parity bisect`: scenario -> runs (one per mode) -> comparison -> summary.

The harness computes; the commands above it write artifacts and render.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

from parity.analysis.compare import compare_runs
from parity.analysis.critical_path import critical_path
from parity.analysis.reference_parity import reference_parity
from parity.analysis.summary import build_summary
from parity.diagnose import bisect_mode
from parity.diagnosis.kinds import NONE
from parity.diagnosis.record import Diagnosis
from parity.engine.config import EngineConfig
from parity.engine.spec_decode import SpecDecodeEngine
from parity.errors import ParityInputError
from parity.graphs.factory import uninstall
from parity.graphs.modes import EAGER, MODES
from parity.graphs.tp_agree import agree_all, agree_union, first_found
from parity.harness import mps
from parity.harness.concurrency import decide, session_jobs
from parity.harness.concurrent import RunPool
from parity.harness.modes import (RunSet, capture_policy, reference_names, request_specs, run_modes,
                                  run_reference)
from parity.harness.plan import check_plan
from parity.harness.request_plan import kv_cache_tokens, plan_request
from parity.harness.padding_diagnosis import padding_diagnosis, unless_unexplained
from parity.harness.release import Stopwatch, frozen_heap, measured
from parity.harness.staging_check import staging_diagnosis
from parity.harness.request import (RunRequest, checkpoint_paths, load_request_pair, load_request_scenario,
                                    resolve_backend, resolve_modes)
from parity.harness.scenario import Scenario
from parity.harness.unpadded import check_unpadded


@dataclass
class RunOutcome:
    summary: dict
    runs: dict
    scenario: Scenario


def run_session(request: RunRequest, progress=None, on_run=None) -> RunOutcome:
    """Every mode of the scenario, compared with eager; drifting modes bisected when asked.

    The memory plan is checked before any weight is read; `on_run(run)` gets
    each finished run (its memory and timing) as it ends.
    """
    watch, origin = Stopwatch(), time.perf_counter()
    scenario = load_request_scenario(request.scenario_path, request.seed)
    modes = resolve_modes(request.modes, scenario)
    backend, device = resolve_backend(request.backend)
    plan = plan_request(request, scenario, modes, device)
    check_plan(plan)
    jobs = session_jobs(modes, reference_names(modes, scenario), plan)
    concurrency = decide(plan, request.jobs, jobs, device, scenario, request.parts, request.policy)
    with RunPool(concurrency, device, jobs) as pool:    # spawned workers start importing while weights load
        with watch("load_seconds"):
            pair = load_request_pair(request, device, kv_cache_tokens(scenario))
        with frozen_heap():
            runs = run_modes(pair, scenario, modes, backend, device, request.parts, request.policy, progress, on_run,
                             pool=pool)
            pool.close()
    concurrent = {**concurrency.as_dict(), **(runs.concurrency or {}),
                  "critical_path": critical_path(runs.spans, origin), "mps": mps.used()}
    with frozen_heap():
        with watch("analysis_seconds"):
            comparisons = compare_runs(runs, scenario)
            check_padding(pair, scenario, device, request, runs, comparisons)
        unpadded = None
        if request.check_unpadded:
            with watch("unpadded_seconds"):
                unpadded = check_unpadded(pair, scenario, backend, device, request.parts, runs)
        diagnoses = {}
        if request.bisect:
            with watch("bisect_seconds"):
                diagnoses = diagnose_drifting(pair, scenario, backend, device, request, runs, comparisons)
    # NOTE: a diagnosis' seconds go with the other measured figures, not into the diagnosis itself.
    bisect_seconds = {mode: (d.pop("timing", None) or {}).get("bisect_seconds") for mode, d in diagnoses.items()}
    first = next(iter(diagnoses.values()), None)
    summary = build_summary(model=pair.name, model_checksum=pair.checksum(), scenario=scenario, backend=backend,
                            device=str(device), comparisons=comparisons, runs=runs, tokenizer=pair.tokenizer,
                            **checkpoint_paths(pair),
                            diagnosis=first)
    summary["diagnoses"] = diagnoses
    if unpadded is not None:
        summary["unpadded"] = unpadded
    summary["measured"] = measured_block(watch, runs, plan, bisect_seconds)
    summary["measured"]["concurrency"] = concurrent
    return RunOutcome(summary, runs, scenario)


def diagnose_drifting(pair, scenario: Scenario, backend: str, device, request: RunRequest, runs: RunSet,
                      comparisons: dict) -> dict:
    """mode -> diagnosis of every drifting mode: the staging and padding checks first, else the bisection.

    Under TP every rank diagnoses the modes that drift on any rank, and takes the first rank's answer of the
    checks (`graphs.tp_agree`: their re-runs hold collectives, so every rank runs the same ones); the
    bisection agrees each of its decisions itself.
    """
    diagnoses = {}
    for mode in agree_union("session: drifting modes", [m for m, c in comparisons.items() if c.verdict == "drift"]):
        padding = comparisons[mode].padding or {}
        found = (staging_diagnosis(pair, scenario, mode, backend, device, request, runs)
                 or padding_diagnosis(pair, scenario, mode, device, request, comparisons[mode]))
        found, _ = first_found(f"session: the checks' diagnosis of {mode}", found)
        if found is not None:
            diagnoses[mode] = found
            continue
        diagnoses[mode] = unless_unexplained(
            diagnose(pair, scenario, mode, backend, device, request,
                     agree_all("session: graph equals the clean reference",
                               padding.get("graph_equals_clean_reference", False))).as_dict(), comparisons[mode])
    return diagnoses


def measured_block(watch: Stopwatch, runs: RunSet, plan, bisect_seconds: dict) -> dict:
    """Everything in a summary that depends on the machine and the moment, in one block: seconds, device
    memory, the memory plan (its budget is what was free). Two runs of the same request give summaries
    equal byte for byte but for `created` and this block."""
    every = runs.all_runs()
    return {"timing": {**watch.seconds, "runs": {name: run.timing for name, run in every.items()},
                       "bisect_by_mode": bisect_seconds},
            "memory": {name: run.memory for name, run in every.items()},
            "memory_plan": plan.as_dict() if plan is not None else None}


def check_padding(pair, scenario: Scenario, device, request: RunRequest, runs: RunSet, comparisons: dict) -> None:
    """For each drifting mode: is its reference's padding inert, and does the graph match a clean reference?

    The verdict compares a graph with its reference run on poisoned padding. When
    they differ, one more run of the reference on clean (inert) padding tells a
    padding leak (the graph matches the clean reference; poisoning changed the
    reference) from a graph bug.
    """
    clean = {}
    # Under TP the clean references of the modes that drift on any rank: their forwards hold collectives.
    drifting = agree_union("padding check: drifting modes", [m for m, c in comparisons.items()
                                                            if c.verdict == "drift" and c.reference is not None])
    for mode, cmp in comparisons.items():
        if mode not in drifting:
            continue
        name = cmp.reference.reference
        if name not in clean:
            clean[name] = run_reference(pair, scenario, mode, name, device, request.parts, poison=False).result
        if cmp.verdict != "drift":
            continue
        inert = reference_parity(clean[name], runs.references[name].result, name).bitwise_equal
        matches_clean = reference_parity(runs.runs[mode].result, clean[name], name).bitwise_equal
        cmp.padding = {"inert": inert, "graph_equals_clean_reference": matches_clean}
        if not inert:
            cmp.reasons.append(f"padding is not inert: {name} changes when its padded entries are poisoned"
                               + ("; the graph itself matches the reference on clean padding" if matches_clean
                                  else ""))


def bisect_session(request: RunRequest, mode: str | None) -> dict:
    """`parity bisect`: diagnose one mode (the first scenario mode that drifts when none is given)."""
    scenario = load_request_scenario(request.scenario_path, request.seed)
    backend, device = resolve_backend(request.backend)
    if mode is not None and mode not in MODES:
        raise ParityInputError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    if mode == EAGER:
        raise ParityInputError("--mode eager: eager is the reference; bisect a graph mode")
    check_plan(plan_request(request, scenario, resolve_modes(request.modes, scenario), device))
    pair = load_request_pair(request, device, kv_cache_tokens(scenario))
    with frozen_heap():
        return _bisect_loaded(pair, scenario, mode, backend, device, request)


def _bisect_loaded(pair, scenario: Scenario, mode: str | None, backend: str, device, request: RunRequest) -> dict:
    comparison = None
    if scenario.overlap and mode is not None:      # the overlapped mode and its reference, for the staging check
        runs = run_modes(pair, scenario, [mode], backend, device, request.parts, request.policy)
        found = staging_diagnosis(pair, scenario, mode, backend, device, request, runs)
        if found is not None:
            found.pop("timing", None)
            return found
    if mode is None:
        modes = resolve_modes(request.modes, scenario)
        runs = run_modes(pair, scenario, modes, backend, device, request.parts, request.policy)
        comparisons = compare_runs(runs, scenario)
        drifting = [m for m, c in comparisons.items() if c.verdict == "drift"]
        if not drifting:
            return Diagnosis(NONE, [], None, evidence=[f"no mode of {', '.join(modes)} drifts from eager"]).as_dict()
        mode = drifting[0]
        comparison = comparisons[mode]
        found = (staging_diagnosis(pair, scenario, mode, backend, device, request, runs)
                 or padding_diagnosis(pair, scenario, mode, device, request, comparison))
        if found is not None:
            found.pop("timing", None)
            return found
    return unless_unexplained(diagnose(pair, scenario, mode, backend, device, request).as_dict(), comparison)


def diagnose(pair, scenario: Scenario, mode: str, backend: str, device, request: RunRequest,
             graph_matches_clean_reference: bool = False):
    """Bisect `mode` on engines built exactly as `parity run` builds them; every engine released after."""
    config = EngineConfig.of(scenario)
    specs = request_specs(scenario, pair.tokenizer, config)
    engines: list = []

    def make_engine():
        engine = SpecDecodeEngine(pair.target, pair.head, config, device, request.parts)
        engines.append(weakref.ref(engine))
        return engine

    def bisect():
        try:
            return bisect_mode(make_engine, specs, mode, backend, scenario,
                               capture_policy(scenario, request.policy), graph_matches_clean_reference)
        finally:
            for ref in engines:
                if ref() is not None:
                    uninstall(ref())

    start = time.perf_counter()
    diagnosis, _ = measured(bisect, device, f"the bisection of {mode} on {scenario.name}", scenario)
    diagnosis.timing = {"bisect_seconds": round(time.perf_counter() - start, 3)}
    return diagnosis
