"""`make bench`: latency ratios measured side by side, `make parity`'s wall time, bisection cost.

1. Per-forward latency of eager vs piecewise vs full graphs for target verify,
   draft prefill and one draft step, at batch 1, 8 and 32 (uniform decode
   batches of 1+K tokens per request), on every backend present: eager and
   each graph mode run interleaved in one loop so the ratios share conditions.
2. The wall time of the default scenario in every mode (what `make parity` runs).
3. Each catalogued fault bisected in FULL on its home scenario: seconds and replays.

Usage: python -m parity.bench [--quick] [--json PATH] [--skip parity,bisect]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

BATCHES = (1, 8, 32)
PHASES = ("verify", "draft_prefill", "draft_step")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _engine(pair, batch: int, device, k: int = 3):
    from parity.engine.config import EngineConfig
    from parity.engine.spec_decode import SpecDecodeEngine

    config = EngineConfig(num_speculative_tokens=k, max_num_seqs=batch, max_num_batched_tokens=batch * (k + 1),
                          block_size=16, max_model_len=128)
    return SpecDecodeEngine(pair.target, pair.head, config, device)


def _prepare(engine, phase: str, batch: int):
    """Fill an owner's buffers with a realistic uniform decode batch; returns (owner, fn, meta, rows)."""
    from parity.engine.metadata import RowPlan

    k = engine.config.num_speculative_tokens
    gen = torch.Generator().manual_seed(batch)
    vocab = engine.target.model.config.vocab_size
    blocks_per = engine.config.blocks_per_seq
    rows = []
    for r in range(batch):
        q = 1 if phase == "draft_step" else k + 1
        tokens = torch.randint(0, vocab, (q,), generator=gen).tolist()
        rows.append(RowPlan(r, tokens, 40 + r % 7, list(range(r * blocks_per, (r + 1) * blocks_per))))
    if phase == "verify":
        return engine.target, engine.target.forward, rows
    proposer = engine.proposer
    num_tokens = sum(p.query_len for p in rows)
    proposer.buffers["hidden_states"][:num_tokens].normal_(generator=None)
    fn = proposer.prefill_forward if phase == "draft_prefill" else proposer.step_forward
    return proposer, fn, rows


def time_forwards(pair, device, backend: str, modes=("eager", "piecewise", "full"), iters: int = 30) -> list[dict]:
    """Median per-forward latency per (phase, batch, mode), modes interleaved in one loop."""
    from parity.graphs.context import forward_context
    from parity.graphs.factory import install_graphs

    results = []
    for batch in BATCHES:
        engines = {}
        for mode in modes:
            engine = _engine(pair, batch, device)
            install_graphs(engine, mode, backend)
            engines[mode] = engine
        for phase in PHASES:
            prepared = {}
            for mode, engine in engines.items():
                owner, fn, rows = _prepare(engine, phase, batch)
                executor = engine.target_executor if phase == "verify" else engine.drafter_executor
                num_tokens = sum(r.query_len for r in rows)
                dispatch = executor.dispatch(phase, num_tokens, len(rows), True)
                meta = owner.builder.build(rows, dispatch.num_tokens_padded, dispatch.num_reqs_padded)
                if phase != "verify":
                    owner.buffers["sample_indices"][: len(rows)].copy_(
                        torch.arange(len(rows)) * (rows[0].query_len) + rows[0].query_len - 1)
                prepared[mode] = (executor, dispatch, meta, fn)
            samples = {mode: [] for mode in prepared}
            with torch.no_grad():
                for i in range(iters + 3):
                    for mode, (executor, dispatch, meta, fn) in prepared.items():
                        _sync(device)
                        start = time.perf_counter()
                        with forward_context(meta):
                            executor.execute(dispatch, fn)
                        _sync(device)
                        if i >= 3:
                            samples[mode].append(time.perf_counter() - start)
            eager = statistics.median(samples["eager"])
            for mode, values in samples.items():
                median = statistics.median(values)
                results.append({"backend": backend, "phase": phase, "batch": batch, "mode": mode,
                                "median_ms": round(median * 1e3, 4), "speedup_vs_eager": round(eager / median, 3)})
    return results


