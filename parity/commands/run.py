"""`parity run`: run a scenario in every mode, compare with eager, render, save the run folder."""

from __future__ import annotations

import dataclasses

from parity.commands.common import run_request
from parity.commands.memory import print_process, print_run, print_session, process_age, show_plan, with_memory
from parity.commands import tp
from parity.commands.options import EXIT_DRIFT, EXIT_PASS
from parity.commands.outputs import check_out, save_run
from parity.harness.session import run_session
from parity.report.console import render
from parity.report.diagnosis import diagnoses_view
from parity.report.progress import mode_progress


def main(args) -> int:
    """Run the scenario in each mode, compare with eager, render and save the report."""
    if args.tp != 1:
        return tp.main(args)
    tp.check_single_process(args)
    request = dataclasses.replace(with_memory(run_request(args), args), jobs=args.jobs)
    if args.plan:
        return show_plan(request)
    check_out(args)
    began = process_age()
    with mode_progress(not args.quiet) as progress:
        outcome = run_session(request, progress, on_run=print_run if args.verbose else None)
    ended = process_age()
    summary = outcome.summary
    if args.verbose:
        print_session(summary)
    summary["faults"] = list(args.inject)
    out_dir = save_run(args, summary, outcome.runs, outcome.scenario.name)
    render(summary, diagnosis_panel=diagnoses_view(summary))
    print(f"artifacts: {out_dir}")
    if args.verbose:
        print_process(began, ended)
    return EXIT_PASS if summary["verdict"] == "pass" else EXIT_DRIFT
