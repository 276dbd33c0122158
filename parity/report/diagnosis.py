"""The diagnoses of a run's summary on the console: the first drifting mode's panel, a line for the others."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from parity.diagnosis.panel import describe_where, diagnosis_panel


def diagnoses_view(summary: dict):
    """The first drifting mode's panel, then one line for every other mode bisected; None when none was."""
    first = summary.get("diagnosis")
    if not first:
        return None
    others = [(mode, d) for mode, d in (summary.get("diagnoses") or {}).items() if mode != first.get("mode")]
    if not others:
        return diagnosis_panel(first)
    lines = Text("also diagnosed (whole panels in diagnosis.json, by_mode):")
    for mode, d in others:
        named = f"{d.get('kind')}({', '.join(d['buffers'])})" if d.get("buffers") else str(d.get("kind"))
        where = f" at {describe_where(d)}" if d.get("phase") and d.get("step") is not None else \
            f", {describe_where(d)}" if d.get("phase") else ""
        lines.append(f"\n  {mode}: {named}{where}")
    return Group(diagnosis_panel(first), lines)
