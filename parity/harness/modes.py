"""Scenario -> one engine run per mode and per padded reference, on the same schedule -> records.

Every run is a fresh engine (fresh KV cache and graphs) assembled from the
same parts; the parts and the capture policy say which classes play each role
and how graphs are captured. Each graph mode also gets its strict padded
reference: the same dispatcher, every graphed forward run eagerly at the
padded shape, its padding poisoned. Modes that pad every batch alike (the same
`padding_signature` for target and drafter) share one reference run.

Runs happen one after another in bounded memory: each run's engine, KV cache,
graphs and pools are given back before the next starts (`release.measured`),
and each run records its memory (CUDA: baseline, peak, leftover) and timing;
or, given a concurrent `pool` (`harness.concurrent`), at the same time in
worker processes sharing the weights, each run the same code on its own engine.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from dataclasses import dataclass, field

import torch

from parity.analysis.yardstick import Yardstick
from parity.diagnose.routing import Routes
from parity.engine.config import EngineConfig
from parity.engine.overlap import OverlapEngine
from parity.engine.padding_probe import PaddingProbe
from parity.engine.parts import EngineParts
from parity.engine.records import RunResult
from parity.engine.spec_decode import RequestSpec, SpecDecodeEngine
from parity.errors import ParityInputError
from parity.graphs.capacity import ShortBuffers
from parity.graphs.capture_errors import CaptureError
from parity.graphs.descriptor import WrongGraph
from parity.graphs.factory import install_graphs, install_padded_reference, uninstall
from parity.graphs.modes import EAGER, padding_signature
from parity.graphs.policy import CapturePolicy
from parity.harness.crashes import engine_crash
from parity.harness.release import Stopwatch, frozen_heap, measured
from parity.harness.scenario import Scenario
from parity.harness.run_context import NotSendable, RunContext, torch_settings


@dataclass
class ModeRun:
    mode: str
    result: RunResult | None       # None: refused before it ran (`short_buffers`, `capture_error`), stopped
                                   # before a wrong graph replayed (`wrong_graph`) or when the engine raised
                                   # (`crashed`)
    backend: str
    capture: dict = field(default_factory=dict)   # graph capture summary (sizes, manifest)
    graph_replays: int | None = None              # graph replays really run (None: no graphs installed)
    memory: dict | None = None     # CUDA: baseline, peak and leftover bytes of this run (release.measured)
    timing: dict = field(default_factory=dict)    # capture and run seconds
    short_buffers: list[dict] | None = None       # the capacity audit's findings when it refused the mode
    capture_error: dict | None = None  # an op a graph cannot capture stopped the capture (`graphs.capture_errors`)
    # The run stopped where a batch was about to replay a graph captured for another owner, phase, runtime mode
    # or descriptor than its own: both keys, what differs, and the step.
    wrong_graph: dict | None = None
    crashed: dict | None = None        # the engine raised in this graph mode, eager did not (`harness.crashes`)
    padding_probe: dict | None = None  # a reference's check of the padding contract (`engine.padding_probe`)
    # An overlapped run's staged buffers, "<owner>.<buffer>" -> the phases of the forwards each feeds (`engine.staging`)
    staged: dict[str, list[str]] | None = None


@dataclass
class RunSet:
    """Eager and each graph mode, the padded references, and which reference judges which mode."""

    runs: dict[str, ModeRun]
    references: dict[str, ModeRun] = field(default_factory=dict)
    reference_of: dict[str, str] = field(default_factory=dict)
    yardstick: Yardstick = Yardstick("float32")   # how far a reference may part from eager (numerics)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)   # run -> (start, end), perf_counter
    concurrency: dict | None = None     # concurrent runs: the device memory sampled and the planned peak

    def all_runs(self) -> dict[str, ModeRun]:
        return {**self.runs, **self.references}


def yardstick(pair, parts: EngineParts) -> Yardstick:
    """The fixed padding-numerics bound of this pair's dtype (and of the numerics seam, when on)."""
    dtype = str(pair.target.lm_head.weight.dtype).removeprefix("torch.")
    return Yardstick(dtype, parts.padding_numerics)


