"""One `parity gate`: runs (or imported vLLM runs) -> acceptance records -> gate verdict.

Engine gate: the scenario runs once per mode on fresh engines (as `parity
run` does, without bisection); each graph mode is compared with eager
(acceptance, token parity for greedy runs, target logprobs, drafter
parity) and, given a baseline, every mode with its committed counts. Import
gate: the first `--import` file is the reference, every other is compared with
it. Everything a vacuous pass could hide (no drafts, a mode that replayed no
graph, nothing to compare) is bad input: exit 2 with the reason. The command
writes the files (baseline, JUnit, Markdown, run folder).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from parity.analysis.baseline import (baseline_records, build_baseline, check_model, check_scenario,
                                      load_baseline)
from parity.analysis.compare import compare_runs, describe_crash
from parity.analysis.gate import GateCheck, GateResult, Pairing, evaluate_gate
from parity.analysis.sources import from_acceptance
from parity.analysis.summary import build_summary
from parity.analysis.tolerances import Tolerances
from parity.engine.parts import EngineParts
from parity.errors import ParityInputError
from parity.graphs.policy import CapturePolicy
from parity.harness.modes import run_modes
from parity.harness.plan import check_plan
from parity.harness.request_plan import kv_cache_tokens, plan_request
from parity.harness.request import (checkpoint_paths, load_request_pair, load_request_scenario, resolve_backend,
                                    resolve_modes)
from parity.harness.run_ids import slug
from parity.harness.session import check_padding
from parity.harness.scenario import load_scenario
from parity.importers.vllm import load_vllm
from parity.models.zoo import DEFAULT_SCENARIO

BASELINE_DIR = Path("scenarios/baselines")


@dataclass(frozen=True)
class GateRequest:
    """What `parity gate` was asked to do (see `parity gate --help`)."""

    model: str = "tiny-llama3-eagle"
    scenario_path: str | None = None          # None: scenarios/default.yaml (imports: default tolerances)
    modes: tuple[str, ...] | None = None
    backend: str = "auto"
    parts: EngineParts = EngineParts()
    policy: CapturePolicy = CapturePolicy()
    seed: int | None = None
    target_path: str | None = None
    draft_path: str | None = None
    dtype: str = "auto"
    baseline: str | None = None
    update_baseline: bool = False
    imports: tuple[str, ...] = ()
    num_drafts: int | None = None


@dataclass
class GateOutcome:
    """The gate report (renderers read it) and, for engine runs, the runs, their summary and a baseline to write."""

    report: dict                 # what the renderers read (result = GateResult.as_dict())
    summary: dict | None = None  # the engine runs' summary (engine gate only)
    runs: dict | None = None
    baseline: tuple[str, dict] | None = None   # (path, data) when --update-baseline and the run passes

    @property
    def verdict(self) -> str:
        return self.report["result"]["verdict"]


def check_output_path(path: str | None, option: str) -> None:
    """An output file must go into an existing folder and must not be a folder itself."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ParityInputError(f"{option} {path}: is a directory, expected a file path")
    if not p.parent.is_dir():
        raise ParityInputError(f"{option} {path}: folder {p.parent} does not exist")


def run_gate(request: GateRequest, progress=None) -> GateOutcome:
    """Evaluate the gate: engine runs against eager and a baseline, or imported files against the first."""
    return _import_gate(request) if request.imports else _engine_gate(request, progress)


