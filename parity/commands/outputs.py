"""Where `parity run` and `parity gate --out` put a run folder, checked before the run and placed after it.

The checks come first so that an --out the run could never be written to
(an existing file, a run already there without --force, a folder we may not
write in) costs one line and exit 2, not a finished run thrown away. The
default folder is reports/<run-id>, where the run id carries a random suffix
and a taken name is answered with a fresh id: concurrent runs never share or
overwrite a folder. An explicit --out that another run took while this one
ran is never overwritten either: this run lands beside it and the command
says where, exit 2.
"""

from __future__ import annotations

import os
from pathlib import Path

from parity.errors import ParityInputError
from parity.harness.run_ids import run_ids, unique_suffix
from parity.report.artifacts import check_out_dir, write_run
from parity.report.writers import RUN_REPORT_WRITERS

REPORTS = Path("reports")
_MAX_TRIES = 16


def check_out(args) -> None:
    """Refuse, before any model loads, an --out the run could not be placed in."""
    if args.out is not None:
        check_out_dir(args.out, force=args.force)


def save_run(args, summary: dict, runs: dict, scenario_name: str, writers=RUN_REPORT_WRITERS) -> Path:
    """Write the run folder at --out, or at a fresh reports/<run-id>; return where it landed."""
    if args.out is None:
        ids = run_ids(summary["model"], scenario_name)
        candidates = [REPORTS / next(ids) for _ in range(_MAX_TRIES)]
        return write_run(candidates[0], summary, runs, writers, others=candidates[1:])
    out = Path(os.path.abspath(args.out))          # "." and "x/.." name a folder too
    beside = out.with_name(f"{out.name}-{unique_suffix()}")
    placed = write_run(out, summary, runs, writers, replace=args.force, others=[beside])
    if placed != out:
        raise ParityInputError(f"--out {args.out}: another run wrote there while this one ran; this run's "
                               f"artifacts are in {placed}")
    return Path(args.out)
