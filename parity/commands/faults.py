"""`parity faults list|matrix`: the catalog of injectable bugs, and every fault run in every mode."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from parity.commands.options import EXIT_PASS
from parity.faults.catalog import FAULTS
from parity.commands.matrix import matrix_rows, run_matrix
from parity.graphs.modes import MODES
from parity.harness.request import resolve_backend
from parity.report.catalog import fault_catalog


def main(args) -> int:
    """Print the fault catalog, or run and tabulate the fault x mode matrix."""
    if args.faults_command == "matrix":
        return matrix(args)
    Console().print(fault_catalog(FAULTS.values()))
    return EXIT_PASS


def matrix(args) -> int:
    """Inject each fault on its home scenario, run every mode, and tabulate what was found."""
    backend, _ = resolve_backend(args.backend)
    extra = ("--dtype", args.dtype, "--simulate-padding-numerics", str(args.simulate_padding_numerics))
    rows = matrix_rows(run_matrix(args.model, backend, progress=lambda n: print(f"  {n} done", file=sys.stderr),
                                  extra=extra))
    if args.markdown:
        print("| fault | " + " | ".join(MODES) + " |")
        print("|---" * (len(MODES) + 1) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return EXIT_PASS
    table = Table(title=f"fault x mode ({args.model}, {backend}); '-' = not flagged", title_justify="left")
    for col in ("fault", *MODES):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)
    return EXIT_PASS