def _import_gate(request: GateRequest) -> GateOutcome:
    if len(request.imports) < 2:
        raise ParityInputError("--import needs two files at least: the first is the reference")
    scenario = load_scenario(request.scenario_path) if request.scenario_path else None
    tol = scenario.tolerances if scenario else Tolerances()
    records = [load_vllm(path, request.num_drafts) for path in request.imports]
    labels = [r.label for r in records]
    if len(set(labels)) < len(labels):   # same file names in different folders: use the paths
        records = [dataclasses.replace(r, label=str(path)) for r, path in zip(records, request.imports)]
    reference = records[0]
    pairings = [Pairing(r, reference, reference.label) for r in records[1:]]
    result = evaluate_gate(pairings, tol, seed=scenario.seed if scenario else 0)
    report = {"kind": "import", "model": None, "scenario": scenario.name if scenario else None,
              "backend": "vllm", "reference": reference.label, "records": [r.as_dict() for r in records],
              "result": result.as_dict()}
    return GateOutcome(report)


def _load_baseline(request: GateRequest, scenario):
    path = request.baseline
    if request.update_baseline:
        return (path or str(BASELINE_DIR / f"{slug(scenario.name)}.json")), None
    if path is None:
        return None, None
    data = load_baseline(path)
    check_scenario(data, path, scenario)
    return path, data


def _engine_gate(request: GateRequest, progress) -> GateOutcome:
    scenario = load_request_scenario(request.scenario_path or DEFAULT_SCENARIO, request.seed)
    if scenario.num_requests < 1 or not scenario.prompts:
        raise ParityInputError(f"{scenario.path}: no requests to run (empty prompt set or num_requests 0)")
    modes = resolve_modes(request.modes, scenario)
    baseline_path, baseline = _load_baseline(request, scenario)
    if request.update_baseline:
        check_output_path(baseline_path, "--baseline")
    backend, device = resolve_backend(request.backend)
    check_plan(plan_request(request, scenario, modes, device))
    pair = load_request_pair(request, device, kv_cache_tokens(scenario))
    if baseline is not None:
        check_model(baseline, baseline_path, pair.name, pair.checksum())
        missing = [m for m in modes if m not in baseline["modes"]]
        if missing:
            raise ParityInputError(f"{baseline_path}: baseline has no mode(s) {', '.join(missing)} (it has "
                                   f"{', '.join(baseline['modes'])}); regenerate it with --update-baseline")

    runs = run_modes(pair, scenario, modes, backend, device, request.parts, request.policy, progress)
    comparisons = compare_runs(runs, scenario)
    refuse_vacuous(runs.runs, comparisons)
    check_padding(pair, scenario, device, request, runs, comparisons)
    pairings = engine_pairings(runs, comparisons, baseline, baseline_path)
    refused = run_checks(runs.runs)
    tol = scenario.tolerances
    # Every graph mode refused before it ran leaves nothing to pair: the refusals alone are the verdict.
    result = evaluate_gate(pairings, tol, seed=scenario.seed) if pairings or not refused else \
        GateResult([], tol.alpha, tol.acceptance_min_effect, "holm", 0)
    result.checks += refused
    result.notes += noise_baselines(comparisons)

    report = {"kind": "engine", "model": pair.name, "model_checksum": pair.checksum(), "scenario": scenario.name,
              "backend": backend, "modes": list(modes), "reference": "eager",
              "baseline": None if request.update_baseline else baseline_path, "baseline_written": None,
              "baseline_note": None, "records": [from_acceptance(m, "engine", c.acceptance).as_dict()
                                                  for m, c in comparisons.items()],
              "result": result.as_dict()}
    to_write = None
    if request.update_baseline:
        if result.verdict == "pass":
            data = build_baseline(model=pair.name, model_checksum=pair.checksum(), scenario=scenario, backend=backend,
                                  acceptance={m: c.acceptance for m, c in comparisons.items()})
            to_write = (baseline_path, data)
            report["baseline_written"] = baseline_path
            report["baseline_note"] = f"baseline written: {baseline_path}"
        else:
            report["baseline_note"] = f"baseline NOT written ({baseline_path}): the run drifts from eager"
    summary = build_summary(model=pair.name, model_checksum=pair.checksum(), scenario=scenario, backend=backend,
                            device=str(device), comparisons=comparisons, runs=runs, tokenizer=pair.tokenizer,
                            **checkpoint_paths(pair))
    summary["gate"] = report
    return GateOutcome(report, summary, runs, to_write)


