"""Worker interpreters started with the process, so their imports overlap the parent's own.

A worker (`workers.py`) is a spawned interpreter that must import torch,
transformers and the harness before it can take a run: 12-13 s on an H100
host, as long as the parent's own imports. Spawned when the session's pool
opens (after the parent's imports and its memory plan), the runs waited for
both, one after the other. So `parity run`, before it imports anything heavy,
starts the workers a concurrent session is likely to want (`expected`):
they import while the parent imports and loads the weights, and the pool
takes them (`take`) instead of spawning its own. What the pool does not take
is let go (`release`): each ends when its pipe closes, having run nothing.

The guess reads the command line with the standard library and the zoo's
path resolution only (this module must stay free of heavy imports). A wrong guess costs nothing but the start of
idle interpreters on spare cores: a warm worker is the same process the pool
would spawn, and the pool spawns any it lacks.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

AUTO_MAX = 8                 # concurrency.AUTO_MAX: the default session's widest
AUTO_MIN_BYTES = 1 << 30     # concurrency.AUTO_MIN_WEIGHTS: smaller pairs run one after another by default

_WARM: list = []             # (process, parent's end of its pipe), oldest first


def expected(argv: list[str]) -> int:
    """How many workers `parity <argv>` will likely run at once: 0 unless it is a single-process `parity run`
    on a GPU with --jobs N (N > 1), or, without --jobs, whose target (a zoo model's or `--model local`'s
    --target-path) holds 1 GiB or more of safetensors."""
    if not argv or argv[0] != "run" or not _has_gpu():
        return 0
    options = _options(argv[1:])
    if any(flag in options for flag in ("-h", "--help", "--plan")) or options.get("--tp", "1") != "1":
        return 0
    if options.get("--backend", "cuda") != "cuda":
        return 0
    jobs = options.get("--jobs")
    if jobs is not None:
        return int(jobs) if jobs.isdigit() and int(jobs) > 1 else 0
    target = _target_folder(options)
    if target is None or _weight_bytes(target) < AUTO_MIN_BYTES:
        return 0
    return min(AUTO_MAX, _cpus())


def bench_run(argv: list[str]) -> bool:
    """Whether `parity <argv>` is a `parity bench scale` that runs a whole session on a GPU (concurrent by
    default, as `parity run`'s; its workers are spawned when its pool opens)."""
    if argv[:2] != ["bench", "scale"] or not _has_gpu():
        return False
    options = _options(argv[2:])
    return not any(flag in options for flag in ("-h", "--help", "--skip-run", "--run-summary")) and \
        options.get("--jobs", "2") != "1"


def _target_folder(options: dict) -> Path | None:
    """The target's folder as `parity run` will find it (the zoo: paths, environment, the local HF cache)."""
    from parity.models.zoo import DEFAULT_MODEL, resolve_paths   # the standard library only

    try:
        target, _ = resolve_paths(options.get("--model") or DEFAULT_MODEL, options.get("--target-path"),
                                  options.get("--draft-path"))
    except Exception:  # noqa: BLE001 - a command line the run will refuse itself: no guess
        return None
    return Path(target)


def start(count: int) -> None:
    """Spawn `count` workers now; each imports the harness, then waits for its run context."""
    mp = multiprocessing.get_context("spawn")
    for index in range(count):
        parent, child = mp.Pipe()
        process = mp.Process(target=_serve, args=(child,), name=f"parity-worker-{index}", daemon=True)
        process.start()
        child.close()
        _WARM.append((process, parent))


def take():
    """A started worker (process, pipe), or None when none is left."""
    return _WARM.pop(0) if _WARM else None


def release() -> None:
    """Let every worker not taken go: its pipe closes, it ends without running anything."""
    while _WARM:
        process, conn = _WARM.pop()
        conn.close()
        process.join(0)


def _serve(conn) -> None:
    from parity.harness.workers import serve

    serve(conn)


def _options(args: list[str]) -> dict[str, str | None]:
    options: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            name, _, value = arg.partition("=")
            options[name] = value or (args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else None)
    return options


def _has_gpu() -> bool:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible not in ("", "-1") and os.path.exists("/dev/nvidiactl")


def _weight_bytes(folder: Path) -> int:
    try:
        return sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    except OSError:
        return 0


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
