"""The fault catalog for the terminal: one block per fault, names whole at any width."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text


def run_line(f) -> str:
    """The `parity run` that shows fault `f` on its home scenario (tensor parallel and extra arguments included)."""
    words = ["parity run", *(["--tp", str(f.tp)] if f.tp > 1 else []), *f.args,
             "--scenario", f"scenarios/{f.scenario}.yaml", "--inject", f.name]
    return " ".join(words)


def fault_catalog(faults) -> Group:
    """`faults`: catalog entries (name, kind, site, seed, scenario, manifests_in, description, head, tp, args)."""
    parts = [Text("fault catalog (--inject NAME, repeatable)", style="bold")]
    for f in faults:
        parts.append(Text(""))
        head = Text(no_wrap=True, overflow="ignore")
        head.append(f.name, style="bold cyan")
        head.append(f"  {f.kind}", style="bold")
        head.append(f"  seed {f.seed}", style="dim")
        parts.append(head)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column()
        grid.add_row("  strikes in", f.site)
        grid.add_row("  scenario", f.scenario)
        grid.add_row("  shows in", ", ".join(f.manifests_in))
        grid.add_row("  run it", run_line(f))
        if f.head:
            grid.add_row("  on a pair", f"parity models synth --shape tiny --head {f.head} --dtype float32 --out P, "
                                        f"then --model local --target-path P/target --draft-path "
                                        f"P/{f.head.split()[0]}")
        grid.add_row("", f.description)
        parts.append(grid)
    return Group(*parts)
