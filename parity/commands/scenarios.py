"""`parity scenarios list`: the scenario files of a folder and what they reproduce."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from parity.commands.options import EXIT_PASS
from parity.errors import ParityInputError
from parity.harness.scenario import load_scenario


def main(args) -> int:
    """List scenario files with their description."""
    folder = Path(args.dir)
    if not folder.is_dir():
        raise ParityInputError(f"{folder}: no such scenario folder")
    table = Table(title=f"scenarios in {folder}", title_justify="left")
    for col in ("file", "K", "seqs", "description"):
        table.add_column(col)
    for path in sorted(folder.glob("*.yaml")):
        s = load_scenario(path)
        table.add_row(path.name, str(s.num_speculative_tokens), str(s.max_num_seqs), s.description)
    Console().print(table)
    return EXIT_PASS