def refuse_vacuous(runs: dict, comparisons: dict) -> None:
    """Bad input when a mode made no drafts or a graph mode replayed no graph."""
    for mode, cmp in comparisons.items():
        if runs[mode].result is None:
            continue        # refused before it ran: a failing check of its own (run_checks)
        if cmp.acceptance.num_drafts == 0:
            raise ParityInputError(f"mode {mode} made no drafts (max_tokens too small?): nothing to compare")
        if mode != "eager":
            if not runs[mode].graph_replays:
                raise ParityInputError(f"mode {mode} replayed no graph (every batch ran eagerly: capture sizes "
                                       f"too small for the scenario, or a silent eager fallback): comparing it "
                                       f"would prove nothing")


def engine_pairings(runs, comparisons: dict, baseline: dict | None = None,
                    baseline_path=None) -> list:
    """Each graph mode against eager (acceptance) and its padded reference (parity); each against the baseline."""
    records = {m: from_acceptance(m, "engine", c.acceptance) for m, c in comparisons.items()}
    pairings = []
    for mode, cmp in comparisons.items():
        if mode == "eager" or runs.runs[mode].result is None:
            continue
        pairings.append(Pairing(records[mode], records["eager"], "eager", cmp.reference, cmp.padding))
    if baseline is not None:
        base = baseline_records(baseline, str(baseline_path))
        pairings += [Pairing(records[m], base[m], "baseline") for m in comparisons if runs.runs[m].result is not None]
    return pairings


def run_checks(runs: dict) -> list[GateCheck]:
    """Failing checks of the runs themselves: one per buffer of a mode the capacity audit refused, one for a
    capture that stopped at an op no graph can capture (nothing of those modes ran), one for a run stopped before
    a batch replayed a graph captured for another key than its own, one for a graph mode whose engine raised."""
    checks = [GateCheck(mode, "capacity audit", f"{s['owner']}.{s['buffer']} capacity", "capacity", False,
                        s["message"], method="exact", numbers={"capacity": s["capacity"], "needed": s["needed"]})
              for mode, run in runs.items() for s in run.short_buffers or ()]
    checks += [GateCheck(mode, "capture", f"capture of the {e['graph']}", "capture", False,
                         f"stopped at {e['source'] or 'an op of torch'}: {e['message']}", method="exact")
               for mode, run in runs.items() for e in [run.capture_error] if e]
    checks += [GateCheck(mode, "replay check", f"graph replayed for the {w['wanted']['graph']}", "graph", False,
                         f"stopped at step {w['step']}: the lookup found the {w['replayed']['graph']}",
                         method="exact")
               for mode, run in runs.items() for w in [run.wrong_graph] if w]
    checks += [GateCheck(mode, "engine", f"the engine's run at step {c['step']}", "engine", False, describe_crash(c),
                         method="exact")
               for mode, run in runs.items() for c in [getattr(run, "crashed", None)] if c]
    return checks


def noise_baselines(comparisons: dict) -> list[str]:
    """One note per padded reference: its acceptance next to eager's, the noise a graph mode is measured in."""
    eager = comparisons["eager"].acceptance
    notes, seen = [], set()
    for cmp in comparisons.values():
        if cmp.reference is None or cmp.reference.reference in seen:
            continue
        seen.add(cmp.reference.reference)
        acc = cmp.reference_acceptance
        notes.append(f"noise baseline: {cmp.reference.reference} (padded eager) accepts "
                     f"{' / '.join(f'{r:.3f}' for r in acc.rates)} (length {acc.mean_acceptance_length:.3f}) "
                     f"vs eager {' / '.join(f'{r:.3f}' for r in eager.rates)} "
                     f"({eager.mean_acceptance_length:.3f}): padding numerics alone")
    return notes
