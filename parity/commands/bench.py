"""`parity bench`: latency ratios, `make parity`'s wall time, bisection cost, the audit's overhead, the
clean engine's false alarms under padding numerics and the analysis stage's seconds at the 8B session's size;
`parity bench false-alarms` (the gate's rates) and `parity bench scale` (a real-shape pair on a GPU)."""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from parity.audit.bench import measure_overhead
from parity.commands.bench_steps import STEPS
from parity.commands.bench_scale import scale
from parity.commands.common import console
from parity.commands.options import EXIT_PASS
from parity.errors import ParityInputError
from parity.faults.catalog import FAULTS, home_scenario
from parity.harness import bench, false_alarms
from parity.harness.clean_alarms import clean_alarms
from parity.harness.scenario import load_scenario
from parity.models.pair import load_pair
from parity.builders.synth.build import synthesize
from parity.builders.synth.spec import TARGET_FOLDER, SynthRequest
from parity.report.bench import alarms_line, audit_line

def main(args) -> int:
    """Run the benchmarks asked for and print their figures."""
    if args.suite == "false-alarms":
        return false_alarm_rates(args)
    if args.suite == "scale":
        return scale(args)
    skip = set(filter(None, args.skip.split(",")))
    unknown = sorted(skip - set(STEPS))
    if unknown:
        raise ParityInputError(f"--skip {','.join(unknown)}: not a step of parity bench (steps: {', '.join(STEPS)})")
    faults = [f for f in args.faults.split(",") if f]
    if set(faults) - set(FAULTS):
        raise ParityInputError(f"--faults: unknown fault(s) {', '.join(sorted(set(faults) - set(FAULTS)))} "
                               f"(`parity faults list` has them)")
    report: dict = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    for step, run in (("latency", _latency), ("parity", _parity), ("bisect", _bisect), ("audit", _audit),
                      ("alarms", _alarms), ("analysis", _analysis)):
        if step not in skip:
            report[step] = run(args)
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name(0)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten {path}")
    return EXIT_PASS


def _latency(args) -> list[dict]:
    rows = []
    for backend in ["emulated"] + (["cuda"] if torch.cuda.is_available() else []):
        device = torch.device("cuda" if backend == "cuda" else "cpu")
        pair = load_pair("tiny-llama3-eagle", device=device)
        rows += bench.time_forwards(pair, device, backend, iters=args.iters)
    _print_latency(rows)
    return rows


def _parity(args) -> dict:
    result = bench.time_parity()
    print(f"\nmake parity (default scenario, all modes, {result['backend']}): {result['seconds']} s, "
          f"{result['verdict']}")
    return result


def _bisect(args) -> list[dict]:
    rows = bench.time_bisection(_bisection_cases([f for f in args.faults.split(",") if f]), "auto", _replay_budget())
    print("\nbisection on each fault's home scenario (in FULL where it shows there):")
    for row in rows:
        print(f"  {row['fault']:<26} {row['mode']:<17} {row['kind']:<18} bisection {row['bisect_seconds']} s "
              f"(process {row['seconds']:.1f} s)  {row['replays']:>2} replays (budget {row['budget']})")
    return rows


def _audit(args) -> dict:
    result = measure_overhead()
    print("\n" + audit_line(result))
    return result


def _alarms(args) -> dict:
    real = args.alarm_shape is not None and torch.cuda.is_available()
    scale = args.numerics_scale if args.numerics_scale is not None else (0.0 if real else 0.1)
    options = dict(seeds=args.seeds, scale=scale, requests=args.alarm_requests, max_tokens=args.alarm_tokens)
    if args.alarm_shape is None:
        result = clean_alarms(**options)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            synthesize(SynthRequest(args.alarm_shape, "eagle1", 0.8, "bfloat16", tmp + "/pair", 0, device),
                       progress=lambda line: print(f"  synth: {line}", file=sys.stderr))
            result = clean_alarms(**options, pair_paths=(f"{tmp}/pair/{TARGET_FOLDER}", f"{tmp}/pair/eagle1"),
                                  model=f"synthetic {args.alarm_shape}")
    console().print("\n" + alarms_line(result), highlight=False)
    return result


def _analysis(args) -> dict:
    r = bench.time_analysis()
    print(f"\nanalysis (compare_runs) of {r['requests']} requests x {r['tokens']} tokens, {r['runs']} runs "
          f"({r['scenario']}, synthetic records): {r['seconds']} s, best of 3")
    return r


def _bisection_cases(names=()) -> list[tuple[str, Path, str]]:
    return [(name, home_scenario(f), "full" if "full" in f.manifests_in else f.manifests_in[0])
            for name, f in FAULTS.items() if not names or name in names]


def _replay_budget() -> int:
    engine = bench.bench_engine(load_pair("tiny-llama3-eagle"), 1, torch.device("cpu"))
    named = sum(len(o.buffers.names()) for o in engine.owners())
    return 2 * math.ceil(math.log2(named)) + 4


def _print_latency(rows: list[dict]) -> None:
    print(f"{'backend':<9} {'phase':<14} {'batch':>5} {'eager ms':>9} {'piecewise':>10} {'full':>8}   (speedup vs eager)")
    index = {(r["backend"], r["phase"], r["batch"], r["mode"]): r for r in rows}
    for backend, phase, batch in sorted({(r["backend"], r["phase"], r["batch"]) for r in rows}):
        eager = index[(backend, phase, batch, "eager")]["median_ms"]
        pw = index[(backend, phase, batch, "piecewise")]["speedup_vs_eager"]
        full = index[(backend, phase, batch, "full")]["speedup_vs_eager"]
        print(f"{backend:<9} {phase:<14} {batch:>5} {eager:>9.3f} {pw:>9.2f}x {full:>7.2f}x")


def false_alarm_rates(args) -> int:
    """Print the measured false-alarm rates of the gate on the clean engine."""
    torch.set_num_threads(1)
    scenario = false_alarms.tiny(load_scenario(args.scenario), args.requests, args.max_tokens, args.temperature)
    start = time.perf_counter()
    r = false_alarms.measure(scenario, args.seeds, args.mode, args.backend,
                             progress=lambda seed, verdict: print(f"seed {seed}: {verdict}", file=sys.stderr)
                             if verdict != "pass" else None)
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
    return EXIT_PASS
