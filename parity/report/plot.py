"""acceptance.png: per-position acceptance of every mode with its Wilson 95% interval.

Reads `acceptance_per_position` and `acceptance_ci95` from the summary (the
intervals are computed by the analysis, not here). Uses matplotlib's Agg
canvas directly (no pyplot, no global backend switch), and writes to a temp
file beside the target, then renames it into place.
"""

from __future__ import annotations

from pathlib import Path

from parity.report.atomic import atomic_file
from parity.report.modes import COLORS, refused


def _figure(summary: dict):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    modes = summary["modes"]
    k = summary["k"]
    fig = Figure(figsize=(max(5.0, 1.1 * k + 3), 3.6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(modes))
    for j, (name, m) in enumerate(modes.items()):
        if refused(m):      # refused before it ran: nothing to plot
            continue
        shown = [i for i in range(k) if m["acceptance_per_position"][i] is not None]   # no node there: no dot
        xs = [i - 0.4 + width * (j + 0.5) for i in shown]
        rates = [m["acceptance_per_position"][i] for i in shown]
        ci = [m["acceptance_ci95"][i] for i in shown] if m.get("acceptance_ci95") else [[r, r] for r in rates]
        yerr = [[max(0.0, r - lo) for r, (lo, _) in zip(rates, ci)],
                [max(0.0, hi - r) for r, (_, hi) in zip(rates, ci)]]
        label = f"{name} ({m['num_drafts']} drafts, len {m['mean_acceptance_length']:.2f})"
        if m.get("verdict") == "drift":
            label += " DRIFT"
        ax.errorbar(xs, rates, yerr=yerr, fmt="o", capsize=3, markersize=4, label=label,
                    color=COLORS.get(name))
    ax.set_xticks(range(k))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"{summary['model']} · {summary['scenario']} · {summary['backend']} · "
                 f"{str(summary.get('verdict', '')).upper()}", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def write_acceptance_png(path: str | Path, summary: dict) -> Path:
    """Draw the acceptance plot of `summary` into `path` (temp file, then rename)."""
    fig = _figure(summary)
    with atomic_file(path, binary=True) as handle:
        fig.savefig(handle, format="png")
    return Path(path)


def write_plot(folder: Path, summary: dict) -> None:
    """Extra writer for artifacts.write_run: acceptance.png in the run folder."""
    write_acceptance_png(Path(folder) / "acceptance.png", summary)
