"""Run artifacts under reports/<run-id>/, written atomically (temp folder, then rename)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from parity.report.atomic import write_json


def records_frame(runs, table: str) -> pd.DataFrame:
    """One table of every run (graph modes and padded references), with a `mode` column first."""
    runs = runs.all_runs() if hasattr(runs, "all_runs") else runs
    frames = []
    for mode, run in runs.items():
        frame = getattr(run.result, table).copy()
        frame.insert(0, "mode", mode)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def write_run(out_dir: Path, summary: dict, runs: dict, extra_writers=()) -> Path:
    """Write every artifact into a temp folder next to `out_dir`, then move it into place."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        write_json(staging / "summary.json", summary)
        records_frame(runs, "drafts").to_parquet(staging / "records.parquet", index=False)
        records_frame(runs, "tokens").to_parquet(staging / "tokens.parquet", index=False)
        records_frame(runs, "forwards").to_parquet(staging / "forwards.parquet", index=False)
        for writer in extra_writers:
            writer(staging, summary)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
