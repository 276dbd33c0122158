"""Benchmarks, measured side by side in one run: forward latency per mode, `make parity`'s wall time, bisection cost.

1. Per-forward latency of eager vs piecewise vs full graphs for target verify,
   draft prefill and one draft step, at batch 1, 8 and 32 (uniform decode
   batches of 1+K tokens per request), on every backend present: eager and
   each graph mode run interleaved in one loop so the ratios share conditions.
2. The wall time of the default scenario in every mode (what `make parity` runs).
3. Given faults bisected on their home scenario: seconds and replays.

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

import torch

from parity.engine.config import EngineConfig
from parity.engine.metadata import RowPlan
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs.descriptor import PHASES
from parity.graphs.factory import install_graphs, uninstall
from parity.harness.release import reclaim
from parity.harness.request import RunRequest
from parity.harness.session import run_session

BATCHES = (1, 8, 32)


def _sync(device) -> None:
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
    """Median seconds of each prepared forward, all timed in one loop so they share the machine's state."""
    samples = {mode: [] for mode in prepared}
    with torch.no_grad():
        for i in range(iters + 3):
            for mode, forward in prepared.items():
                _sync(device)
                start = time.perf_counter()
                forward.call()
                _sync(device)
                if i >= 3:
                    samples[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(values) for mode, values in samples.items()}


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
