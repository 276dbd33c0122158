"""Helpers of the robustness tests: tiny scenarios, in-process CLI calls, forked `parity` processes, folder checks.

Forked processes: the tests that signal, kill or race `parity run` need real
processes, but a fresh `python -m parity` pays ~8 s of imports (torch,
transformers) on a 2-core machine. A child forked from the test process,
which has imported everything already (every command's module too, here:
`parity.cli` imports one only when its command runs), runs the very same
`parity.cli.main` in a real process of its own (own pid, own signal
handlers, own exit status) in well under a second. Torch runs
single-threaded here (conftest.py), so forking after it was used is safe.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

from parity.cli import main
from parity.commands import bench, bisect, faults, gate, imports, models, report, run, scenarios

COMMAND_MODULES = (bench, bisect, faults, gate, imports, models, report, run, scenarios)    # for the forks
ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "scenarios" / "prompts" / "default.jsonl"
RUN_FILES = {"summary.json", "records.parquet", "tokens.parquet", "forwards.parquet", "report.md", "acceptance.png"}
TINY = {"name": "tiny", "prompts": str(PROMPTS), "num_requests": 1, "arrivals": [0], "max_tokens": 4,
        "max_num_seqs": 1, "max_num_batched_tokens": 32, "max_model_len": 64, "capture_sizes": [4, 32],
        "modes": ["eager", "full"], "seed": 0}


def tiny_scenario(folder: Path, name: str = "tiny.yaml", **overrides) -> Path:
    """A scenario that runs in well under a second a mode: one request of 4 tokens, small engine limits."""
    path = Path(folder) / name
    path.write_text(yaml.safe_dump({**TINY, **overrides}, sort_keys=False))
    return path


def run_args(scenario: Path, *extra: str, modes: str = "eager") -> list[str]:
    return ["run", "--scenario", str(scenario), "--backend", "emulated", "--quiet", "--no-bisect", "--modes", modes,
            *extra]


def call(argv: list[str], cwd: Path | None = None) -> tuple[int, str, str]:
    """`parity <argv>` in this process: (exit code, stdout, stderr); an escaping exception fails the test."""
    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        os.chdir(previous)
    return code, out.getvalue(), err.getvalue()


def one_line(err: str) -> bool:
    """stderr holds exactly one line and no traceback."""
    return err.count("\n") == 1 and "Traceback" not in err


def visible(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if not p.name.startswith(".")) if Path(folder).exists() else []


def hidden(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if p.name.startswith(".")) if Path(folder).exists() else []


def complete_run(folder: Path) -> bool:
    """Every artifact of a run is there and summary.json parses."""
    names = {p.name for p in Path(folder).iterdir()}
    if not RUN_FILES <= names:
        return False
    return isinstance(json.loads((Path(folder) / "summary.json").read_text()), dict)


# --- forked processes -------------------------------------------------------------------------------

def fork_main(argv: list[str], cwd: Path, logs: Path, before=None, encoding: str | None = None) -> int:
    """Run `parity <argv>` in a forked child (cwd `cwd`, output in logs/<pid>.out|err); its pid.

    `before()` runs in the child first (to patch something in that process only); `encoding` is its
    stdout's (PYTHONIOENCODING's effect), UTF-8 when None.
    """
    logs.mkdir(parents=True, exist_ok=True)
    pid = os.fork()
    if pid:
        return pid
    code = 99
    try:
        os.chdir(cwd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with open(logs / f"{os.getpid()}.out", "w", encoding=encoding or "utf-8") as out, \
                open(logs / f"{os.getpid()}.err", "w") as err:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    if before is not None:
                        before()
                    code = main(argv)
                except BaseException:   # noqa: BLE001 - an escaping exception is what the tests look for
                    traceback.print_exc()
                    code = 98
                out.flush()
                err.flush()
    finally:
        os._exit(code)


TERMINAL_VARIABLES = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def forked_cli(argv: list[str], cwd: Path = ROOT, encoding: str | None = None, **env: str) -> tuple[int, str, str]:
    """`parity <argv>` as a process of its own with its output on pipes-like files: (exit code, stdout, stderr).

    The child starts from a terminal-neutral environment (80 columns, no colour
    variables) updated with `env`, as `COLUMNS=80 python -m parity ...` would;
    `encoding` is its stdout's, as PYTHONIOENCODING sets it.
    """
    logs = Path(tempfile.mkdtemp(prefix="parity-cli-"))

    def environment():
        for name in TERMINAL_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update({"COLUMNS": "80", **env})

    try:
        pid = fork_main(argv, cwd, logs, before=environment, encoding=encoding)
        code = wait(pid)
        out = (logs / f"{pid}.out").read_text(encoding=encoding or "utf-8") if (logs / f"{pid}.out").exists() else ""
        return code, out, log(logs, pid, "err")
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def fork_with_stdout_pipe(argv: list[str], cwd: Path, lines_to_read: int) -> tuple[int, list[str]]:
    """`parity <argv>` in a forked child whose stdout is a pipe: this process reads `lines_to_read` lines (0:
    none) and closes its end, as `| head -N` does. (exit code, the lines read)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.close(read_end)
            os.chdir(cwd)
            os.dup2(write_end, 1)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(os.devnull, "w")
            code = main(argv)
        finally:
            os._exit(code)
    os.close(write_end)
    lines = []
    with os.fdopen(read_end) as reader:
        for _ in range(lines_to_read):
            lines.append(reader.readline())
    return wait(pid), lines


def wait(pid: int, timeout: float = 120.0) -> int:
    """The child's exit code, or -signal when a signal ended it."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"child {pid} ran past {timeout} s")
        time.sleep(0.005)


def catches(pid: int, sig: int) -> bool:
    """True once process `pid` has a handler of its own for `sig` (Linux: SigCgt in /proc/<pid>/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(mask >> (sig - 1) & 1)


def log(logs: Path, pid: int, stream: str = "err") -> str:
    path = logs / f"{pid}.{stream}"
    return path.read_text() if path.exists() else ""