def time_parity(scenario: str = "scenarios/default.yaml") -> dict:
    """Wall time of the default scenario in every mode on the CPU emulated backend (what `make parity` runs)."""
    from parity.session import RunRequest, run_session

    start = time.perf_counter()
    outcome = run_session(RunRequest("tiny-llama3-eagle", scenario, None, "auto", out="reports/bench-parity"),
                          show_progress=False)
    return {"scenario": scenario, "seconds": round(time.perf_counter() - start, 2),
            "verdict": outcome.summary["verdict"], "backend": outcome.summary["backend"]}


def time_bisection(backend: str) -> list[dict]:
    """Each catalogued fault bisected on its home scenario, one `parity bisect` process each."""
    import subprocess

    from parity.faults.catalog import FAULTS
    from parity.faults.matrix import home_scenario
    from parity.models.pair import load_pair

    pair = load_pair("tiny-llama3-eagle")
    engine = _engine(pair, 1, torch.device("cpu"))
    named = len(engine.target.buffers.names()) + len(engine.proposer.buffers.names())
    budget = 2 * math.ceil(math.log2(named)) + 4
    rows = []
    for name, fault in FAULTS.items():
        mode = "full" if "full" in fault.manifests_in else fault.manifests_in[0]
        command = [sys.executable, "-m", "parity", "bisect", "--backend", backend, "--mode", mode, "--inject", name,
                   "--scenario", str(home_scenario(fault)), "--json"]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        d = json.loads(done.stdout) if done.returncode in (0, 1) else {"kind": "ERROR", "buffers": [], "replays": 0}
        timing = d.get("timing") or {}
        rows.append({"fault": name, "mode": mode, "kind": d["kind"], "buffers": d["buffers"],
                     "seconds": round(seconds, 2), "bisect_seconds": timing.get("bisect_seconds"),
                     "replays": d["replays"], "budget": budget})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parity.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="reports/bench.json")
    parser.add_argument("--skip", default="", help="comma-separated: latency,parity,bisect")
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    from parity.models.pair import load_pair

    report: dict = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    backends = ["emulated"] + (["cuda"] if torch.cuda.is_available() else [])
    if "latency" not in skip:
        report["latency"] = []
        for backend in backends:
            device = torch.device("cuda" if backend == "cuda" else "cpu")
            pair = load_pair("tiny-llama3-eagle", device=device)
            report["latency"] += time_forwards(pair, device, backend, iters=args.iters)
        if torch.cuda.is_available():
            report["gpu"] = torch.cuda.get_device_name(0)
        _print_latency(report["latency"])
    if "parity" not in skip:
        report["parity"] = time_parity()
        print(f"\nmake parity (default scenario, all modes, {report['parity']['backend']}): "
              f"{report['parity']['seconds']} s, {report['parity']['verdict']}")
    if "bisect" not in skip:
        report["bisect"] = time_bisection("auto")
        print("\nbisection on each fault's home scenario (in FULL where it shows there):")
        for row in report["bisect"]:
            print(f"  {row['fault']:<26} {row['mode']:<17} {row['kind']:<18} bisection {row['bisect_seconds']} s "
                  f"(process {row['seconds']:.1f} s)  {row['replays']:>2} replays (budget {row['budget']})")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten {path}")
    return 0


def _print_latency(rows: list[dict]) -> None:
    print(f"{'backend':<9} {'phase':<14} {'batch':>5} {'eager ms':>9} {'piecewise':>10} {'full':>8}   (speedup vs eager)")
    index = {(r["backend"], r["phase"], r["batch"], r["mode"]): r for r in rows}
    for backend, phase, batch in sorted({(r["backend"], r["phase"], r["batch"]) for r in rows}):
        eager = index[(backend, phase, batch, "eager")]["median_ms"]
        pw = index[(backend, phase, batch, "piecewise")]["speedup_vs_eager"]
        full = index[(backend, phase, batch, "full")]["speedup_vs_eager"]
        print(f"{backend:<9} {phase:<14} {batch:>5} {eager:>9.3f} {pw:>9.2f}x {full:>7.2f}x")


if __name__ == "__main__":
    sys.exit(main())