def reference_names(modes, scenario: Scenario) -> dict[str, str]:
    """graph mode -> the name of its padded reference (`ref:<first mode that pads this way>`)."""
    names, by_signature = {}, {}
    for mode in modes:
        if mode == EAGER:
            continue
        signature = (padding_signature(mode), padding_signature(scenario.drafter_mode or mode))
        names[mode] = by_signature.setdefault(signature, f"ref:{mode}")
    return names


def capture_policy(scenario: Scenario, policy: CapturePolicy) -> CapturePolicy:
    """The run's policy with the scenario's own capture choices folded in."""
    if scenario.shared_drafter_pool:
        return dataclasses.replace(policy, shared_drafter_pool=True)
    return policy


def request_specs(scenario: Scenario, tokenizer, config: EngineConfig) -> list[RequestSpec]:
    """Tokenised requests; prompts cycle when num_requests exceeds the prompt set."""
    specs = []
    for i in range(scenario.num_requests):
        prompt_id, text = scenario.prompts[i % len(scenario.prompts)]
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ParityInputError(f"{scenario.prompts_file}: prompt {prompt_id!r} is empty after tokenisation")
        limit = config.max_model_len - config.num_speculative_tokens - 1
        if len(ids) >= limit:
            raise ParityInputError(
                f"{scenario.prompts_file}: prompt {prompt_id!r} has {len(ids)} tokens; max_model_len "
                f"{config.max_model_len} leaves room for at most {limit - 1} with K={config.num_speculative_tokens}")
        specs.append(RequestSpec(i, tuple(ids), scenario.max_tokens, scenario.arrivals[i]))
    return specs


def run_mode(pair, scenario: Scenario, mode: str, backend: str, device: torch.device,
             parts: EngineParts = EngineParts(), policy: CapturePolicy = CapturePolicy(), progress=None,
             sync: dict | None = None) -> ModeRun:
    """Run the scenario once in `mode` on a fresh engine (fresh KV cache and graphs), released afterwards.

    With the scenario's `overlap`, a graph mode runs the overlapped loop (`sync`: its staging experiment)."""
    def install(engine):
        return install_graphs(engine, mode, backend, scenario.capture_sizes, scenario.drafter_mode,
                              capture_policy(scenario, policy))
    overlapped = scenario.overlap and mode != EAGER
    return _run(pair, scenario, mode, backend, device, parts, install, progress, overlapped, sync)


def run_reference(pair, scenario: Scenario, mode: str, name: str, device: torch.device,
                  parts: EngineParts = EngineParts(), poison: bool = True, progress=None,
                  inert_reads: bool = False) -> ModeRun:
    """`mode`'s strict padded reference: its dispatcher, eager execution, padding poisoned (or not).

    Poisoned, it also probes the padding contract (two poisons, `engine.padding_probe`); `inert_reads` adds
    the diagnosis experiment that moves INERT padded entries off their pad values.
    """
    probes = []

    def install(engine):
        # The probe outlives the run (its summary is read after): it must not keep the engine alive.
        held = weakref.ref(engine)
        probe = (PaddingProbe(lambda: held().free_blocks(), engine.config.block_size, lambda: held().step,
                              inert_reads, Routes()) if poison else None)
        if probe is not None:
            probes.append(probe)
        install_padded_reference(engine, mode, scenario.capture_sizes, scenario.drafter_mode, poison=poison,
                                 probe=probe)
        return {}
    run = _run(pair, scenario, name, "reference", device, parts, install, progress)
    if probes:
        run.padding_probe = probes[0].summary()
        run.timing["padding_probe_seconds"] = round(probes[0].seconds, 3)
    return run


