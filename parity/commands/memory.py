"""`parity run --plan`, `--verbose` and `--device-memory`: the memory plan and one line per run."""

from __future__ import annotations

import dataclasses

from parity.commands.common import EXIT_PASS, console, gibibytes
from parity.harness.plan import check_plan
from parity.harness.request_plan import plan_of
from parity.report.bench import concurrency_line
from parity.report.memory import render_plan, run_line


def add_memory_options(p) -> None:
    p.add_argument("--plan", action="store_true",
                   help="print the memory plan (component x mode) and exit, loading no weight: 0 when it fits, "
                        "2 when it does not")
    p.add_argument("--verbose", action="store_true",
                   help="one line per run: capture and run seconds, peak and leftover device memory")
    p.add_argument("--device-memory", type=gibibytes, default=None, metavar="GIB",
                   help="plan against a device with this much free memory instead of measuring it")


def with_memory(request, args):
    """The run request with the --device-memory the plan checks against."""
    return dataclasses.replace(request, device_memory=args.device_memory)


def show_plan(request) -> int:
    """Print the plan; a plan that does not fit is then one line on stderr and exit 2."""
    plan = plan_of(request)
    render_plan(plan.as_dict(), console())
    check_plan(plan)
    return EXIT_PASS


def print_run(run) -> None:
    """--verbose: a finished run's line."""
    print(run_line(run.mode, run.memory, run.timing), flush=True)


def print_session(summary: dict) -> None:
    """--verbose: load, analysis and bisection seconds after the runs."""
    timing = (summary.get("measured") or {}).get("timing") or {}
    spent = ", ".join(f"{k.removesuffix('_seconds')} {v:.2f} s" for k, v in timing.items()
                      if k.endswith("_seconds"))
    print(f"session: {spent}", flush=True)
    line = concurrency_line((summary.get("measured") or {}).get("concurrency"))
    if line:
        print(f"runs: {line}", flush=True)
