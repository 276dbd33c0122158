"""`parity run`: run a scenario in every mode, compare with eager, render, save the run folder."""

from __future__ import annotations

import dataclasses

from parity.commands.common import run_request
from parity.commands.memory import (add_memory_options, print_process, print_run, print_session, process_age, show_plan,
                                    with_memory)
from parity.commands import tp
from parity.commands.options import EXIT_DRIFT, EXIT_PASS, add_common, add_force, count
from parity.commands.outputs import check_out, save_run
from parity.harness.session import run_session
from parity.report.console import render
from parity.report.diagnosis import diagnoses_view
from parity.report.progress import mode_progress


def register(sub) -> None:
    run = sub.add_parser("run", help="run a scenario in every mode and compare with eager")
    add_common(run)
    add_force(run)
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument("--no-bisect", action="store_true", help="do not diagnose drifting modes")
    run.add_argument("--check-unpadded", action="store_true",
                     help="also run eager one request at a time (no batching, no padding) and say whether eager "
                          "itself agrees with it: a bug every mode shares is the engine's, not the graphs'")
    run.add_argument("--jobs", type=count, default=None, metavar="N",
                     help="runs at once, in worker processes sharing the weights (1: one after another; default: "
                          "concurrent on CUDA as far as the memory plan fits, sequential on the CPU)")
    run.add_argument("--no-mps", action="store_true",
                     help="concurrent runs on CUDA without a private MPS daemon (default: one is started when "
                          "nvidia-cuda-mps-control is on the PATH and no MPS daemon runs, so the runs' kernels share "
                          "the GPU instead of time-slicing it; docs/memory.md)")
    add_memory_options(run)
    tp.add_tp_options(run)
    run.set_defaults(handler=main)


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
