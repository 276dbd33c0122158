"""The tensor-parallel check at 70B, one command: `python -m parity.scripts.tp_scale` on a 2-GPU box.

On two H200s (or `--tp 4` on four H100s), given nothing:
 1. `parity models synth --shape llama3-70b --head eagle1 --at-load`: configs, tokenizer and the recipe
    (each rank draws its slices of the weights on its own GPU at load: no 140 GB on disk);
 2. `parity run --tp N ... --scenario scenarios/llama3-70b-tp.yaml --modes all`: PASS expected, bitwise per rank;
 3. the same with `--modes full --inject F` (default tp-seq-lens-rank0-only): DRIFT expected (exit 1);
 4. the same with `--modes full --inject tp-rank-pads-up`, a planted rank divergence: RANK_DIVERGENCE (exit 1)
    within `--tp-timeout`, never a hang;
then, per step, its wall time and exit code, and per rank the peak device memory of its runs.
Every output goes to $OUT (default reports/tp-scale): NN-step.log, run-<step>/ run folders, summary.txt.
`--shape tiny --backend emulated --dtype float32 --scenario scenarios/tp-short.yaml` is its CPU twin
(tests/test_tp_scale.py). With `--backend cuda` and fewer GPUs than ranks it prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DIVERGENCE = "tp-rank-pads-up"


def subprocess_launcher(argv: list[str], log: Path) -> int:
    """`python -m parity ARGV`, its output in `log`: each step frees its GPUs when it exits."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "NO_COLOR": "1"}
    with log.open("w") as sink:
        sink.write("$ parity " + " ".join(argv) + "\n")
        sink.flush()
        return subprocess.run([sys.executable, "-m", "parity", *argv], cwd=ROOT, env=env, stdout=sink,
                              stderr=subprocess.STDOUT).returncode


def peak_memory(run_dir: Path) -> dict[str, float | None]:
    """rank -> the largest peak of its runs, GiB (None off CUDA)."""
    peaks = {}
    for summary in sorted(run_dir.glob("ranks/rank*/summary.json")):
        memory = json.loads(summary.read_text()).get("measured", {}).get("memory", {})
        values = [m["peak_bytes"] for m in memory.values() if m and m.get("peak_bytes") is not None]
        peaks[summary.parent.name] = round(max(values) / 2**30, 2) if values else None
    return peaks


def verdict_of(run_dir: Path) -> str:
    if not (run_dir / "summary.json").is_file():
        return "no run folder"
    summary = json.loads((run_dir / "summary.json").read_text())
    kind = (summary.get("diagnosis") or {}).get("kind")
    return summary["verdict"].upper() + (f" {kind}" if kind else "")


def steps(args, pair: list[str], out: Path) -> list[tuple[str, list[str], int, str]]:
    """(name, parity arguments, the exit code and verdict that mean it did what it should)."""
    run = ["run", "--tp", str(args.tp), *pair, "--backend", args.backend, "--scenario", args.scenario, "--quiet",
           "--force", "--tp-timeout", str(args.tp_timeout)]
    return [("five-modes", [*run, "--modes", args.modes, "--out", str(out / "run-five-modes")], 0, "PASS"),
            (f"inject-{args.fault}", [*run, "--modes", "full", "--inject", args.fault,
                                      "--out", str(out / f"run-inject-{args.fault}")], 1, "DRIFT"),
            ("rank-divergence", [*run, "--modes", "full", "--inject", DIVERGENCE,
                                 "--out", str(out / "run-rank-divergence")], 1, "DRIFT RANK_DIVERGENCE")]


def main(argv: list[str] | None = None, launcher=subprocess_launcher) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.scripts.tp_scale", description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--shape", default="llama3-70b")
    p.add_argument("--backend", default="cuda", choices=["cuda", "emulated"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--scenario", default="scenarios/llama3-70b-tp.yaml")
    p.add_argument("--modes", default="all", help="the PASS run's modes (default all five)")
    p.add_argument("--fault", default="tp-seq-lens-rank0-only", help="the TP fault of step 3")
    p.add_argument("--tp-timeout", type=float, default=300.0)
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "reports" / "tp-scale"))
    args = p.parse_args(argv)
    if args.backend == "cuda":
        import torch
        if torch.cuda.device_count() < args.tp:
            print(f"tp_scale: --tp {args.tp} needs {args.tp} GPUs, this machine has {torch.cuda.device_count()}; "
                  "nothing was run", file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    synth = out / "pair"
    if not (synth / "target" / "config.json").is_file():
        code = launcher(["models", "synth", "--shape", args.shape, "--head", "eagle1", "--at-load", "--dtype",
                         args.dtype, "--out", str(synth)], out / "00-synth.log")
        if code != 0:
            print(f"synth failed ({code}): see {out / '00-synth.log'}")
            return 1
    pair = ["--model", "local", "--target-path", str(synth / "target"), "--draft-path", str(synth / "eagle1"),
            "--dtype", args.dtype]
    lines, ok = [], True
    for i, (name, argv_, expect, verdict) in enumerate(steps(args, pair, out), start=1):
        began = time.monotonic()
        code = launcher(argv_, out / f"{i:02d}-{name}.log")
        seconds = time.monotonic() - began
        run_dir = Path(argv_[argv_.index("--out") + 1])
        found = verdict_of(run_dir)
        ok &= code == expect and found.startswith(verdict)
        lines.append(f"{name}: exit {code} (expected {expect}, {verdict}) in {seconds:.1f} s; {found}; "
                     f"peak GiB per rank {peak_memory(run_dir)}")
        print(lines[-1], flush=True)
    lines.append("ALL AS EXPECTED" if ok else "NOT AS EXPECTED")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print(lines[-1])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
