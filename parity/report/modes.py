"""How the renderers show each graph mode: its short column name and its plot colour, one row per mode.

The modes themselves are `parity.graphs.modes.MODES`; a renderer reads
summaries, not graphs, so the table names them again, and
tests/test_architecture.py checks that it names exactly those modes.
"""

from __future__ import annotations

# mode -> (short name in tables, colour in plots)
LOOK = {
    "eager": ("eager", "#333333"),
    "piecewise": ("piecewise", "#1f77b4"),
    "full": ("full", "#d62728"),
    "full_decode_only": ("full_dec", "#ff7f0e"),
    "full_and_piecewise": ("full+pw", "#2ca02c"),
}
SHORT = {mode: short for mode, (short, _) in LOOK.items()}
COLORS = {mode: color for mode, (_, color) in LOOK.items()}


def refused(m: dict) -> str:
    """'not run' for a mode refused before it ran (the capacity audit's short buffers, a capture that stopped at
    an op no graph can capture), 'stopped' for one stopped before a batch replayed a graph captured for another
    key or where its engine raised, else '': either has no acceptance to show."""
    if m.get("short_buffers") or m.get("capture_error"):
        return "not run"
    return "stopped" if m.get("wrong_graph") or m.get("crashed") else ""


NO_NODE = "—, no node"


def no_node(m: dict, position: int) -> bool:
    """True where no draft of the mode had a node at `position` (a tree's depth it never reached): the
    summary gives no rate there (null), and a renderer says so instead of showing a rate of 0."""
    return m["acceptance_per_position"][position] is None
