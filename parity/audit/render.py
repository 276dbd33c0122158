"""The diagnosis panel (rich): a diagnosis dict in, a panel or plain text out. Renders, never computes."""

from __future__ import annotations

import io

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

MEANING = {
    "STALE_BUFFER": "the graph reads a persistent buffer at the right address that was not refreshed before replay",
    "BUFFER_REASSIGNED": "a buffer was rebound to a new tensor; the graph keeps reading the captured address",
    "FROZEN_AT_CAPTURE": "a Python value was baked into the graph at capture",
    "PADDING_LEAK": "padded rows leak into the real rows' results",
    "POOL_ALIAS": "another graph's replay overwrote this graph's output while it was still live (shared pool)",
    "OUTPUT_ALIASED": "the program read a graph's output after another replay of its forward overwrote it "
                      "(kept by reference, not copied)",
    "CAPTURE_CONTEXT": "the graph baked capture-time state that a fresh capture would not",
    "NOT_REFRESHED": "a static input was never written since capture (a warning: it may be constant)",
    "UNEXPLAINED": "the replay differs from eager and no one-variable experiment restores parity",
}
MAX_RULED_OUT = 6


def _address(d: dict) -> str | None:
    captured, live = d.get("captured_address"), d.get("live_address")
    if captured is None:
        return None
    return f"captured 0x{captured:x}" + (f", live 0x{live:x}" if live is not None else "")


def diagnosis_panel(d: dict) -> Panel:
    """The rich panel of one diagnosis dict."""
    kind = d.get("kind", "UNEXPLAINED")
    style = "yellow" if kind in ("NOT_REFRESHED", "UNEXPLAINED") else "red"
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("kind", Text(kind, style=f"bold {style}"))
    grid.add_row("meaning", MEANING.get(kind, ""))
    graph = d.get("graph") or {}
    where = f"{d.get('owner')} · replay {d.get('step')}"
    if graph.get("backend"):
        where += f" · {graph['backend']}"
    if graph.get("num_tokens") is not None:
        real = f" ({graph['num_reqs']} real)" if graph.get("num_reqs") is not None else ""
        where += f" · batch {graph['num_tokens']}{real}"
    grid.add_row("graph", where)
    if d.get("buffers"):
        grid.add_row("buffers", ", ".join(d["buffers"]))
    if d.get("rows"):
        grid.add_row("rows", ", ".join(map(str, d["rows"][:12])))
    if _address(d):
        grid.add_row("address", _address(d))
    if d.get("max_abs_diff") is not None:
        grid.add_row("max |diff|", f"{d['max_abs_diff']:.4g}")
    if d.get("experiment"):
        grid.add_row("isolated by", d["experiment"])
    for i, line in enumerate(d.get("also") or []):
        grid.add_row("also" if i == 0 else "", line)
    for i, line in enumerate(d.get("evidence") or []):
        grid.add_row("evidence" if i == 0 else "", line)
    ruled_out = d.get("ruled_out") or []
    for i, line in enumerate(ruled_out[:MAX_RULED_OUT]):
        grid.add_row("ruled out" if i == 0 else "", line)
    if len(ruled_out) > MAX_RULED_OUT:
        grid.add_row("", f"... and {len(ruled_out) - MAX_RULED_OUT} more")
    grid.add_row("replays", str(d.get("replays", 0)))
    return Panel(grid, title="parity.audit", title_align="left", border_style=style)


def render_diagnosis(d: dict, width: int = 100, color: bool = False) -> str:
    """The panel as text (ANSI colours only with `color`)."""
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=color, color_system="standard" if color else None,
                      legacy_windows=False)
    console.print(diagnosis_panel(d))
    return out.getvalue()
