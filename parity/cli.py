"""The `parity` command line. Thin: assembles one module per command and runs it inside the error boundary.

Exit codes: 0 pass, 1 drift, 2 bad input (one line), 3 internal error (one
line naming a saved traceback), 130 interrupted, 143 terminated
(commands/boundary.py).
"""

from __future__ import annotations

import sys

from parity.commands import bench, bisect, faults, gate, imports, models, report, run, scenarios
from parity.commands.boundary import run_command

COMMANDS = (run, bisect, faults, report, gate, imports, models, scenarios, bench)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse and dispatch inside the boundary, which turns every failure into one line and a code."""
    return run_command(argv, COMMANDS, __doc__)


if __name__ == "__main__":
    sys.exit(main())
