"""SIGKILL at random moments and eight runs at once: no partial run folder, no torn baseline, no lost run.

A SIGKILL cannot be caught, so what it may leave is decided by the write
order alone: a hidden staging folder (`.<name>.parity-staging-*`) or a hidden
temp file (`.<name>.*.tmp`), never a visible half-written folder or a
truncated baseline. `parity report` refuses the staging folder and the next
run removes it once it is older than an hour. Kills land at seeded random
delays over a whole run, plus once exactly in the middle of the writes that
matter (a forked child SIGKILLs itself there), so the test does not depend
on luck to hit them.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pandas as pd

import parity.harness.run_ids as run_ids
from parity.analysis.baseline import load_baseline
from parity.report.artifacts import is_staging
from robustkit import call, complete_run, fork_main, hidden, log, one_line, run_args, tiny_scenario, visible, wait

SEED = 20260102
KILLS = 4


def _age(paths, seconds: float = 7200) -> None:
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def _kill_self_on_call(target, attribute: str, nth: int, half: bool = False):
    """In the child: SIGKILL itself during the nth call of target.attribute (after writing half, for json.dump)."""
    def before():
        original, calls = getattr(target, attribute), []

        def dying(*args, **kwargs):
            calls.append(1)
            if len(calls) == nth:
                if half:                      # json.dump(data, handle, ...): half the text reaches the file
                    text = json.dumps(args[0], indent=2)
                    args[1].write(text[: len(text) // 2])
                    args[1].flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        setattr(target, attribute, dying)
    return before


def _no_partial_run(reports: Path) -> None:
    for folder in visible(reports):
        assert complete_run(folder), f"{folder} is visible but incomplete"
    for leftover in hidden(reports):
        assert is_staging(leftover), f"unexpected hidden entry {leftover}"


def _timed_run(argv, cwd: Path, logs: Path) -> float:
    start = time.monotonic()
    pid = fork_main(argv, cwd, logs)
    assert wait(pid) == 0, log(logs, pid)
    return time.monotonic() - start


def test_sigkill_of_parity_run_never_leaves_a_partial_folder(tmp_path):
    rnd, logs, reports = random.Random(SEED), tmp_path / "logs", tmp_path / "reports"
    argv = run_args(tiny_scenario(tmp_path), modes="eager,full")
    duration = _timed_run(argv, tmp_path, logs)
    for _ in range(KILLS):
        pid = fork_main(argv, tmp_path, logs)
        time.sleep(rnd.uniform(0.2, 1.1) * duration)
        os.kill(pid, signal.SIGKILL)
        wait(pid)
        _no_partial_run(reports)

    pid = fork_main(argv, tmp_path, logs, before=_kill_self_on_call(pd.DataFrame, "to_parquet", 2))
    assert wait(pid) == -signal.SIGKILL
    _no_partial_run(reports)
    leftovers = hidden(reports)
    assert leftovers, "the writer was killed half way: its staging folder stays, hidden"
    code, _, err = call(["report", str(leftovers[0])])
    assert code == 2 and one_line(err) and "unfinished" in err, err

    _age(leftovers)
    runs_before = len(visible(reports))
    code, _, err = call(run_args(tiny_scenario(tmp_path)), cwd=tmp_path)
    assert code == 0, err
    assert hidden(reports) == [] and len(visible(reports)) == runs_before + 1
    _no_partial_run(reports)


def test_sigkill_of_gate_update_baseline_leaves_the_old_baseline_or_the_new_one(tmp_path):
    rnd, logs = random.Random(SEED + 1), tmp_path / "logs"
    scenario, baseline = tiny_scenario(tmp_path), tmp_path / "baselines" / "tiny.json"
    baseline.parent.mkdir()

    def gate(seed: int, out: str) -> list[str]:
        return ["gate", "--scenario", str(scenario), "--backend", "emulated", "--modes", "eager,full", "--seed",
                str(seed), "--update-baseline", "--baseline", str(baseline), "--out", str(tmp_path / "runs" / out)]

    duration = _timed_run(gate(0, "first"), tmp_path, logs)
    old = baseline.read_bytes()
    for i in range(KILLS):
        pid = fork_main(gate(1, f"killed-{i}"), tmp_path, logs)
        time.sleep(rnd.uniform(0.2, 1.1) * duration)
        os.kill(pid, signal.SIGKILL)
        wait(pid)
        load_baseline(baseline)
        _no_partial_run(tmp_path / "runs")
        assert baseline.read_bytes() == old or json.loads(baseline.read_text())["seed"] == 1

    pid = fork_main(gate(1, "torn"), tmp_path, logs, before=_kill_self_on_call(json, "dump", 1, half=True))
    assert wait(pid) == -signal.SIGKILL
    if json.loads(baseline.read_text())["seed"] == 0:
        assert baseline.read_bytes() == old, "killed while writing: the old baseline, whole"
    torn = [p for p in hidden(baseline.parent) if re.fullmatch(r"\.tiny\.json\..*\.tmp", p.name)]
    assert torn, "the half-written temp file stays hidden beside the baseline"

    _age(torn)
    assert _timed_run(gate(1, "last"), tmp_path, logs) > 0
    assert load_baseline(baseline)["seed"] == 1 and hidden(baseline.parent) == []
    _no_partial_run(tmp_path / "runs")


def test_eight_runs_started_at_once_get_eight_complete_folders(tmp_path):
    """Same second (the clock is frozen in every child), same reports/ folder: eight distinct, complete runs."""
    class FrozenClock:
        class datetime:
            @staticmethod
            def now(tz=None):
                import datetime
                return datetime.datetime(2026, 1, 2, 3, 4, 5)

    def freeze():
        run_ids._dt = FrozenClock

    logs, argv = tmp_path / "logs", run_args(tiny_scenario(tmp_path))
    pids = [fork_main(argv, tmp_path, logs, before=freeze) for _ in range(8)]
    codes = [wait(pid) for pid in pids]
    assert codes == [0] * 8, [log(logs, pid) for pid in pids]
    printed = {log(logs, pid, "out").strip().splitlines()[-1] for pid in pids}
    folders = visible(tmp_path / "reports")
    assert len(printed) == 8 and len(folders) == 8, (printed, folders)
    assert all(complete_run(f) and f.name.startswith("20260102-030405-") for f in folders)
    assert {f"artifacts: reports/{f.name}" for f in folders} == printed
    assert hidden(tmp_path / "reports") == []


def test_two_runs_racing_for_one_out_folder_lose_nothing(tmp_path):
    """One lands at --out; the other finds it taken (before or after its run) and says so, keeping its run."""
    logs, out = tmp_path / "logs", tmp_path / "shared-out"
    argv = run_args(tiny_scenario(tmp_path), "--out", str(out))
    pids = [fork_main(argv, tmp_path, logs) for _ in range(2)]
    codes = sorted(wait(pid) for pid in pids)
    errors = [log(logs, pid) for pid in pids]
    assert codes == [0, 2], errors
    assert complete_run(out)
    message = next(e for e in errors if e)
    assert one_line(message), message
    moved = re.search(r"artifacts are in (\S+)$", message.strip())
    if moved:
        assert complete_run(Path(moved.group(1))), "the run that lost the race is kept beside --out"
    else:
        assert "already holds a run" in message
    assert hidden(tmp_path) == []
