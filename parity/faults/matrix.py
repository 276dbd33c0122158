"""The mutation matrix: every catalogued fault injected, every mode run, through `parity run`'s path."""

from __future__ import annotations

import tempfile
from pathlib import Path

from parity.faults.catalog import FAULTS
from parity.graphs.modes import MODES

SCENARIOS = Path("scenarios")


def home_scenario(fault, scenarios_dir: Path = SCENARIOS) -> Path:
    return scenarios_dir / f"{fault.scenario}.yaml"


def run_matrix(model: str = "tiny-llama3-eagle", backend: str = "emulated", names=None,
               scenarios_dir: Path = SCENARIOS, progress=None) -> dict[str, dict]:
    """Run each fault on its home scenario in every mode; returns fault name -> summary."""
    from parity.session import RunRequest, run_session

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(FAULTS):
            request = RunRequest(model=model, scenario_path=str(home_scenario(FAULTS[name], scenarios_dir)),
                                 modes=tuple(MODES), backend=backend, faults=(name,),
                                 out=str(Path(tmp) / name))
            results[name] = run_session(request, show_progress=False).summary
            if progress is not None:
                progress(name)
    return results


def matrix_rows(results: dict[str, dict]) -> list[list[str]]:
    """One row per fault: the name, then per mode '-' (pass) or the diagnosed kind and buffers."""
    rows = []
    for name, summary in results.items():
        row = [name]
        for mode in MODES:
            if summary["modes"][mode]["verdict"] == "pass":
                row.append("-")
                continue
            d = summary.get("diagnoses", {}).get(mode)
            row.append(f"{d['kind']}({','.join(d['buffers'])})" if d else "drift")
        rows.append(row)
    return rows
