"""A draft position no draft had a node at (a tree's depth it never kept) has no rate: every renderer says so.

A rate of 0 there would read as "every node there was rejected"; the summary
gives null, and the terminal and markdown tables write "—, no node".
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
from rich.console import Console

from parity.analysis.metrics import acceptance
from parity.commands.report import check_summary
from parity.report.console import render
from parity.report.markdown import render_markdown

GOLDEN = Path(__file__).resolve().parent / "golden" / "pass-default" / "summary.json"


def drafts(rows: list[tuple[int, int, int, int]]) -> pd.DataFrame:
    """(step, req_id, draft_index, num_accepted) per draft record."""
    return pd.DataFrame(rows, columns=["step", "req_id", "draft_index", "num_accepted"])


def test_a_depth_without_a_node_has_no_rate():
    # two drafts; the first kept nodes at depths 0 and 1, the second only at depth 0; none at depth 2
    acc = acceptance(drafts([(1, 0, 0, 1), (1, 0, 1, 1), (1, 1, 0, 0)]), 3)
    assert acc.accepted_per_position == (1, 0, 0)
    assert acc.nodes_per_position == (2, 1, 0)
    assert acc.shown_rates == [0.5, 0.0, None]      # depth 1 had a node, rejected: 0; depth 2 none: no rate


def test_a_chain_has_a_node_at_every_position():
    acc = acceptance(drafts([(s, 0, d, 1) for s in (1, 2) for d in range(3)]), 3)
    assert acc.nodes_per_position == (2, 2, 2) and None not in acc.shown_rates


def no_node_summary() -> dict:
    summary = json.loads(GOLDEN.read_text())
    for m in summary["modes"].values():
        m["acceptance_per_position"][2] = None
        m["acceptance_ci95"][2] = None
        m["nodes_per_position"] = [m["num_drafts"], m["num_drafts"], 0]
    return summary


def test_every_renderer_says_no_node():
    summary = no_node_summary()
    check_summary(summary, GOLDEN)          # the report command reads it
    console = Console(width=120, no_color=True, record=True, file=io.StringIO())
    render(summary, console=console)
    row = next(line for line in console.export_text().splitlines() if line.startswith("│    2 "))
    assert row.count("—, no node") == 2 and "0.000" not in row
    md = next(line for line in render_markdown(summary).splitlines() if line.startswith("| 2 |"))
    assert md.count("—, no node") == 2 and "0.000" not in md
    assert json.loads(json.dumps(summary))["modes"]["eager"]["acceptance_per_position"][2] is None
