"""The corpus's table and totals."""

from __future__ import annotations

from tests.bugs.catalogue import (CAUGHT, CLEAN, FATAL, LOCALISED, NAMED, SEVERITY, SHORT, SKIPPED, UNDIAGNOSED,
                                  WRONG)


def totals(results: list[dict]) -> dict:
    graph = [r for r in results if r["class"] == "graph" and r["grade"] != SKIPPED]
    counts = {g: sum(r["grade"] == g for r in results) for g in SEVERITY}
    named = sum(r["grade"] == NAMED for r in graph)
    return {"graph_bugs": len(graph), "named": named, "named_pct": round(100 * named / len(graph), 1) if graph else 0.0,
            "counts": {g: n for g, n in counts.items() if n},
            # a known gap is reported as graded, not fatal: its strict xfail in tests/test_bug_corpus.py keeps it honest
            "failures": sum(r["grade"] in FATAL and not r.get("known_gap") for r in results)}


def render(results: list[dict], summary: dict, backend: str, elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bug corpus ({backend}): {len(results)} patches", show_lines=False)
    for column in ("id", "class", "expected", "modes", "grade", "diagnosis found", "s"):
        table.add_column(column, overflow="fold")
    colours = {NAMED: "green", CLEAN: "green", CAUGHT: "green", LOCALISED: "yellow", UNDIAGNOSED: "yellow",
               WRONG: "magenta", SKIPPED: "dim"}
    for r in results:
        modes = ",".join(SHORT[m] for m in r["modes"]) or "audit"
        if r["clean_modes"]:
            modes += " | not " + ",".join(SHORT[m] for m in r["clean_modes"])
        style = colours.get(r["grade"], "bold red")
        grade = r["grade"] + (" (known gap)" if r.get("known_gap") else "")
        table.add_row(r["id"], r["class"], r["expected"], modes, f"[{style}]{grade}[/]", r["found"],
                      f"{r['seconds']:.0f}")
    console = Console(width=max(160, Console().width))
    console.print(table)
    counts = ", ".join(f"{g} {n}" for g, n in summary["counts"].items())
    console.print(f"NAMED {summary['named']}/{summary['graph_bugs']} graph bugs ({summary['named_pct']}%); "
                  f"{counts}; {elapsed:.0f} s")


