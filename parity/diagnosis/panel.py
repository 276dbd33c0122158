"""The diagnosis panel (rich), for the harness's report, `parity bisect` and `parity.audit` alike.

A diagnosis dict in (the keys of `Diagnosis.as_dict()`), a panel or plain text
out. Renders, never computes.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from parity.diagnosis.kinds import CAPTURE_ERROR, MEANING, NAMED, NONE, UNEXPLAINED, WARNING_KINDS

MAX_RULED_OUT = 6


def describe_where(d: dict) -> str:
    """'step S, phase (draft step J), owner' of a diagnosis ('replay N, owner' for an audited graph's, 'at
    capture' for a capture error's, 'before capture' for the capacity audit's)."""
    if d.get("step") is not None:
        where = f"replay {d['step']}" if d["phase"] == "replay" else f"step {d['step']}, {d['phase']}"
    else:
        where = f"{'at' if d.get('kind') == CAPTURE_ERROR else 'before'} capture, {d['phase']}"
    if d.get("draft_step") is not None and d["phase"] != "verify":
        where += f" (draft step {d['draft_step']})"
    if d.get("owner"):
        where += f", {d['owner']}"
    return where


def describe_graph(graph: dict) -> str:
    """'runtime mode · backend · T tokens · R rows' of the graph a diagnosis names (what of it is known)."""
    parts = [str(graph[key]) for key in ("runtime_mode", "backend") if graph.get(key)]
    parts += [f"{graph[key]} {unit}" for key, unit in (("num_tokens", "tokens"), ("num_reqs", "rows"))
              if graph.get(key) is not None]
    return " · ".join(parts)


def _address(d: dict) -> str | None:
    captured, live = d.get("captured_address"), d.get("live_address")
    if captured is None:
        return None
    return f"captured 0x{captured:x}" + (f", live 0x{live:x}" if live not in (None, captured) else "")


def _lines(grid: Table, label: str, lines: list, limit: int | None = None) -> None:
    for i, line in enumerate(lines[:limit]):
        if not isinstance(line, str):      # a diagnosis' lines are text; anything else is a malformed record
            raise TypeError(f"{label} entry {i} is {type(line).__name__}, not text")
        grid.add_row(label if i == 0 else "", line)
    if limit is not None and len(lines) > limit:
        grid.add_row("", f"... and {len(lines) - limit} more")


def diagnosis_panel(d: dict) -> Panel:
    """The rich panel of one diagnosis dict."""
    kind = d.get("kind", UNEXPLAINED)
    style = "green" if kind == NONE else ("yellow" if kind == UNEXPLAINED or kind in WARNING_KINDS else "red")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("kind", Text(kind, style=f"bold {style}"))
    grid.add_row("meaning", MEANING.get(kind, ""))
    if d.get("buffers"):
        grid.add_row(NAMED.get(kind, "buffers"), ", ".join(d["buffers"]))
    if d.get("mode"):
        grid.add_row("mode", str(d["mode"]))
    if d.get("phase"):
        grid.add_row("where", describe_where(d))
    if d.get("rows"):
        grid.add_row("rows", ", ".join(map(str, d["rows"][:12])))
    if _address(d):
        grid.add_row("address", _address(d))
    if describe_graph(d.get("graph") or {}):
        grid.add_row("graph", describe_graph(d["graph"]))
    if d.get("max_abs_diff") is not None:
        grid.add_row("max |diff|", f"{d['max_abs_diff']:.4g}")
    if d.get("experiment"):
        grid.add_row("isolated by", d["experiment"])
    _lines(grid, "also", d.get("also") or [])
    _lines(grid, "evidence", d.get("evidence") or [])
    _lines(grid, "ruled out", d.get("ruled_out") or [], MAX_RULED_OUT)
    grid.add_row("replays", str(d.get("replays", 0)))
    return Panel(grid, title="diagnosis", title_align="left", border_style=style)


def render_diagnosis(d: dict, width: int = 100, color: bool = False) -> str:
    """The panel as text (ANSI colours only with `color`)."""
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=color, color_system="standard" if color else None,
                      legacy_windows=False)
    console.print(diagnosis_panel(d))
    return out.getvalue()