def _run(pair, scenario: Scenario, name: str, backend: str, device, parts: EngineParts, install,
         progress, overlapped: bool = False, sync: dict | None = None) -> ModeRun:
    """Build an engine, `install(engine)` its executors, run, and give every byte of it back."""
    config = EngineConfig.of(scenario)
    specs = request_specs(scenario, pair.tokenizer, config)
    watch = Stopwatch()

    def go():
        engine = (OverlapEngine(pair.target, pair.head, config, device, parts, sync) if overlapped
                  else SpecDecodeEngine(pair.target, pair.head, config, device, parts))
        try:
            with watch("capture_seconds"):
                try:
                    capture = install(engine)
                except ShortBuffers as short:
                    # The mode's padded shapes do not fit the engine's buffers: a graph bug, found before capture.
                    return ModeRun(name, None, backend, short_buffers=[s.as_dict() for s in short.shortfalls])
                except CaptureError as error:
                    # A graph cannot capture an op the forward makes: a graph bug of this mode, found at capture.
                    return ModeRun(name, None, backend, capture_error=error.as_dict())
            with watch("run_seconds"):
                try:
                    result = engine.run(specs, progress=progress)
                except WrongGraph as wrong:
                    # Stopped before the graph of another key ran: a graph bug of this mode, found at replay.
                    return ModeRun(name, None, backend, capture, wrong_graph={**wrong.as_dict(), "step": engine.step})
                except Exception as error:
                    crash = engine_crash(error, engine.step) if name != EAGER and backend != "reference" else None
                    if crash is None:
                        raise
                    return ModeRun(name, None, backend, capture, crashed=crash)
            replays = [o.executor.replays for o in engine.owners() if hasattr(o.executor, "replays")]
            return ModeRun(name, result, backend, capture, sum(replays) if replays else None,
                           staged=engine.stager.phases() if overlapped else None)
        finally:
            uninstall(engine)

    run, run.memory = measured(go, device, f"the {name} run of {scenario.name}", scenario)
    run.timing = watch.seconds
    return run


def run_modes(pair, scenario: Scenario, modes, backend: str, device, parts: EngineParts = EngineParts(),
              policy: CapturePolicy = CapturePolicy(), progress=None, on_run=None, pool=None) -> RunSet:
    """Eager, each graph mode and each padded reference, on the same schedule: one after another, or in the
    workers of `pool` (`harness.concurrent`) at the same time when it is concurrent.

    `progress`, when given, is told `start(name, num_requests)` before each run
    and `advance(name, num_finished)` as requests finish; `on_run(run)`, when
    given, gets each finished ModeRun (its memory and timing included).
    Each run's span (start, end on this process's clock) goes in `RunSet.spans`.
    """
    runset = RunSet({}, reference_of=reference_names(modes, scenario), yardstick=yardstick(pair, parts))
    if pool is not None and pool.concurrency.concurrent:
        try:
            return _run_concurrently(runset, pool, pair, scenario, modes, backend, device, parts, policy, progress,
                                     on_run)
        except NotSendable as why:
            runset.concurrency = {"jobs": 1, "concurrent": False, "reason": f"sequential: {why}"}
    with frozen_heap():
        for mode in modes:
            start = time.perf_counter()
            runset.runs[mode] = run_mode(pair, scenario, mode, backend, device, parts, policy,
                                         progress=_ticker(progress, mode, scenario))
            runset.spans[mode] = (start, time.perf_counter())
            if on_run is not None:
                on_run(runset.runs[mode])
        for mode, name in runset.reference_of.items():
            if name not in runset.references:
                start = time.perf_counter()
                runset.references[name] = run_reference(pair, scenario, mode, name, device, parts,
                                                        progress=_ticker(progress, name, scenario))
                runset.spans[name] = (start, time.perf_counter())
                if on_run is not None:
                    on_run(runset.references[name])
    return runset


def _run_concurrently(runset: RunSet, pool, pair, scenario: Scenario, modes, backend: str, device, parts, policy,
                      progress, on_run) -> RunSet:
    context = RunContext(pair, scenario, backend, torch.device(device), parts, policy, torch_settings())
    done = pool.run(context, progress, on_run)
    runset.runs = {mode: done["runs"][mode] for mode in modes}
    runset.references = {name: done["runs"][name] for name in dict.fromkeys(runset.reference_of.values())}
    runset.spans = done["spans"]
    runset.concurrency = {k: v for k, v in done.items() if k not in ("runs", "spans")}
    return runset


def _ticker(progress, name: str, scenario: Scenario):
    if progress is None:
        return None
    progress.start(name, scenario.num_requests)
    return lambda step, done: progress.advance(name, len(done))
