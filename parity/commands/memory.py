"""`parity run --plan`, `--verbose` and `--device-memory`: the memory plan and one line per run."""

from __future__ import annotations

import dataclasses
import os

from parity.commands.common import console
from parity.commands.options import EXIT_PASS
from parity.harness.plan import check_plan
from parity.harness.request_plan import plan_of
from parity.report.bench import concurrency_line
from parity.report.memory import render_plan, run_line


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


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc), interpreter start-up and imports included; else None."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            return float(uptime.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


def print_process(session_began: float | None, session_ended: float | None) -> None:
    """--verbose, last: where the process's time went around the session (ages from `process_age`): before it
    (start-up, imports), in it, and after it (saving and rendering the report). What the process spends
    exiting (closing workers, freeing the device) comes after this line."""
    now = process_age()
    if None in (now, session_began, session_ended):
        return
    print(f"process: {session_began:.2f} s before the session (start-up, imports), session "
          f"{session_ended - session_began:.2f} s, report {now - session_ended:.2f} s; {now:.2f} s so far",
          flush=True)
