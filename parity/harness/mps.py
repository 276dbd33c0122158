"""A concurrent session's processes share the GPU through a private MPS daemon.

Runs at once (`workers.py`) are processes, each with a CUDA context of its
own. Without MPS the GPU time-slices between contexts: one process's kernels
wait out the others' slices and the device idles at every switch. With every
process a client of one MPS server, their kernels share the device at once;
the kernels themselves do not change, so neither do the results. Measured on
an H100 (synthetic 8B EAGLE-3 pair, `llama3-eagle`, all five modes, 8 runs at
once): 107.4 s process wall (session 89.9 s) without, 68.2 s (session 52.6 s)
with, same verdicts and acceptance.

So `parity` (`__main__`), before any process of it touches CUDA, starts a
daemon of its own when a concurrent CUDA session is expected
(`warm.expected`, or `warm.bench_run`): pipe and log folders under the
temp folder, named to this process and its children only
(CUDA_MPS_PIPE_DIRECTORY), so no other program connects to it. It starts the server and waits until it is up; any failure
(a server that will not start: a GPU in exclusive or MIG mode, no rights)
quits the daemon and the run goes on without MPS. At exit the daemon is told
to quit (it ends once this process's context is gone) and its folders go.

Not started: `--no-mps` (or PARITY_MPS=0); no `nvidia-cuda-mps-control` on
the PATH; an MPS daemon the user already runs (CUDA_MPS_PIPE_DIRECTORY set,
or the system's at /tmp/nvidia-mps), which the processes then use as it is.
Standard library only: this runs before torch is imported.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import time

CONTROL = "nvidia-cuda-mps-control"
SYSTEM_PIPE = "/tmp/nvidia-mps"
READY_SECONDS = 10.0

_STATE: dict = {"mps": None}    # "private" (ours), "user" (theirs), or None; with ours: "folder", "env", "binary"


def skipped(argv: list[str], environ=os.environ) -> str | None:
    """Why this process will not start a daemon of its own (None: it will)."""
    if "--no-mps" in argv or environ.get("PARITY_MPS", "1") == "0":
        return "off (--no-mps)"
    if environ.get("CUDA_MPS_PIPE_DIRECTORY") or os.path.exists(os.path.join(SYSTEM_PIPE, "control")):
        return "user"
    if shutil.which(CONTROL) is None:
        return f"off (no {CONTROL})"
    return None


def start(argv: list[str]) -> str | None:
    """Start the private daemon and its server (see the module's text); what the session then uses."""
    reason = skipped(argv)
    if reason is not None:
        _STATE["mps"] = "user" if reason == "user" else None
        return _STATE["mps"]
    folder = tempfile.mkdtemp(prefix="parity-mps-")
    env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(folder, "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": os.path.join(folder, "log")}
    for path in env.values():
        os.mkdir(path)
    binary = shutil.which(CONTROL)
    _STATE.update(folder=folder, env=env, binary=binary)
    try:
        subprocess.run([binary, "-d"], env={**os.environ, **env}, check=True, timeout=10, capture_output=True)
        _command(f"start_server -uid {os.getuid()}")
        deadline = time.monotonic() + READY_SECONDS
        while not _command("get_server_list").strip():
            if time.monotonic() > deadline:
                raise TimeoutError("the MPS server did not start")
            time.sleep(0.05)
    except (OSError, subprocess.SubprocessError, TimeoutError):
        stop(wait=True)
        return None
    os.environ.update(env)
    _STATE["mps"] = "private"
    atexit.register(stop)
    return "private"


def used() -> str | None:
    """How this process and its workers share the GPU: "private" (our daemon), "user" (theirs) or None."""
    return _STATE["mps"]


def stop(wait: bool = False) -> None:
    """Tell the private daemon to quit and remove its folders; nothing when none was started. The daemon ends
    once its clients have (this process among them), so without `wait` a detached shell removes the folders a
    few seconds after this process has gone."""
    folder, binary = _STATE.pop("folder", None), _STATE.pop("binary", None)
    env = _STATE.pop("env", None)
    _STATE["mps"] = None
    if folder is None:
        return
    if wait:
        try:
            _command("quit", binary, env)
        except (OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(folder, ignore_errors=True)
        return
    script = 'echo quit | "$1"; sleep 5; rm -rf "$2"'
    subprocess.Popen(["sh", "-c", script, "sh", binary, folder], env={**os.environ, **env}, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _command(text: str, binary: str | None = None, env: dict | None = None) -> str:
    env = env or _STATE["env"]
    done = subprocess.run([binary or _STATE["binary"]], input=text + "\n", env={**os.environ, **env}, check=True,
                          timeout=10, capture_output=True, text=True)
    return done.stdout
