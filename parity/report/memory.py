"""Memory renderers: the memory plan as a table (`parity run --plan`) and one line per run (`--verbose`).

They read plain dicts (`MemoryPlan.as_dict()`, a run's `memory` and `timing`)
and compute nothing but units.
"""

from __future__ import annotations

from rich.table import Table

from parity.report.modes import SHORT

ROWS = (("weights", "weights"), ("kv_cache_bytes", "KV cache"), ("buffers_bytes", "buffers"),
        ("graphs_target_bytes", "pool: target"), ("graphs_drafter_bytes", "pool: drafter"),
        ("pieces_bytes", "pw pieces"), ("activations_bytes", "activations"),
        ("capture_state_bytes", "capture copy"), ("slack_bytes", "slack"), ("total_bytes", "total"))


def human(num_bytes: int | float | None) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1 (B, KiB, MiB, GiB)."""
    if num_bytes is None:
        return "-"
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def render_plan(plan: dict, console) -> None:
    """The heading (pair, dtype, device, budget), the table, and whether it fits."""
    budget = f"{human(plan['budget_bytes'])} ({plan['budget_source']})" if plan["budget_bytes"] else "unknown"
    console.print(f"memory plan · {plan['model']} · {plan['dtype']} · {plan['device']} · budget {budget}",
                  highlight=False, soft_wrap=True)
    console.print(plan_table(plan))
    console.print(("fits" if plan["fits"] else "DOES NOT FIT") + "; " + "; ".join(plan["notes"]), highlight=False,
                  soft_wrap=True)


def plan_table(plan: dict) -> Table:
    """Component x mode in one unit (GiB, or MiB for small pairs)."""
    modes = plan["modes"]
    gib = max(f["total_bytes"] for f in modes.values()) >= 1 << 30
    unit, scale = ("GiB", 1 << 30) if gib else ("MiB", 1 << 20)
    table = Table()
    table.add_column(unit, no_wrap=True)
    for mode in modes:
        table.add_column(SHORT.get(mode, mode), justify="right", no_wrap=True)
    for key, label in ROWS:
        values = [plan["weights_bytes"] if key == "weights" else figures[key] for figures in modes.values()]
        table.add_row(label, *[f"{v / scale:.2f}" for v in values], style="bold" if key == "total_bytes" else None)
    table.add_row("padded ref", *["-" if f.get("reference_total_bytes") is None
                                  else f"{f['reference_total_bytes'] / scale:.2f}" for f in modes.values()])
    table.add_row("graphs captured", *[str(figures["graphs"]) for figures in modes.values()])
    if plan["budget_bytes"]:
        table.add_row("fits", *["yes" if max(f["total_bytes"], f.get("reference_total_bytes") or 0)
                                <= plan["budget_bytes"] else "NO" for f in modes.values()])
    return table


def run_line(name: str, memory: dict | None, timing: dict | None) -> str:
    """One run: capture and run seconds, peak and leftover device memory over its baseline."""
    timing = timing or {}
    text = (f"{name:<22} capture {timing.get('capture_seconds', 0.0):7.2f} s   run "
            f"{timing.get('run_seconds', 0.0):7.2f} s")
    if memory is None:
        return text + "   memory: not measured on the CPU"
    return (text + f"   peak {human(memory['peak_bytes'])} (reserved {human(memory.get('peak_reserved_bytes'))})"
            f"   leftover {human(memory['leftover_bytes'])}   baseline {human(memory['baseline_bytes'])}")
