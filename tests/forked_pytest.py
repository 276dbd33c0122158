"""`pytest.main(args)` in a child forked from this worker: a suite run as its user would, isolated by fork.

The child has torch, the engine and the audit loaded already (no new interpreter), and whatever its pytest run
keeps alive dies with it: a nested run in this process kept its items, their stashed audit sessions and the
audits' watcher alive for the rest of the worker. Its pytest imports in importlib mode, so a conftest of the
suite cannot collide with this suite's `conftest` module.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import pytest

from robustkit import wait


def pytest_in_fork(args: list[str], log: Path, cwd: Path | None = None, env: dict | None = None,
                   timeout: float = 600.0) -> tuple[int, str]:
    """(exit code, what it printed) of `pytest <args>` run in a forked child (cwd `cwd`, `env` set)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            if cwd is not None:
                os.chdir(cwd)
            os.environ.update(env or {})
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(out, 2)
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
            code = int(pytest.main(["--import-mode=importlib", "-p", "no:cacheprovider", "-o", "addopts=", *args]))
        except BaseException:    # noqa: BLE001 - the log is all the parent sees of the child
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(code)
    return wait(pid, timeout=timeout), log.read_text()
