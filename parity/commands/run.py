"""`parity run`: run a scenario in every mode, compare with eager, render, save the run folder."""

from __future__ import annotations

from pathlib import Path

from parity.commands.common import EXIT_DRIFT, EXIT_PASS, add_common, run_request
from parity.commands.memory import add_memory_options, print_run, print_session, show_plan, with_memory
from parity.harness.run_ids import default_run_id
from parity.harness.session import run_session
from parity.report.artifacts import write_run
from parity.report.console import render
from parity.report.diagnosis import diagnoses_view
from parity.report.progress import mode_progress
from parity.report.writers import RUN_REPORT_WRITERS


def register(sub) -> None:
    run = sub.add_parser("run", help="run a scenario in every mode and compare with eager")
    add_common(run)
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument("--no-bisect", action="store_true", help="do not diagnose drifting modes")
    add_memory_options(run)
    run.set_defaults(handler=main)


def main(args) -> int:
    """Run the scenario in each mode, compare with eager, render and save the report."""
    request = with_memory(run_request(args), args)
    if args.plan:
        return show_plan(request)
    with mode_progress(not args.quiet) as progress:
        outcome = run_session(request, progress, on_run=print_run if args.verbose else None)
    summary = outcome.summary
    if args.verbose:
        print_session(summary)
    summary["faults"] = list(args.inject)
    out_dir = Path(args.out) if args.out else Path("reports") / default_run_id(summary["model"],
                                                                            outcome.scenario.name)
    write_run(out_dir, summary, outcome.runs, extra_writers=RUN_REPORT_WRITERS)
    render(summary, diagnosis_panel=diagnoses_view(summary))
    print(f"artifacts: {out_dir}")
    return EXIT_DRIFT if summary["verdict"] == "drift" else EXIT_PASS
