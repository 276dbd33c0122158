"""`parity run --tp N`: N ranks (torch.multiprocessing), one run folder, the verdict of every rank.

On the CPU the ranks are forked processes talking gloo; on CUDA spawned ones,
one GPU each, talking NCCL. Each rank resolves the request from the same
arguments (so `--inject` reaches every rank), runs the session, writes its own
run folder and a status file; this process waits for them under the timeout,
kills a rank that never reports (stalled: RANK_DIVERGENCE), and places one
run folder: summary.json and the reports for the run, rank 0's records at the
top, every rank's whole folder under ranks/rank<r>/ (docs/tp.md).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp
from rich.console import Console

from parity.commands.common import run_request
from parity.commands.memory import show_plan, with_memory
from parity.commands.options import EXIT_DRIFT, EXIT_PASS
from parity.commands.outputs import check_out, save_run
from parity.diagnosis.panel import diagnosis_panel
from parity.errors import ParityInputError
from parity.harness.request import resolve_backend
from parity.harness.tp_session import TpLaunch, leave, run_rank, run_verdict
from parity.models import loader, tp
from parity.models.zoo import resolve_paths
from parity.report.artifacts import write_run
from parity.report.atomic import write_json
from parity.report.console import render
from parity.report.diagnosis import diagnoses_view
from parity.report.writers import RUN_REPORT_WRITERS, write_diagnosis

GRACE_S = 5.0      # after the first rank reports, how much longer than the timeout the others get


def check_single_process(args) -> None:
    """A tensor-parallel option given without --tp N is a mistake, not a no-op."""
    given = [flag for flag, value in (("--tp-timeout", args.tp_timeout), ("--tp-all-reduce", args.tp_all_reduce))
             if value is not None]
    if given:
        raise ParityInputError(f"{', '.join(given)} only applies to a tensor-parallel run: add --tp 2 (or more), "
                               f"or drop {' and '.join(given)}")


def main(args) -> int:
    """Launch the ranks, wait for them, place one run folder, render, exit 0 / 1."""
    args.tp_timeout = 120.0 if args.tp_timeout is None else args.tp_timeout
    args.tp_all_reduce = args.tp_all_reduce or "collective"
    request = with_memory(run_request(args), args)
    backend, device = resolve_backend(request.backend)
    _check_tp(args, device)
    if args.plan:
        return _rank_plan(request, args.tp)
    check_out(args)
    with tempfile.TemporaryDirectory(prefix="parity-tp-") as folder:
        launch = TpLaunch(args.tp, device.type == "cuda", Path(folder), args.tp_timeout, args.tp_all_reduce)
        statuses = run_ranks(args, launch)
        summaries = {r: json.loads((launch.folder / f"rank{r}" / "summary.json").read_text())
                     for r in statuses if (launch.folder / f"rank{r}" / "summary.json").is_file()}
        errors = [s for s in statuses.values() if s["status"] == "error"]
        # An error with every rank accounted for is a bug (exit 3); with a rank silent, that rank stalled.
        if errors and len(statuses) == args.tp and not any(s["status"] == "divergence" for s in statuses.values()):
            raise RuntimeError(f"rank {errors[0]['rank']}: {errors[0]['error']}\n{errors[0]['traceback']}")
        summary = run_verdict(args.tp, statuses, summaries)
        summary["faults"] = list(args.inject)
        out_dir = save_run(args, summary, {}, Path(args.scenario or "tp").stem,
                           writers=_writers(summary, launch.folder, args.tp))
    _render(summary)
    print(f"artifacts: {out_dir}")
    return EXIT_PASS if summary["verdict"] == "pass" else EXIT_DRIFT


def _rank_plan(request, world: int) -> int:
    """`--plan`: the memory plan of one rank (its slices of the target, the whole drafter), per device."""
    tp.activate(tp.TpContext(0, world, timedelta(seconds=1)), None)
    try:
        print(f"the memory plan of each of the {world} ranks (docs/tp.md):")
        return show_plan(request)
    finally:
        tp.deactivate()


def _check_tp(args, device) -> None:
    if device.type == "cuda" and torch.cuda.device_count() < args.tp:
        raise ParityInputError(f"--tp {args.tp}: this machine has {torch.cuda.device_count()} GPU(s); "
                               "one rank needs one GPU")
    target_dir, _ = resolve_paths(args.model, args.target_path, args.draft_path)
    tp.check_divisible(loader.read_config(target_dir, model_types=("llama",)), args.tp)


def run_ranks(args, launch: TpLaunch) -> dict[int, dict]:
    """Start every rank and wait: {rank: status} of those that reported; the silent ones are killed."""
    method = "spawn" if launch.cuda else "fork"
    context = mp.start_processes(_rank_main, args=(args, launch), nprocs=launch.world, join=False,
                                 start_method=method)
    statuses: dict[int, dict] = {}
    first_report = None
    while True:
        _read_statuses(launch, statuses)
        alive = [p for p in context.processes if p.is_alive()]
        if not alive or len(statuses) == launch.world:
            break
        # A rank that reported, or one that died without a word (a watchdog's abort): the rest get the timeout.
        if first_report is None and (statuses or len(alive) < launch.world):
            first_report = time.monotonic()
        if first_report is not None and time.monotonic() - first_report > launch.timeout_s + GRACE_S:
            break
        time.sleep(0.2)
    for p in context.processes:
        if p.is_alive():
            p.kill()
        p.join()
    _read_statuses(launch, statuses)      # what a rank wrote just before it ended
    return statuses


def _read_statuses(launch: TpLaunch, statuses: dict[int, dict]) -> None:
    for r in range(launch.world):
        file = launch.folder / f"rank{r}.json"
        if r not in statuses and file.is_file():
            statuses[r] = json.loads(file.read_text())


def _rank_main(rank: int, args, launch: TpLaunch) -> None:
    """One rank: the same request from the same arguments, its run folder, then its status file."""
    status, outcome = run_rank(rank, launch, with_memory(run_request(args), args))
    if outcome is not None:
        outcome.summary["faults"] = list(args.inject)
        write_run(launch.folder / f"rank{rank}", outcome.summary, outcome.runs, RUN_REPORT_WRITERS)
    write_json(launch.folder / f"rank{rank}.json.part", status)
    (launch.folder / f"rank{rank}.json.part").rename(launch.folder / f"rank{rank}.json")
    leave(launch)


def _writers(summary: dict, folder: Path, world: int):
    def ranks(staging: Path, _summary: dict) -> None:
        (staging / "ranks").mkdir()
        for r in range(world):
            if (folder / f"rank{r}").is_dir():
                shutil.move(str(folder / f"rank{r}"), str(staging / "ranks" / f"rank{r}"))
        zero = staging / "ranks" / "rank0"
        for name in ("records.parquet", "tokens.parquet", "forwards.parquet"):
            if (zero / name).is_file():
                shutil.copyfile(zero / name, staging / name)
    # A run stopped before any rank's verdict has no modes to report or plot: its diagnosis alone.
    return (ranks,) + (RUN_REPORT_WRITERS if "modes" in summary else (write_diagnosis,))


def _render(summary: dict) -> None:
    console = Console()
    if "modes" in summary:
        render(summary, diagnosis_panel=diagnoses_view(summary))
    elif summary.get("diagnosis"):
        console.print(diagnosis_panel(summary["diagnosis"]))
    for r, entry in summary["tp"]["ranks"].items():
        modes = ", ".join(f"{m} {v}" for m, v in entry.get("modes", {}).items())
        console.print(f"rank {r}: {entry['verdict'].upper()}" + (f" ({modes})" if modes else ""))
    console.print(f"TP={summary['tp']['world']}: {summary['verdict'].upper()}")
