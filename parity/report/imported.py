"""Console rendering of one imported acceptance record (`parity import FILE`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text


def render_record(record: dict, console: Console | None = None) -> None:
    """Per-position rates (counts and Wilson 95% intervals when known), mean length, provenance."""
    console = console or Console()
    drafts = record["num_drafts"]
    how = f"{drafts} drafts" if drafts is not None else "rates only (give --num-drafts for counts)"
    if record.get("approximate"):
        how += ", counts derived from rounded rates"
    table = Table(title=f"{record['label']} ({record['origin']}, {how})", title_justify="left",
                  header_style="bold", pad_edge=False)
    for col in ("pos", "acceptance", "accepted", "95% CI"):
        table.add_column(col, justify="right")
    counts = record.get("accepted_per_position") or [None] * len(record["acceptance_per_position"])
    cis = record.get("acceptance_ci95") or [None] * len(counts)
    for i, (rate, count, ci) in enumerate(zip(record["acceptance_per_position"], counts, cis)):
        table.add_row(str(i), f"{rate:.3f}", "-" if count is None else str(count),
                      "-" if ci is None else f"{ci[0]:.2f}-{ci[1]:.2f}")
    console.print(table)
    console.print(Text(f"mean acceptance length {record['mean_acceptance_length']:.3f}  ·  source "
                       f"{record.get('source') or '-'}"))
