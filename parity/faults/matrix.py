"""The mutation matrix: every catalogued fault injected, every mode run, through `parity run`'s path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from parity.faults.catalog import FAULTS
from parity.graphs.modes import MODES

SCENARIOS = Path("scenarios")


def home_scenario(fault, scenarios_dir: Path = SCENARIOS) -> Path:
    return scenarios_dir / f"{fault.scenario}.yaml"


def run_matrix(model: str = "tiny-llama3-eagle", backend: str = "emulated", names=None,
               scenarios_dir: Path = SCENARIOS, progress=None, extra: tuple[str, ...] = (),
               jobs: int | None = None) -> dict[str, dict]:
    """Run each fault on its home scenario in every mode; returns fault name -> summary, in catalog order.

    Each fault runs in its own `parity run` process: a fault that drives a CUDA
    kernel out of bounds poisons its process, and must not poison the next.
    `extra`: more `parity run` arguments (`--dtype bfloat16 --simulate-padding-numerics 0.1`).
    `jobs` processes run at once (default: one per CPU core), each on one CPU thread unless
    OMP_NUM_THREADS says otherwise: oversubscribed OpenMP threads spin for minutes.
    """
    names = list(names or FAULTS)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        def one(name: str) -> dict:
            out = Path(tmp) / name
            command = [sys.executable, "-m", "parity", "run", "--model", model, "--backend", backend,
                       "--scenario", str(home_scenario(FAULTS[name], scenarios_dir)), "--modes", ",".join(MODES),
                       "--inject", name, "--out", str(out), "--quiet", *extra]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode not in (0, 1) or not (out / "summary.json").is_file():
                raise RuntimeError(f"{name}: parity run exited {done.returncode}: {done.stderr.strip()[-400:]}")
            if progress is not None:
                progress(name)
            return json.loads((out / "summary.json").read_text())

        return dict(zip(names, pool.map(one, names)))


def matrix_rows(results: dict[str, dict]) -> list[list[str]]:
    """One row per fault: the name, then per mode '-' (pass) or the diagnosed kind and buffers."""
    rows = []
    for name, summary in results.items():
        row = [name]
        for mode in MODES:
            verdict = summary["modes"][mode]["verdict"]
            if verdict in ("pass", "not_exercised"):
                row.append("-" if verdict == "pass" else "NOT_EXERCISED")
                continue
            d = summary.get("diagnoses", {}).get(mode)
            row.append(f"{d['kind']}({','.join(d['buffers'])})" if d else "drift")
        rows.append(row)
    return rows
