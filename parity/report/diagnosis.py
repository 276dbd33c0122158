"""The diagnosis panel: a rich rendering of a bisection's result (data in, text out)."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from parity.analysis.kinds import CAPTURE_ERROR, DESCRIPTOR_MISMATCH, EXPLAIN, NONE, UNEXPLAINED, WRONG_GRAPH

# What a diagnosis' `buffers` name, for the kinds whose names are not buffers.
NAMED = {CAPTURE_ERROR: "source", WRONG_GRAPH: "differs in", DESCRIPTOR_MISMATCH: "differs in"}


def describe_where(d: dict) -> str:
    """'step S, phase (draft step J), owner' of a diagnosis ('at capture' for a capture error's, 'before
    capture' for the capacity audit's)."""
    if d.get("step") is not None:
        where = f"step {d['step']}, {d['phase']}"
    else:
        where = f"{'at' if d.get('kind') == CAPTURE_ERROR else 'before'} capture, {d['phase']}"
    if d.get("draft_step") is not None and d["phase"] != "verify":
        where += f" (draft step {d['draft_step']})"
    if d.get("owner"):
        where += f", {d['owner']}"
    return where


def diagnosis_panel(d: dict) -> Panel:
    kind = d.get("kind", UNEXPLAINED)
    style = "green" if kind == NONE else ("yellow" if kind == UNEXPLAINED else "red")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("kind", Text(kind, style=f"bold {style}"))
    grid.add_row("meaning", EXPLAIN.get(kind, ""))
    if d.get("buffers"):
        grid.add_row(NAMED.get(kind, "buffers"), ", ".join(d["buffers"]))
    if d.get("mode"):
        grid.add_row("mode", str(d["mode"]))
    if d.get("phase"):
        grid.add_row("where", describe_where(d))
    if d.get("rows"):
        grid.add_row("rows", ", ".join(map(str, d["rows"][:12])))
    if d.get("captured_address") is not None and d.get("live_address") not in (None, d["captured_address"]):
        grid.add_row("address", f"captured 0x{d['captured_address']:x}, live 0x{d['live_address']:x}")
    graph = d.get("graph") or {}
    if graph:
        grid.add_row("graph", f"{graph.get('runtime_mode')} · {graph.get('num_tokens')} tokens · "
                              f"{graph.get('num_reqs')} rows")
    if d.get("experiment"):
        grid.add_row("isolated", d["experiment"])
    for i, line in enumerate(d.get("also") or []):
        grid.add_row("also" if i == 0 else "", line)
    for i, line in enumerate(d.get("evidence") or []):
        grid.add_row("evidence" if i == 0 else "", line)
    for i, line in enumerate(d.get("ruled_out") or []):
        grid.add_row("ruled out" if i == 0 else "", line)
    grid.add_row("replays", str(d.get("replays", 0)))
    return Panel(grid, title="diagnosis", title_align="left", border_style=style)


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
