"""The report files every run folder gets beside summary.json: report.md, acceptance.png and,
when a mode drifted and was bisected, diagnosis.json.

Each writer takes (folder, summary) as artifacts.write_run's `extra_writers` expects.
"""

from __future__ import annotations

from pathlib import Path

from parity.report.atomic import write_json
from parity.report.markdown import write_markdown
from parity.report.plot import write_plot


def write_diagnosis(folder: Path, summary: dict) -> None:
    """diagnosis.json: the first drifting mode's diagnosis (and every other one under 'by_mode')."""
    if summary.get("diagnosis") is not None:
        write_json(Path(folder) / "diagnosis.json",
                   {**summary["diagnosis"], "by_mode": summary.get("diagnoses", {})})


RUN_REPORT_WRITERS = (write_markdown, write_plot, write_diagnosis)
