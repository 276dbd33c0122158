"""The private MPS daemon of a concurrent session (`harness/mps.py`), against a stand-in control binary.

The stand-in is a shell script named nvidia-cuda-mps-control on the PATH: it
logs each call (its arguments, or the command it reads) and answers
`get_server_list` with a server's PID once `start_server` came, or never
(`FAIL_SERVER`). The real daemon is exercised on the GPU (test_gpu_mps.py).
"""

from __future__ import annotations

import os
import time

import pytest

from parity.harness import mps

STANDIN = """#!/bin/sh
log="$PARITY_TEST_MPS_LOG"
if [ "$1" = "-d" ]; then echo "daemon $CUDA_MPS_PIPE_DIRECTORY" >> "$log"; exit 0; fi
read line
echo "$line" >> "$log"
case "$line" in
  start_server*) [ -z "$FAIL_SERVER" ] && touch "$CUDA_MPS_PIPE_DIRECTORY/up" ;;
  get_server_list) [ -e "$CUDA_MPS_PIPE_DIRECTORY/up" ] && echo 4242 ;;
esac
exit 0
"""


@pytest.fixture
def control(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / mps.CONTROL
    script.write_text(STANDIN)
    script.chmod(0o755)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PARITY_TEST_MPS_LOG", str(log))
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "PARITY_MPS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(mps, "SYSTEM_PIPE", str(tmp_path / "no-system-daemon"))
    monkeypatch.setattr(mps.atexit, "register", lambda fn: None)
    monkeypatch.setattr(mps.tempfile, "tempdir", str(tmp_path))         # the daemon's folders: here
    yield log
    mps.stop(wait=True)


def calls(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_private_daemon_names_its_pipe_to_this_process_and_is_quit_with_its_folders_removed(control):
    assert mps.start(["run"]) == "private" and mps.used() == "private"
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    folder = os.path.dirname(pipe)
    assert os.path.dirname(folder) == str(control.parent) and os.path.basename(folder).startswith("parity-mps-")
    assert os.path.isdir(os.environ["CUDA_MPS_LOG_DIRECTORY"])
    assert calls(control)[:2] == [f"daemon {pipe}", f"start_server -uid {os.getuid()}"]
    assert "get_server_list" in calls(control)
    mps.stop(wait=True)
    assert calls(control)[-1] == "quit" and not os.path.exists(folder) and mps.used() is None


def test_a_server_that_never_comes_up_leaves_the_run_without_mps(control, monkeypatch):
    monkeypatch.setenv("FAIL_SERVER", "1")
    monkeypatch.setattr(mps, "READY_SECONDS", 0.3)
    assert mps.start(["run"]) is None and mps.used() is None
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ                       # children do not look for it
    assert calls(control)[-1] == "quit"
    assert not [p for p in os.listdir(control.parent) if p.startswith("parity-mps-")]     # its folders removed


def test_stop_without_waiting_quits_from_a_detached_shell(control):
    assert mps.start(["run"]) == "private"
    folder = os.path.dirname(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
    mps.stop()
    deadline = time.monotonic() + 5
    while calls(control)[-1] != "quit" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert calls(control)[-1] == "quit" and os.path.isdir(folder)      # removed a few seconds later, by the shell


def test_no_daemon_when_asked_not_to_when_one_runs_or_without_the_binary(control, monkeypatch, tmp_path):
    assert mps.skipped(["run", "--no-mps"]) == "off (--no-mps)"
    assert mps.skipped(["run"], {"PARITY_MPS": "0"}) == "off (--no-mps)"
    assert mps.skipped(["run"], {"CUDA_MPS_PIPE_DIRECTORY": "/somewhere"}) == "user"
    (tmp_path / "no-system-daemon").mkdir()
    (tmp_path / "no-system-daemon" / "control").touch()
    assert mps.skipped(["run"], {}) == "user" and mps.start(["run"]) == "user"
    assert calls(control) == []                                            # the user's daemon, used as it is
    monkeypatch.setattr(mps, "SYSTEM_PIPE", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert mps.skipped(["run"], {}) == f"off (no {mps.CONTROL})" and mps.start(["run"]) is None
