"""Isolation by fork: `fn(item)` in a child forked from a process that has imported everything already.

A fresh `python -m parity` pays 4-8 s of imports (torch, transformers) on a
small machine; a forked child starts in milliseconds with the parent's modules,
weights and caches, and still has its own pid, memory and exit status, so a
fault that poisons its process cannot poison the next. Results come back
pickled through a file per child. Not for a process that has initialised CUDA
(the driver does not survive a fork): callers ask `forkable()` and keep
subprocesses otherwise.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path


def forkable() -> bool:
    """True where a forked child may run torch: this process has not initialised CUDA."""
    import torch

    return not torch.cuda.is_initialized()


class ForkedError(RuntimeError):
    """A child raised (its traceback is the message) or died without a result."""


def fork_map(fn, items, jobs: int = 1, log_dir: Path | None = None, timeout: float | None = None,
             return_errors: bool = False, on_result=None) -> list:
    """[fn(item) for item in items], each call in a forked child, at most `jobs` children at once.

    The children's stdout and stderr go to `log_dir/<index>.log` (a temporary
    folder when None). A child still running after `timeout` seconds is killed.
    A child that raised or died gives a ForkedError with its traceback or exit
    status and its log's tail: in its item's place with `return_errors`, else the
    first one is raised once every child has ended. `on_result(item, result)` is
    called here, in this process, as each child's result comes back.
    """
    items = list(items)
    outcomes: dict[int, object] = {}
    with tempfile.TemporaryDirectory(prefix="parity-fork-") as tmp:
        logs = Path(log_dir) if log_dir is not None else Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        running: dict[int, tuple[int, float]] = {}   # pid -> (item index, deadline)
        pending = list(range(len(items)))
        # NOTE: frozen objects are skipped by every later collection, in the children too: a child's
        # gc.collect() then walks only what the child made (a full walk of torch and transformers costs
        # ~0.2 s a call), and the parent's pages stay shared.
        gc.collect()
        gc.freeze()
        try:
            while pending or running:
                while pending and len(running) < max(1, jobs):
                    index = pending.pop(0)
                    pid = _start(fn, items[index], Path(tmp) / f"{index}.pickle", logs / f"{index}.log")
                    running[pid] = (index, time.monotonic() + timeout if timeout else float("inf"))
                for pid, (index, deadline) in list(running.items()):
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if not done and time.monotonic() > deadline:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        outcomes[index] = ForkedError(f"{items[index]!r}: timed out after {timeout:g} s")
                    elif done:
                        outcomes[index] = _collect(items[index], Path(tmp) / f"{index}.pickle",
                                                   os.waitstatus_to_exitcode(status), logs / f"{index}.log")
                        if on_result is not None and not isinstance(outcomes[index], ForkedError):
                            on_result(items[index], outcomes[index])
                    else:
                        continue
                    del running[pid]
                time.sleep(0.005)
        finally:
            for pid in running:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            gc.unfreeze()
    results = [outcomes[i] for i in range(len(items))]
    failed = [r for r in results if isinstance(r, ForkedError)]
    if failed and not return_errors:
        raise failed[0]
    return results


class _Failure:
    def __init__(self, text: str):
        self.text = text


def _start(fn, item, result_path: Path, log_path: Path) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = sys.stderr = os.fdopen(os.dup(log), "w", buffering=1)
        try:
            value = fn(item)
        except BaseException:  # noqa: BLE001 - everything a child raises goes back to the parent
            value = _Failure(traceback.format_exc())
        with open(result_path, "wb") as out:
            pickle.dump(value, out)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        os._exit(code)


def _collect(item, result_path: Path, exit_code: int, log_path: Path):
    if exit_code == 0 and result_path.is_file():
        with open(result_path, "rb") as data:
            value = pickle.load(data)
        return ForkedError(f"{item!r}: {value.text}") if isinstance(value, _Failure) else value
    tail = log_path.read_text(errors="replace")[-2000:] if log_path.is_file() else ""
    how = f"killed by signal {-exit_code}" if exit_code < 0 else f"exited {exit_code}"
    return ForkedError(f"{item!r}: the child {how} without a result; its output ends: {tail}")
