"""The real-scale check on one GPU, end to end, in under 9 minutes: `python -m parity.scripts.gpu_scale`.

On an H100 (80 GB), given nothing:
 1. the CUDA memory test (tests/test_gpu_memory.py: every run returns to the post-load baseline);
 2. the synthetic 8B pair, `parity models synth --shape llama3-8b --head eagle1 --dtype bfloat16`
    (reused when SYNTH_DIR already holds one);
 3. `parity run --plan` for llama3-eagle, llama3-eagle-short and long-context-8k;
 4. `time parity run --model local ... --dtype bfloat16 --scenario S --modes all --verbose`
    (S = scenarios/llama3-eagle-short.yaml: llama3-eagle.yaml's own streams, 8 requests x 128 tokens,
    so the whole check fits 9 minutes; `--scenario scenarios/llama3-eagle.yaml` for the full one);
 5. the same pair and scenario with `--modes eager,full --inject F` for each --inject fault (default
    reassign-seq-lens and stale-slot-mapping): each must be DRIFT (exit 1) with the fault's diagnosis;
 6. `parity bench scale` at 8B, the run's breakdown read from step 4's summary.json;
 7. with --long, long-context-8k in every mode with whatever time is left;
 then a compact summary on stdout: steps, the run per mode, each injected run's verdicts and diagnosis.
Every output goes to $OUT (default reports/gpu-scale) in small files: NN-step.log per step,
run-<scenario>/ (the run folder), bench-scale.json, summary.txt.
With `--inject none` the five-mode run may take the whole budget: `--scenario scenarios/llama3-eagle.yaml
--inject none` and `--scenario scenarios/long-context-8k.yaml --inject none` are the two long runs, one
device call each.
Without CUDA it prints one line on stderr, runs nothing, writes nothing and exits 2.

Steps run as `python -m parity ...` subprocesses (each frees its GPU memory on exit), each under a
timeout cut from what is left of the budget, so a slow step cannot take the ones after it down.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BUDGET_SECONDS = 530
ROOT = Path(__file__).resolve().parent.parent.parent
INJECTED = ("reassign-seq-lens", "stale-slot-mapping")
PLANNED = ("scenarios/llama3-eagle.yaml", "scenarios/llama3-eagle-short.yaml", "scenarios/long-context-8k.yaml")


class Steps:
    """Runs and logs each step under what is left of the budget; remembers seconds and exit codes."""

    def __init__(self, out: Path, budget: float):
        self.out, self.budget, self.start = out, budget, time.monotonic()
        self.done: list[tuple[str, float, int | str]] = []
        self.expected: dict[str, int] = {}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def run(self, name: str, command: list[str], cap: float, reserve: float = 0.0, expect: int = 0) -> int | str:
        """Run one step; its result is the exit code, or why it did not finish. `expect`: the exit code
        that means the step did what it should (1 for a run that must report DRIFT)."""
        limit = min(cap, self.left() - reserve)
        log = self.out / f"{len(self.done):02d}-{name}.log"
        if limit < 5:
            self.done.append((name, 0.0, "skipped (no time left)"))
            return "skipped"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "NO_COLOR": "1"}
        began = time.monotonic()
        with log.open("w") as sink:
            sink.write("$ " + " ".join(command) + "\n")
            sink.flush()
            try:
                code: int | str = subprocess.run(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                                 timeout=limit).returncode
            except subprocess.TimeoutExpired:
                code = f"timeout after {limit:.0f} s"
        seconds = time.monotonic() - began
        self.done.append((name, seconds, code))
        self.expected[name] = expect
        print(f"[{time.monotonic() - self.start:6.1f} s] {name}: {code} in {seconds:.1f} s  ({log.name})", flush=True)
        return code

    def all_as_expected(self) -> bool:
        return all(code == self.expected.get(name, 0) for name, _, code in self.done)


def parity(*args: str) -> list[str]:
    return [sys.executable, "-m", "parity", *args]


def cuda_problem() -> str | None:
    """Why this machine cannot run the check (None: it can). Creates no CUDA context."""
    import torch

    if torch.cuda.is_available():
        return None
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"torch {torch.__version__} ({built}) sees no CUDA device"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.scripts.gpu_scale", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="scenarios/llama3-eagle-short.yaml", help="the 5-mode run's scenario")
    p.add_argument("--synth-dir", default=os.environ.get("SYNTH_DIR", "/tmp/synth8b"))
    p.add_argument("--budget", type=float, default=BUDGET_SECONDS, help="seconds for everything")
    p.add_argument("--inject", action="append", metavar="FAULT",
                   help="a fault to inject into an eager,full run of the same scenario (repeatable; default "
                        f"{' and '.join(INJECTED)}; 'none' for no injected run)")
    p.add_argument("--no-memory-test", action="store_true", help="skip tests/test_gpu_memory.py (make test-gpu runs it)")
    p.add_argument("--long", action="store_true",
                   help="then run scenarios/long-context-8k.yaml in every mode with what is left of the budget")
    args = p.parse_args(argv)
    problem = cuda_problem()
    if problem is not None:
        print(f"gpu_scale: needs one CUDA GPU: {problem}; nothing was run", file=sys.stderr)
        return 2
    out = Path(os.environ.get("OUT") or ROOT / "reports" / "gpu-scale")
    out.mkdir(parents=True, exist_ok=True)
    steps = Steps(out, args.budget)
    target, draft = Path(args.synth_dir) / "target", Path(args.synth_dir) / "eagle1"
    pair = ["--model", "local", "--target-path", str(target), "--draft-path", str(draft), "--dtype", "bfloat16"]
    steps.run("env", [sys.executable, "-c", ENV_REPORT], cap=60)
    if not args.no_memory_test:
        steps.run("gpu-memory-test", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                      "tests/test_gpu_memory.py"], cap=150, reserve=420)
    if not (target / "config.json").is_file():
        steps.run("synth-8b", parity("models", "synth", "--shape", "llama3-8b", "--head", "eagle1", "--dtype",
                                     "bfloat16", "--out", args.synth_dir), cap=300, reserve=240)
    for scenario in PLANNED:
        steps.run(f"plan-{Path(scenario).stem}", parity("run", "--plan", *pair, "--scenario", scenario), cap=60)
    name = Path(args.scenario).stem
    run_dir = out / f"run-{name}"
    injected = [f for f in (args.inject or INJECTED) if f != "none"]
    # The five-mode run may take what the injected runs (about 60 s each at 8B) and the bench (40 s) leave.
    steps.run(f"run-{name}", ["bash", "-c", " ".join(["time", *parity("run", *pair, "--scenario", args.scenario,
                                                                          "--modes", "all", "--verbose", "--quiet",
                                                                          "--force", "--out", str(run_dir))])],
              cap=args.budget, reserve=40 + 60 * len(injected))
    for fault in injected:
        steps.run(f"inject-{fault}", parity("run", *pair, "--scenario", args.scenario, "--modes", "eager,full",
                                            "--inject", fault, "--quiet", "--force", "--out",
                                            str(out / f"run-inject-{fault}")), cap=150, reserve=40, expect=1)
    summary = run_dir / "summary.json"
    source = ["--run-summary", str(summary)] if summary.is_file() else ["--skip-run"]
    steps.run("bench-scale", parity("bench", "scale", *pair, *source, "--json", str(out / "bench-scale.json")),
              cap=240)
    if args.long:
        steps.run("run-long-context-8k", parity("run", *pair, "--scenario", "scenarios/long-context-8k.yaml",
                                                "--modes", "all", "--verbose", "--quiet", "--force", "--out",
                                                str(out / "run-long-context-8k")), cap=600)
    text = report(steps, summary, out / "bench-scale.json",
                  {fault: out / f"run-inject-{fault}" / "summary.json" for fault in injected})
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 0 if steps.all_as_expected() else 1


ENV_REPORT = ("import shutil, subprocess, torch, transformers; print('torch', torch.__version__, 'transformers', "
              "transformers.__version__); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "
              "'no CUDA'); smi = shutil.which('nvidia-smi'); "
              "print(subprocess.run([smi], capture_output=True, text=True).stdout if smi else 'no nvidia-smi')")


def report(steps: Steps, summary: Path, bench: Path, injected: dict[str, Path] | None = None) -> str:
    """The compact summary: steps, the run per mode (verdict, acceptance, memory), each injected run's
    verdicts and diagnosis, the per-forward figures."""
    lines = [f"{'step':<32} {'seconds':>8}  result"]
    lines += [f"{name:<32} {seconds:8.1f}  {code}" + ("" if code == steps.expected.get(name, 0) else "  (unexpected)")
              for name, seconds, code in steps.done]
    if summary.is_file():
        s = json.loads(summary.read_text())
        measured = s.get("measured") or {}
        timing, plan = measured.get("timing") or {}, (measured.get("memory_plan") or {}).get("modes", {})
        lines += ["", f"run {s['scenario']} ({s['model']}, {s['device']}): {s['verdict'].upper()}; load "
                  f"{timing.get('load_seconds')} s, analysis {timing.get('analysis_seconds')} s",
                  f"{'run':<20} {'verdict':>7} {'len':>6} {'capture s':>9} {'run s':>7} {'peak GiB':>8} "
                  f"{'rsv GiB':>8} {'plan GiB':>8} {'leftover':>9}"]
        for name, t in (timing.get("runs") or {}).items():
            m, entry = (measured.get("memory") or {}).get(name) or {}, s["modes"].get(name, {})
            gib = lambda b: f"{b / 2**30:8.2f}" if b is not None else f"{'-':>8}"  # noqa: E731
            length = entry.get("mean_acceptance_length")
            lines.append(f"{name:<20} {entry.get('verdict', '-'):>7} {f'{length:.3f}' if length else '-':>6} "
                         f"{t.get('capture_seconds', 0):9.2f} {t.get('run_seconds', 0):7.2f} "
                         f"{gib(m.get('peak_bytes'))} {gib(m.get('peak_reserved_bytes'))} "
                         f"{gib(plan.get(name, {}).get('total_bytes'))} {m.get('leftover_bytes', '-'):>9}")
    for fault, path in (injected or {}).items():
        lines.append("")
        lines.append(f"--inject {fault}: " + (injected_line(json.loads(path.read_text())) if path.is_file()
                                             else "no summary.json"))
    if bench.is_file():
        forwards = json.loads(bench.read_text()).get("forwards") or {}
        lines += ["", f"forwards (HBM copy {forwards.get('bandwidth_gb_s')} GB/s): phase batch eager_ms full_ms x "
                      "kernels gpu_ms replay/gpu floor_ms full/floor queued_ms queued/floor"]
        lines += [f"  {r['phase']:<13} {r['batch']:>3} {r['eager_ms']:8.2f} {r['full_ms']:7.2f} {r['speedup']:5.1f} "
                  f"{r['kernels']:>6} {r['gpu_ms']:7.2f} {r['replay_over_gpu']:5.2f} {r['floor_ms']:7.2f} "
                  f"{r['full_over_floor']:5.2f} {r.get('queued_ms', float('nan')):8.2f} "
                  f"{r.get('queued_over_floor', float('nan')):5.2f}" for r in forwards.get("forwards", [])]
    return "\n".join(lines)


def injected_line(s: dict) -> str:
    """An injected run in one line: the verdict, each mode's, and the diagnosis that was made."""
    modes = ", ".join(f"{name} {entry.get('verdict', '-').upper()}" for name, entry in s["modes"].items())
    d = s.get("diagnosis") or {}
    found = (f"{d.get('kind')}({', '.join(d.get('buffers') or [])}) in {d.get('mode')}, "
             f"{d.get('replays')} replays" if d else "no diagnosis")
    return f"{s['verdict'].upper()} ({modes}); {found}"


if __name__ == "__main__":
    sys.exit(main())
