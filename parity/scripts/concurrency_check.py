"""Concurrent vs sequential on one GPU: `python -m parity.scripts.concurrency_check [--scenario S]`.

1. the synthetic 8B EAGLE-3 pair, `parity models synth --shape llama3-8b --head eagle3 --dtype bfloat16`
   (reused when --synth-dir already holds one);
2. `parity run --model local ... --modes all --verbose` on the scenario twice, as `python -m parity`
   subprocesses timed whole (process wall): with `--jobs N` (default: the run's own default, concurrent on
   CUDA as the memory plan allows) and with `--jobs 1`;
3. on stdout: the two walls, whether the verdicts and the acceptance (per mode: per-position counts and rates,
   mean length) are equal, how the concurrent run went (its reason, the run that bounded it, the critical
   path, the concurrency achieved), and peak memory against the plan: per run, and the device's peak
   during the concurrent runs against the concurrent plan.
Exit 0 when both runs pass with equal verdicts and acceptance, 1 otherwise. Output folders under --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from parity.report.bench import concurrency_line
from parity.report.memory import human

ROOT = Path(__file__).resolve().parent.parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.scripts.concurrency_check")
    p.add_argument("--scenario", default="scenarios/llama3-eagle.yaml")
    p.add_argument("--synth-dir", default="/tmp/synth8b-eagle3")
    p.add_argument("--jobs", default=None, help="the concurrent run's --jobs (default: parity run's default)")
    p.add_argument("--out", default="reports/concurrency-check")
    args = p.parse_args(argv)
    synth, out = Path(args.synth_dir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (synth / "target").is_dir():
        _call(["models", "synth", "--shape", "llama3-8b", "--head", "eagle3", "--dtype", "bfloat16",
               "--out", str(synth)], out / "synth.log")
    walls, summaries = {}, {}
    for label, jobs in (("concurrent", args.jobs), ("sequential", "1")):
        folder = out / f"{label}-{Path(args.scenario).stem}"
        command = ["run", "--model", "local", "--target-path", str(synth / "target"), "--draft-path",
                   str(synth / "eagle3"), "--dtype", "bfloat16", "--scenario", args.scenario, "--modes", "all",
                   "--verbose", "--quiet", "--out", str(folder), "--force", *(["--jobs", jobs] if jobs else [])]
        walls[label], code = _call(command, out / f"{label}.log")
        summary_path = folder / "summary.json"
        if not summary_path.is_file():
            print(f"{label}: parity run exited {code} without a summary; see {out / f'{label}.log'}")
            return 1
        summaries[label] = json.loads(summary_path.read_text())
    return _report(args.scenario, walls, summaries)


def _call(command: list[str], log: Path) -> tuple[float, int]:
    start = time.perf_counter()
    with open(log, "w") as sink:
        code = subprocess.run([sys.executable, "-m", "parity", *command], cwd=ROOT, stdout=sink,
                              stderr=subprocess.STDOUT).returncode
    return round(time.perf_counter() - start, 1), code


def _acceptance(summary: dict) -> dict:
    return {mode: (m.get("verdict"), m.get("accepted_per_position"), m.get("acceptance_per_position"),
                   m.get("mean_acceptance_length")) for mode, m in summary["modes"].items()}


def _report(scenario: str, walls: dict, summaries: dict) -> int:
    con, seq = summaries["concurrent"], summaries["sequential"]
    same = _acceptance(con) == _acceptance(seq) and con["verdict"] == seq["verdict"]
    print(f"{scenario}: concurrent {walls['concurrent']} s ({con['verdict'].upper()}), sequential "
          f"{walls['sequential']} s ({seq['verdict'].upper()}) process wall; verdicts and acceptance "
          f"{'EQUAL' if same else 'DIFFER'}")
    for mode, (verdict, _, rates, length) in _acceptance(con).items():
        print(f"  {mode:<20} {verdict:<6} acceptance {rates} length {length}")
    for label, summary in summaries.items():
        measured = summary.get("measured") or {}
        print(f"{label}: {concurrency_line(measured.get('concurrency'))}")
        plan = ((measured.get("memory_plan") or {}).get("modes")) or {}
        for name, memory in (measured.get("memory") or {}).items():
            if memory:
                planned = (plan.get(name) or plan.get("eager") or {}).get("total_bytes")
                print(f"  {name:<20} peak {human(memory['peak_bytes'])} reserved "
                      f"{human(memory['peak_reserved_bytes'])} plan {human(planned)} leftover "
                      f"{human(memory['leftover_bytes'])}")
    return 0 if same and con["verdict"] == seq["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
