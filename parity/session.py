"""One `parity run`: scenario -> runs (one per mode) -> comparison -> summary -> artifacts."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from parity.errors import ParityInputError
from parity.scenario import MODE_NAMES, Scenario, load_scenario


@dataclass(frozen=True)
class RunRequest:
    model: str
    scenario_path: str
    modes: tuple[str, ...] | None      # None: the scenario's modes
    backend: str
    faults: tuple[str, ...] = ()
    out: str | None = None
    seed: int | None = None
    target_path: str | None = None
    draft_path: str | None = None
    dtype: str = "auto"
    bisect: bool = True

    @classmethod
    def from_args(cls, args) -> "RunRequest":
        modes = None if args.modes in (None, "", "all") else tuple(m.strip() for m in args.modes.split(","))
        return cls(args.model, args.scenario, modes, args.backend, tuple(args.inject), args.out, args.seed,
                   args.target_path, args.draft_path, args.dtype, not getattr(args, "no_bisect", False))


@dataclass
class RunOutcome:
    summary: dict
    runs: dict
    out_dir: Path
    scenario: Scenario


def resolve_modes(requested: tuple[str, ...] | None, scenario: Scenario) -> tuple[str, ...]:
    modes = requested or scenario.modes
    for m in modes:
        if m not in MODE_NAMES:
            raise ParityInputError(f"unknown mode {m!r} (known: {', '.join(MODE_NAMES)})")
    # eager is the reference every other mode is compared with: it always runs, first.
    return ("eager",) + tuple(m for m in dict.fromkeys(modes) if m != "eager")


def resolve_backend(backend: str) -> tuple[str, torch.device]:
    if backend == "cuda" and not torch.cuda.is_available():
        raise ParityInputError("--backend cuda: CUDA is not available on this machine (use emulated or auto)")
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "emulated"
    return backend, torch.device("cuda" if backend == "cuda" else "cpu")


def resolve_dtype(dtype: str, embedded: bool, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if embedded or device.type == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_request_scenario(scenario_path: str, seed: int | None) -> Scenario:
    """The scenario file, with the command line's --seed applied."""
    scenario = load_scenario(scenario_path)
    return dataclasses.replace(scenario, seed=seed) if seed is not None else scenario


def load_request_pair(request, device: torch.device):
    """The model pair a request names, in the dtype it asks for, on `device`."""
    from parity.models.pair import load_pair
    from parity.models.zoo import get_entry

    entry = get_entry(request.model)
    return load_pair(request.model, target_path=request.target_path, draft_path=request.draft_path,
                     dtype=resolve_dtype(request.dtype, entry.embedded, device), device=device)


def run_modes(pair, scenario: Scenario, modes, backend: str, device, faults, show_progress: bool) -> dict:
    """One engine run per mode on the same schedule, with a progress bar per mode."""
    from parity.runner import run_mode

    runs = {}
    with _progress(show_progress) as bar:
        for mode in modes:
            task = bar.add_task(f"{mode:<20}", total=scenario.num_requests) if bar else None
            tick = (lambda step, done, t=task: bar.advance(t, len(done))) if bar else None
            runs[mode] = run_mode(pair, scenario, mode, backend, device, faults, progress=tick)
    return runs


def run_session(request: RunRequest, show_progress: bool = True) -> RunOutcome:
    from parity.analysis.compare import compare_runs
    from parity.analysis.summary import build_summary
    from parity.cli import default_run_id
    from parity.faults.catalog import resolve_faults
    from parity.report.artifacts import write_run

    scenario = load_request_scenario(request.scenario_path, request.seed)
    modes = resolve_modes(request.modes, scenario)
    backend, device = resolve_backend(request.backend)
    faults = resolve_faults(request.faults)
    pair = load_request_pair(request, device)
    runs = run_modes(pair, scenario, modes, backend, device, faults, show_progress)
    comparisons = compare_runs(runs, scenario)
    diagnoses = {}
    if request.bisect:
        drifting = [m for m, c in comparisons.items() if c.verdict == "drift"]
        for mode in drifting:
            diagnoses[mode] = diagnose(pair, scenario, mode, backend, device, faults).as_dict()
    first = next(iter(diagnoses.values()), None)
    summary = build_summary(model=pair.name, model_checksum=pair.checksum(), scenario=scenario, backend=backend,
                            device=str(device), comparisons=comparisons, runs=runs, tokenizer=pair.tokenizer,
                            diagnosis=first)
    summary["diagnoses"] = diagnoses
    summary["faults"] = list(request.faults)
    out_dir = Path(request.out) if request.out else Path("reports") / default_run_id(pair.name, scenario.name)
    from parity.report.writers import RUN_REPORT_WRITERS
    write_run(out_dir, summary, runs, extra_writers=RUN_REPORT_WRITERS)
    return RunOutcome(summary, runs, out_dir, scenario)


def bisect_session(request: RunRequest, mode: str | None) -> dict:
    """`parity bisect`: diagnose one mode (the first scenario mode that drifts when none is given)."""
    from parity.analysis.compare import compare_runs
    from parity.faults.catalog import resolve_faults

    scenario = load_request_scenario(request.scenario_path, request.seed)
    backend, device = resolve_backend(request.backend)
    faults = resolve_faults(request.faults)
    if mode is not None and mode not in MODE_NAMES:
        raise ParityInputError(f"unknown mode {mode!r} (known: {', '.join(MODE_NAMES)})")
    if mode == "eager":
        raise ParityInputError("--mode eager: eager is the reference; bisect a graph mode")
    pair = load_request_pair(request, device)
    if mode is None:
        modes = resolve_modes(request.modes, scenario)
        runs = run_modes(pair, scenario, modes, backend, device, faults, show_progress=False)
        drifting = [m for m, c in compare_runs(runs, scenario).items() if c.verdict == "drift"]
        if not drifting:
            return {"kind": "NONE", "buffers": [], "mode": None,
                    "evidence": [f"no mode of {', '.join(modes)} drifts from eager"], "replays": 0}
        mode = drifting[0]
    return diagnose(pair, scenario, mode, backend, device, faults).as_dict()


def diagnose(pair, scenario: Scenario, mode: str, backend: str, device, faults=frozenset()):
    """Bisect `mode` on engines built exactly as `parity run` builds them."""
    from parity.analysis.bisect import bisect_mode
    from parity.engine.spec_decode import SpecDecodeEngine
    from parity.runner import engine_config, request_specs

    config = engine_config(scenario, faults=faults)
    specs = request_specs(scenario, pair.tokenizer, config)

    def make_engine():
        return SpecDecodeEngine(pair.target, pair.head, config, device)

    start = time.perf_counter()
    diagnosis = bisect_mode(make_engine, specs, mode, backend, scenario, tolerance=scenario.tolerances.logprob_abs)
    diagnosis.timing = {"bisect_seconds": round(time.perf_counter() - start, 3)}
    return diagnosis


class _NoBar:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _progress(show: bool):
    if not show:
        return _NoBar()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=True)
