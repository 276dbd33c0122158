"""Names of run folders under reports/."""

from __future__ import annotations

import datetime as _dt


def default_run_id(model: str, scenario: str) -> str:
    """`<timestamp>-<model>-<scenario>`, the default run folder name under reports/."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{model}-{scenario}"
