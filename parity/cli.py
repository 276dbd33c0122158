"""The `parity` command line. Thin: assembles one module per command and runs it inside the error boundary.

Exit codes: 0 pass, 1 drift, 2 bad input (one line), 3 internal error (one
line naming a saved traceback), 130 interrupted, 143 terminated
(commands/boundary.py).
"""

from __future__ import annotations

import sys

# Each command's arguments (commands/<command>_args.py): light, so `--help` and a bad flag answer at once. The
# command's own module (commands/<command>.py), and torch with it, is imported only when the command runs.
from parity.commands import (bench_args, bisect_args, faults_args, gate_args, imports_args, models_args, report_args,
                             run_args, scenarios_args)
from parity.commands.boundary import run_command

COMMANDS = (run_args, bisect_args, faults_args, report_args, gate_args, imports_args, models_args, scenarios_args,
            bench_args)


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse and dispatch inside the boundary, which turns every failure into one line and a code."""
    return run_command(argv, COMMANDS, __doc__)


if __name__ == "__main__":
    sys.exit(main())
