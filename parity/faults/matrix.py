"""The mutation matrix: every catalogued fault injected, every mode run, through `parity run`'s path."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from parity.faults.catalog import FAULTS
from parity.graphs.modes import MODES

SCENARIOS = Path("scenarios")


def home_scenario(fault, scenarios_dir: Path = SCENARIOS) -> Path:
    return scenarios_dir / f"{fault.scenario}.yaml"


def run_matrix(model: str = "tiny-llama3-eagle", backend: str = "emulated", names=None,
               scenarios_dir: Path = SCENARIOS, progress=None) -> dict[str, dict]:
    """Run each fault on its home scenario in every mode; returns fault name -> summary.

    Each fault runs in its own `parity run` process: a fault that drives a CUDA
    kernel out of bounds poisons its process, and must not poison the next.
    """
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(FAULTS):
            out = Path(tmp) / name
            command = [sys.executable, "-m", "parity", "run", "--model", model, "--backend", backend,
                       "--scenario", str(home_scenario(FAULTS[name], scenarios_dir)), "--modes", ",".join(MODES),
                       "--inject", name, "--out", str(out), "--quiet"]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode not in (0, 1) or not (out / "summary.json").is_file():
                raise RuntimeError(f"{name}: parity run exited {done.returncode}: {done.stderr.strip()[-400:]}")
            results[name] = json.loads((out / "summary.json").read_text())
            if progress is not None:
                progress(name)
    return results


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
