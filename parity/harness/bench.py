"""Benchmarks, measured side by side in one run: forward latency per mode, `make parity`'s wall time, bisection cost.

1. Per-forward latency of eager vs piecewise vs full graphs for target verify,
   draft prefill and one draft step, at batch 1, 8 and 32 (uniform decode
   batches of 1+K tokens per request), on every backend present: eager and
   each graph mode run interleaved in one loop so the ratios share conditions.
2. The wall time of the default scenario in every mode (what `make parity` runs).
3. Given faults bisected on their home scenario: seconds and replays.
4. The analysis stage (`compare_runs`) of a session shaped like the 8B llama3-eagle one: every mode, its
   references parted from eager in half the requests, on records synthesised at the scenario's size.

Computes and returns plain rows; `parity bench` prints them.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from parity.analysis.compare import compare_runs
from parity.engine.config import EngineConfig
from parity.engine.metadata import RowPlan
from parity.engine.records import DRAFT_COLUMNS, FORWARD_COLUMNS, TOKEN_COLUMNS, RunResult
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs.descriptor import PHASES
from parity.graphs.factory import install_graphs, uninstall
from parity.harness.modes import ModeRun, RunSet, reference_names
from parity.harness.release import reclaim
from parity.harness.request import RunRequest
from parity.harness.scenario import load_scenario
from parity.harness.session import run_session

BATCHES = (1, 8, 32)


def sync(device) -> None:
    """Wait for `device` (a CUDA device; nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_engine(pair, batch: int, device, k: int = 3, max_model_len: int = 128) -> SpecDecodeEngine:
    config = EngineConfig(num_speculative_tokens=k, max_num_seqs=batch, max_num_batched_tokens=batch * (k + 1),
                          block_size=16, max_model_len=max_model_len)
    return SpecDecodeEngine(pair.target, pair.head, config, device)


def _prepare(engine, phase: str, batch: int):
    """Fill the owner of `phase` with a realistic uniform decode batch; returns (owner, rows)."""
    k = engine.config.num_speculative_tokens
    gen = torch.Generator().manual_seed(batch)
    vocab = engine.owner("target").model.config.vocab_size
    blocks_per = engine.config.blocks_per_seq
    rows = []
    for r in range(batch):
        q = 1 if phase == "draft_step" else k + 1
        tokens = torch.randint(0, vocab, (q,), generator=gen).tolist()
        rows.append(RowPlan(r, tokens, 40 + r % 7, list(range(r * blocks_per, (r + 1) * blocks_per))))
    owner = engine.owner("target" if phase == "verify" else "drafter")
    if phase != "verify":
        owner.buffers["hidden_states"][: sum(p.query_len for p in rows)].normal_(generator=None)
    return owner, rows


# Seconds each set of forwards runs before it is timed: module loads and first-call work out of the figures, and
# the host's and the device's clocks at their working speed.
WARMUP_S = 0.5


@dataclass
class Prepared:
    """One forward ready to run again and again: `call()` runs it through the engine's executor."""

    executor: object
    dispatch: object
    meta: object
    fn: object

    def call(self):
        return self.executor.execute(self.dispatch, self.fn, self.meta)

    def eager_at_padded_shape(self):
        """The same forward run eagerly at the graph's padded shape: the kernels a replay launches."""
        return self.fn(self.dispatch.num_tokens_padded, self.dispatch.num_reqs_padded, self.meta)


def prepare_forward(engine, phase: str, batch: int) -> Prepared:
    owner, rows = _prepare(engine, phase, batch)
    num_tokens = sum(r.query_len for r in rows)
    dispatch = owner.executor.dispatch(phase, num_tokens, len(rows), True)
    meta = owner.builder.build(rows, dispatch.num_tokens_padded, dispatch.num_reqs_padded)
    if phase != "verify":
        owner.buffers["sample_indices"][: len(rows)].copy_(
            torch.arange(len(rows)) * (rows[0].query_len) + rows[0].query_len - 1)
    return Prepared(owner.executor, dispatch, meta, owner.forward(phase).fn)


@contextlib.contextmanager
def forward_engines(pair, device, backend: str, modes, batch: int, max_model_len: int = 128, capture_sizes=None):
    """One engine per mode for uniform batches of `batch` requests, graphs captured; all released on exit."""
    engines = {}
    try:
        for mode in modes:
            engines[mode] = bench_engine(pair, batch, device, max_model_len=max_model_len)
            install_graphs(engines[mode], mode, backend, capture_sizes)
        yield engines
    finally:
        for engine in engines.values():
            uninstall(engine)
        engines.clear()
        reclaim(torch.device(device))


def interleaved_medians(prepared: dict[str, Prepared], device, iters: int) -> dict[str, float]:
    """Median seconds of each prepared forward, all timed in one loop so they share the machine's state, after
    a warm-up of the same loop for at least three rounds and `WARMUP_S` seconds."""
    samples = {mode: [] for mode in prepared}
    with torch.no_grad():
        rounds, warm_until = 0, time.perf_counter() + WARMUP_S
        while rounds < 3 or time.perf_counter() < warm_until:
            _timed_round(prepared, device)
            rounds += 1
        for _ in range(iters):
            for mode, seconds in _timed_round(prepared, device).items():
                samples[mode].append(seconds)
    return {mode: statistics.median(values) for mode, values in samples.items()}


def _timed_round(prepared: dict[str, Prepared], device) -> dict[str, float]:
    """Each prepared forward once, between two syncs: seconds per mode."""
    seconds = {}
    for mode, forward in prepared.items():
        sync(device)
        start = time.perf_counter()
        forward.call()
        sync(device)
        seconds[mode] = time.perf_counter() - start
    return seconds


def time_forwards(pair, device, backend: str, modes=("eager", "piecewise", "full"), iters: int = 30) -> list[dict]:
    """Median per-forward latency per (phase, batch, mode), modes interleaved in one loop."""
    results = []
    for batch in BATCHES:
        with forward_engines(pair, device, backend, modes, batch) as engines:
            for phase in PHASES:
                prepared = {mode: prepare_forward(engine, phase, batch) for mode, engine in engines.items()}
                medians = interleaved_medians(prepared, device, iters)
                for mode, median in medians.items():
                    results.append({"backend": backend, "phase": phase, "batch": batch, "mode": mode,
                                    "median_ms": round(median * 1e3, 4),
                                    "speedup_vs_eager": round(medians["eager"] / median, 3)})
    return results


def time_parity(scenario: str = "scenarios/default.yaml") -> dict:
    """Wall time of the default scenario in every mode (what `make parity` runs, without writing a folder)."""
    start = time.perf_counter()
    outcome = run_session(RunRequest("tiny-llama3-eagle", scenario, None, "auto"))
    return {"scenario": scenario, "seconds": round(time.perf_counter() - start, 2),
            "verdict": outcome.summary["verdict"], "backend": outcome.summary["backend"]}


def time_bisection(cases, backend: str, budget: int) -> list[dict]:
    """Each (fault name, scenario path, mode) bisected in its own `parity bisect` process."""
    rows = []
    for name, scenario, mode in cases:
        command = [sys.executable, "-m", "parity", "bisect", "--backend", backend, "--mode", mode, "--inject", name,
                   "--scenario", str(scenario), "--json"]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        d = json.loads(done.stdout) if done.returncode in (0, 1) else {"kind": "ERROR", "buffers": [], "replays": 0}
        timing = d.get("timing") or {}
        rows.append({"fault": name, "mode": mode, "kind": d["kind"], "buffers": d["buffers"],
                     "seconds": round(seconds, 2), "bisect_seconds": timing.get("bisect_seconds"),
                     "replays": d["replays"], "budget": budget})
    return rows


def synthetic_records(requests: int, tokens: int, k: int, seed: int) -> RunResult:
    """A greedy run's records at this size: each step a request drafts K tokens and emits 1 + those accepted."""
    rng = np.random.default_rng(seed)
    emitted, drafted = [], []
    for req in range(requests):
        index, step = 0, 0
        while index < tokens:
            accepted = int(rng.integers(0, k + 1))
            lps = np.sort(rng.uniform(-5, 0, 5))[::-1].tolist()
            drafted += [(step, req, j, 40 + index + j, int(rng.integers(0, 32000)), -0.5, 1.0, 7, lps[0],
                         list(range(5)), lps, j < accepted, accepted) for j in range(k)]
            emitted += [(req, step, i, 40 + i, int(rng.integers(0, 32000)), float(rng.uniform(-3, 0)), 1.0)
                        for i in range(index, min(tokens, index + accepted + 1))]
            index, step = index + accepted + 1, step + 1
    return RunResult(pd.DataFrame(drafted, columns=DRAFT_COLUMNS), pd.DataFrame(emitted, columns=TOKEN_COLUMNS),
                     pd.DataFrame(columns=FORWARD_COLUMNS), {}, 0, 0, 0)


def parted(result: RunResult, seed: int) -> RunResult:
    """The same records parted from `result` in half the requests: another token from some index on."""
    rng = np.random.default_rng(seed)
    t, d = result.tokens.copy(), result.drafts.copy()
    for req in rng.permutation(t.req_id.unique())[: t.req_id.nunique() // 2]:
        at = int(rng.integers(0, (t.req_id == req).sum()))
        t.loc[(t.req_id == req) & (t.output_index >= at), "token"] += 1
        d.loc[(d.req_id == req) & (d.position >= 40 + at), "draft_token"] += 1
    return RunResult(d, t, result.forwards, {}, 0, 0, 0)


def time_analysis(scenario_path: str = "scenarios/llama3-eagle.yaml", repeats: int = 3) -> dict:
    """Best-of seconds of `compare_runs` on every mode of the scenario and their references, at its size."""
    scenario = load_scenario(scenario_path)
    k, names = scenario.num_speculative_tokens, reference_names(scenario.modes, scenario)
    eager = synthetic_records(scenario.num_requests, scenario.max_tokens, k, seed=0)
    references = {name: ModeRun(name, parted(eager, i), "emulated", graph_replays=1)
                  for i, name in enumerate(sorted(set(names.values())))}
    runs = {"eager": ModeRun("eager", eager, "emulated"),
            **{m: ModeRun(m, references[n].result, "emulated", graph_replays=1) for m, n in names.items()}}
    runset = RunSet(runs, references, names)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        compare_runs(runset, scenario)
        seconds.append(time.perf_counter() - start)
    return {"scenario": scenario_path, "requests": scenario.num_requests, "tokens": scenario.max_tokens,
            "runs": len(runs) + len(references), "seconds": round(min(seconds), 3)}
